"""``sparsefinder inspect``: summary, checksum verification, pictures and predicted masks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.cli import main
from pipeline.graphs import GraphStore
from pipeline.graphs.summary import format_summary, summarize
from pipeline.predictors import KMeansPredictor, make_predictor
from pipeline.predictors.scoring import Setting, sentence_graph
from pipeline.predictors.state import save_states
from pipeline.projection import HeadProjections, load_projections, save_projections

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def learned_files(micro_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A projections file (rank 3, both layers) and a k-means state file (4 centroids per head)."""
    store = GraphStore(micro_store)
    folder = tmp_path_factory.mktemp("learned")
    generator = torch.Generator().manual_seed(0)
    layers = {
        i: HeadProjections(store.heads, store.head_dim, 3, generator=generator) for i in range(store.layers)
    }
    save_projections(folder / "projections.safetensors", layers)
    kmeans = KMeansPredictor(buckets=4)
    for i in range(store.layers):
        kmeans.set_layer_state(i, {"centroids": torch.randn(store.heads, 4, 3, generator=generator)})
    save_states(folder / "state.safetensors", [kmeans])
    return folder / "projections.safetensors", folder / "state.safetensors"


def test_summary_counts_valid_pairs(micro_store: Path) -> None:
    store = GraphStore(micro_store)
    summary = summarize(store)
    assert summary["sentences"] == len(store) and summary["bytes"] == store.nbytes
    assert summary["split"] == "train"
    stats = summary["kinds"]["decoder_self"]
    lengths = store.lengths("target")
    # causal: L(L+1)/2 valid pairs per sentence and head
    assert stats["valid_pairs"] == int((lengths * (lengths + 1) // 2).sum()) * store.layers * store.heads
    layer, head = 1, 0
    per_sentence = [
        1 - store.get(s, layer, head).gold_mask().sum() / (n * (n + 1) / 2) for s, n in enumerate(lengths)
    ]
    assert stats["per_layer_head"]["sparsity"][layer][head] == pytest.approx(np.mean(per_sentence))
    assert 0 < stats["sparsity"] < 1 and stats["mean_degree"] >= 1  # entmax keeps at least one key per query
    cross = summary["kinds"]["cross"]
    assert cross["valid_pairs"] == int((lengths * store.lengths("source")).sum()) * store.layers * store.heads

    text = format_summary(summary)
    assert "(train split)" in text.splitlines()[0]
    assert "decoder_self (causal)" in text and "cross (bidirectional)" in text and "head 1" in text


def test_cli_prints_summary(micro_store: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(micro_store)]) == 0
    out = capsys.readouterr().out
    assert f"{len(GraphStore(micro_store))} sentences" in out and "encoder_self" in out


def test_cli_check_names_bad_shards(micro_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "graphs"
    shutil.copytree(micro_store, folder)
    assert main(["inspect", str(folder), "--check"]) == 0
    assert "sha256 ok" in capsys.readouterr().out

    shard = folder / "shard-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    last = sorted(folder.glob("shard-*.safetensors"))[-1]
    last.write_bytes(last.read_bytes()[:50])
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(folder), "--check"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: corrupt graph store {folder}: ") and len(err.strip().splitlines()) == 1
    assert "shard-00001.safetensors: sha256 mismatch" in err and f"{last.name}: truncated" in err
    assert "shard-00000" not in err


@pytest.mark.parametrize(
    ("method", "knobs"),
    [
        (None, []),
        ("window", []),
        ("distance", ["threshold=1.5"]),
        ("quantization", ["bins=2"]),
        ("kmeans", ["buckets=4", "top_k=2"]),
    ],
)
def test_cli_draws_a_head(micro_store: Path, learned_files, tmp_path: Path, method, knobs) -> None:
    projections, centroids = learned_files
    png = tmp_path / "head.png"
    args = ["inspect", str(micro_store), "--sentence", "2", "--layer", "1", "--head", "0", "--png", str(png)]
    if method is not None:
        args += ["--method", method, "--window", "3", "--global", "1", "--projections", str(projections)]
        args += ["--state", str(centroids), *(f"--knob={knob}" for knob in knobs)]
    assert main(args) == 0
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 15_000


def test_cli_draws_cross_attention(micro_store: Path, tmp_path: Path) -> None:
    png = tmp_path / "cross.png"
    args = ["inspect", str(micro_store), "--sentence", "0", "--layer", "0", "--head", "1", "--kind", "cross"]
    assert main([*args, "--png", str(png), "--method", "window", "--window", "5"]) == 0
    assert png.stat().st_size > 15_000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--sentence", "999", "--layer", "0", "--head", "0", "--png", "x.png"],
            "--sentence 999 is out of range",
        ),
        (["--sentence", "0", "--layer", "5", "--head", "0", "--png", "x.png"], "allowed 0..1"),
        (["--sentence", "0", "--layer", "0", "--head", "-1", "--png", "x.png"], "--head -1 is out of range"),
        (["--sentence", "-2"], "--sentence -2 is out of range; allowed >= 0"),
        (["--window", "-1"], "--window must be 0 (none) or an odd size"),
        (["--global", "-1"], "--global -1 is negative; allowed >= 0"),
        (["--sentence", "0", "--layer", "0"], "needs all of --sentence, --layer, --head and --png"),
        (["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png", "--kind", "self"], "stored:"),
        (
            ["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png", "--method", "distance"],
            "--projections",
        ),
        (["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png", "--window", "2"], "odd size"),
        (
            ["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png", "--method", "kmeans"],
            "--state FILE",
        ),
        (
            [
                *["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png"],
                *["--method", "distance", "--knob", "radius=3"],
            ],
            "predictor distance has no knob radius",
        ),
        (
            [
                *["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png"],
                *["--method", "distance", "--knob", "threshold=-1"],
            ],
            "distance.threshold must be a number >= 0; got -1",
        ),
        (
            [
                *["--sentence", "0", "--layer", "0", "--head", "0", "--png", "x.png"],
                *["--method", "distance", "--knob", "threshold=.nan"],
            ],
            "--knob 'threshold=.nan': must be a finite number",
        ),
    ],
)
def test_cli_rejects_bad_arguments(
    micro_store: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(micro_store), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_rejects_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2 and "no graph store" in capsys.readouterr().err


def test_predicted_masks(micro_store: Path, learned_files) -> None:
    store = GraphStore(micro_store)
    projections = load_layer(learned_files[0], 0)
    n = store.get(1, 0, 0).n
    i, j = np.indices((n, n))
    causal = j <= i

    def graph(name: str, window: int = 0, global_tokens: int = 0, **knobs) -> np.ndarray:
        setting = Setting(make_predictor(name, **knobs), window, global_tokens)
        return sentence_graph(store, "decoder_self", 0, 1, setting, projections=projections)[0].numpy()

    np.testing.assert_array_equal(graph("window", window=3), (abs(i - j) <= 1) & causal)
    np.testing.assert_array_equal(graph("window", global_tokens=1), ((i == 0) | (j == 0)) & causal)
    np.testing.assert_array_equal(graph("distance", threshold=1e9), causal)
    np.testing.assert_array_equal(graph("quantization", bins=1), causal)


def load_layer(path: Path, layer: int) -> HeadProjections:
    return load_projections(path)[0][layer]
