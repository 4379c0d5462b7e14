"""``sparsefinder configure``: a teacher + projections + fitted state → a model folder that reloads whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import MarianMTModel

from pipeline.attention import load_model
from pipeline.attention.sparsefinder import SPARSEFINDER, sparsefinder_heads
from pipeline.checkpoint import read_manifest, save_checkpoint
from pipeline.cli import main
from pipeline.graphs.extract import teacher_fingerprint
from pipeline.predictors import HeadInputs, IndexerPredictor, KMeansPredictor
from pipeline.predictors.state import load_state, save_states
from pipeline.projection.model import HeadProjections, load_projections, save_projections
from tests.stage_runner import run_module
from tests.tiny import tiny_marian, word_tokenizer

VOCAB, HEADS, HEAD_DIM, LAYERS = 30, 2, 8, 2


def save_teacher(folder: Path, seed: int = 0) -> MarianMTModel:
    """A tiny α-entmax Marian checkpoint folder (with its manifest) with a word-level tokenizer."""
    model = tiny_marian(
        vocab=VOCAB,
        d_model=HEADS * HEAD_DIM,
        encoder_layers=1,
        decoder_layers=LAYERS,
        encoder_heads=HEADS,
        decoder_heads=HEADS,
        seed=seed,
    )
    save_checkpoint(folder, model, word_tokenizer(VOCAB), {"stage": "teacher"})
    return model


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict[str, Path]:
    """A teacher folder, its decoder self-attention projections, k-means state for B ∈ {1, 4} and a rank-2
    τ-indexer; and a state file fitted for a teacher with one head more."""
    root = tmp_path_factory.mktemp("configure")
    teacher = save_teacher(root / "teacher")
    fingerprint = teacher_fingerprint(teacher, root / "teacher")
    generator = torch.Generator().manual_seed(1)
    layers = {layer: HeadProjections(HEADS, HEAD_DIM, generator=generator) for layer in range(LAYERS)}
    save_projections(
        root / "projections.safetensors", layers, {"kind": "decoder_self", "graphs": fingerprint}
    )
    predictors = [KMeansPredictor(buckets=b, iterations=5, backend="sklearn") for b in (1, 4)]
    predictors.append(IndexerPredictor(rank=2))
    wide = IndexerPredictor(rank=2)
    for layer, module in layers.items():
        q = torch.randn(3, HEADS, 10, HEAD_DIM, generator=generator)
        valid = torch.ones(3, 10, dtype=torch.bool)
        batch = HeadInputs(q, q, valid, valid, True, *module(q, q))
        for predictor in predictors:
            predictor.fit(layer, [batch], seed=0)
        wide.fit(layer, [HeadInputs(q.repeat(1, 2, 1, 1), q.repeat(1, 2, 1, 1), valid, valid, True)], seed=0)
    extra = {"graphs": fingerprint, "kind": "decoder_self"}
    save_states(root / "state.safetensors", predictors, extra)
    save_states(root / "four_heads.safetensors", [wide], extra)
    return {
        "root": root,
        "teacher": root / "teacher",
        "projections": root / "projections.safetensors",
        "state": root / "state.safetensors",
        "four_heads": root / "four_heads.safetensors",
    }


def configure(fitted, out: Path, *extra: str) -> list[str]:
    return [
        "configure", str(fitted["teacher"]), str(out), "--projections", str(fitted["projections"]),
        "--centroids", str(fitted["state"]), *extra,
    ]  # fmt: skip


def logits(model, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    labels = torch.randint(3, VOCAB, (2, 9), generator=g)
    with torch.no_grad():
        return model(input_ids=input_ids, decoder_input_ids=labels).logits


def test_configured_folder_reloads_whole_and_records_the_predictor(fitted, tmp_path):
    out = tmp_path / "kmeans4"
    # the stored state's other fit knobs (iterations, backend) are found from buckets alone
    assert main(configure(fitted, out, "--method", "kmeans", "--knob", "buckets=4", "--window", "3")) == 0
    manifest = read_manifest(out)
    assert manifest["attn_implementation"] == SPARSEFINDER
    spec = manifest[SPARSEFINDER]
    assert (spec["kind"], spec["predictor"], spec["window"]) == ("decoder_self", "kmeans", 3)
    assert spec["knobs"]["buckets"] == 4 and spec["state_shapes"] == {"centroids": [HEADS, 4, 4]}

    model = load_model(out, attn_implementation=SPARSEFINDER)
    heads = sparsefinder_heads(model)
    assert [h.layer for h in heads] == list(range(LAYERS)) and heads[0].window == 3
    stored = KMeansPredictor(buckets=4, iterations=5, backend="sklearn")
    load_state(fitted["state"], stored)
    for head in heads:
        assert torch.equal(head.state_centroids, stored.layer_state(head.layer)["centroids"])
    teacher = load_model(fitted["teacher"])
    assert not torch.allclose(logits(model), logits(teacher), atol=1e-4)  # B = 4 really drops keys


def test_one_bucket_configuration_equals_the_teacher(fitted, tmp_path):
    out = tmp_path / "kmeans1"
    main(configure(fitted, out, "--method", "kmeans", "--knob", "buckets=1"))
    model = load_model(out, attn_implementation=SPARSEFINDER)
    torch.testing.assert_close(logits(model), logits(load_model(fitted["teacher"])), rtol=1e-5, atol=1e-5)


def test_window_only_needs_no_projections(fitted, tmp_path):
    out = tmp_path / "window"
    main(["configure", str(fitted["teacher"]), str(out), "--method", "window", "--window", "5"])
    heads = sparsefinder_heads(load_model(out, attn_implementation=SPARSEFINDER))
    assert len(heads) == LAYERS and heads[0].projections is None


def test_indexer_needs_no_projections_and_a_wide_margin_equals_the_teacher(fitted, tmp_path):
    teacher = logits(load_model(fitted["teacher"]))
    for margin, equal in ((1e9, True), (0.0, False)):
        out = tmp_path / f"indexer{margin}"
        args = ["configure", str(fitted["teacher"]), str(out), "--state", str(fitted["state"])]
        assert main([*args, "--method", "indexer", "--knob", "rank=2", "--knob", f"margin={margin}"]) == 0
        spec = read_manifest(out)[SPARSEFINDER]
        assert spec["projections"] is None and spec["state_shapes"]["q_map"] == [HEADS, 2, HEAD_DIM]
        model = load_model(out, attn_implementation=SPARSEFINDER)
        assert torch.allclose(logits(model), teacher, rtol=1e-5, atol=1e-5) == equal


def test_certified_indexer_is_the_teacher_even_with_no_margin(fitted, tmp_path):
    out = tmp_path / "certified"
    args = ["configure", str(fitted["teacher"]), str(out), "--state", str(fitted["state"]), "--certified"]
    assert main([*args, "--method", "indexer", "--knob", "rank=2"]) == 0
    assert read_manifest(out)[SPARSEFINDER]["certified"] is True
    model = load_model(out, attn_implementation=SPARSEFINDER)
    assert all(head.certified for head in sparsefinder_heads(model))
    teacher = logits(load_model(fitted["teacher"]))
    torch.testing.assert_close(logits(model), teacher, rtol=1e-5, atol=1e-5)


def test_a_state_for_another_head_count_is_refused(fitted, tmp_path):
    out = tmp_path / "indexer"
    args = ["configure", str(fitted["teacher"]), str(out), "--state", str(fitted["four_heads"])]
    result = run_module("pipeline", *args, "--method", "indexer", "--knob", "rank=2")
    assert result.returncode == 2 and not out.exists()
    line = result.stderr.strip()
    assert "layer0.k_map is for 4 heads" in line and line.endswith("has 2 heads × 8 dims"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "kmeans", "--knob", "buckets=3"], "holds no state for kmeans.buckets=3"),
        (["--method", "kmeans", "--knob", "buckets=4", "--window", "2"], "window must be 0 .none. or an odd"),
        (["--method", "bigbird"], "bigbird cannot run inside a model's decoder_self attention"),
        (["--method", "distance", "--knob", "threshold=-1"], "distance.threshold must be a number >= 0"),
        (["--method", "kmeans", "--knob", "depth=2"], "predictor kmeans has no knob depth"),
        (["--method", "kmeans", "--knob", "buckets=4", "--certified"], "allowed with predictor indexer"),
    ],
)
def test_bad_options_exit_2_in_one_line_and_write_nothing(fitted, tmp_path, args, message):
    out = tmp_path / "bad"
    result = run_module("pipeline", *configure(fitted, out, *args))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and re.search(message, result.stderr)
    assert not out.exists()


def test_projections_of_another_teacher_are_refused(fitted, tmp_path):
    other = tmp_path / "other"
    save_teacher(other, seed=5)
    with pytest.raises(SystemExit) as exit_info:
        main(["configure", str(other), str(tmp_path / "out"), "--method", "distance",
              "--projections", str(fitted["projections"])])  # fmt: skip
    assert exit_info.value.code == 2
    assert not (tmp_path / "out").exists()


def test_a_knob_written_at_its_default_still_selects_the_state(fitted, tmp_path):
    """buckets=8 is k-means' default; written out, it picks the 8-bucket state of 4 and 8 (not 'several')."""
    projections, _ = load_projections(fitted["projections"])
    predictors = [KMeansPredictor(buckets=b, iterations=5, backend="sklearn") for b in (4, 8)]
    generator = torch.Generator().manual_seed(3)
    for layer, module in projections.items():
        q = torch.randn(3, HEADS, 12, HEAD_DIM, generator=generator)
        valid = torch.ones(3, 12, dtype=torch.bool)
        for predictor in predictors:
            predictor.fit(layer, [HeadInputs(q, q, valid, valid, True, *module(q, q))], seed=0)
    state = tmp_path / "state.safetensors"
    save_states(state, predictors, load_projections(fitted["projections"])[1] | {"kind": "decoder_self"})
    out = tmp_path / "kmeans8"
    args = ["configure", str(fitted["teacher"]), str(out), "--projections", str(fitted["projections"])]
    assert main([*args, "--centroids", str(state), "--method", "kmeans", "--knob", "buckets=8"]) == 0
    assert read_manifest(out)[SPARSEFINDER]["knobs"]["buckets"] == 8


def test_a_teacher_saved_without_a_tokenizer_is_configured_without_one(fitted, tmp_path):
    bare = tmp_path / "bare-teacher"
    save_checkpoint(bare, load_model(fitted["teacher"]), None, {"stage": "teacher"})
    assert not any((bare / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    out, with_tokenizer = tmp_path / "window", tmp_path / "window-with-tokenizer"
    assert main(["configure", str(bare), str(out), "--method", "window", "--window", "5"]) == 0
    main(["configure", str(fitted["teacher"]), str(with_tokenizer), "--method", "window", "--window", "5"])
    assert (
        not (out / "tokenizer_config.json").exists() and (with_tokenizer / "tokenizer_config.json").exists()
    )
    configured = load_model(out, attn_implementation=SPARSEFINDER)
    assert torch.equal(
        logits(configured), logits(load_model(with_tokenizer, attn_implementation=SPARSEFINDER))
    )
