"""``python -m benchmarks.indexed_model``: indexed attention on a saved model's own attention inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from benchmarks import indexed_model
from pipeline.attention.loading import load_model
from pipeline.checkpoint import save_checkpoint
from pipeline.corpus_card import MQAR_CARD
from pipeline.data.mqar import MqarSpec
from pipeline.data.mqar_card import mqar_card_text
from pipeline.data.mqar_corpus import build_mqar_corpus, mqar_tokenizer
from pipeline.evaluation.speed import long_sequence
from pipeline.predictors.indexer_fit import low_rank
from tests.tiny import tiny_llama

SPEC = MqarSpec(vocab_size=64, input_seq_len=32, num_kv_pairs=4)


def saved(root: Path, name: str, **overrides) -> Path:
    folder = root / name
    model = tiny_llama(vocab=67, **overrides)
    save_checkpoint(
        folder, model, mqar_tokenizer(64), {"stage": "teacher"}, {MQAR_CARD: mqar_card_text(root / "data")}
    )
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexed_model")
    build_mqar_corpus(root / "data", spec=SPEC, counts={"train": 2, "valid": 2, "test": 4}, seed=0)
    saved(root, "teacher")
    saved(root, "softmax", entmax_alpha=1.0)
    return root


def test_every_layer_is_captured_as_the_model_computes_it(root: Path) -> None:
    layers, alpha = indexed_model.model_inputs(str(root / "teacher"), str(root / "data"), 48, rank=4)
    assert alpha == 1.5 and [layer["layer"] for layer in layers] == [0, 1]
    for layer in layers:
        q, k, v = layer["q"], layer["k"], layer["v"]
        assert q.shape == k.shape == v.shape == (1, 4, 48, 8)  # keys and values repeated to the 4 query heads
        assert torch.equal(k[:, 0], k[:, 1]) and not torch.equal(k[:, 1], k[:, 2])  # 2 heads share a key head
        assert layer["q_index"].shape == (1, 4, 48, 4) and layer["scaling"] == pytest.approx(8**-0.5)
    # layer 0 sees the embeddings: its queries and keys are their rotated projections, at positions 0…47
    model = load_model(root / "teacher")
    ids = long_sequence(load_from_disk(str(root / "data"))["test"], 48)
    attention = model.model.layers[0].self_attn
    hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))  # (1, 48, 32)
    with torch.no_grad():
        q = attention.q_proj(hidden).view(1, 48, 4, 8).transpose(1, 2)
        k = attention.k_proj(hidden).view(1, 48, 2, 8).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *model.model.rotary_emb(hidden, torch.arange(48)[None]))
    torch.testing.assert_close(layers[0]["q"], q)
    torch.testing.assert_close(layers[0]["k"], k.repeat_interleave(2, dim=1))


def test_the_report_times_every_method_and_certified_stays_exact(root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    indexed_model.main(
        [str(root / "teacher"), "--data", str(root / "data"), "--n", "64", "--rank", "4", "--block", "16",
         "--reps", "1", "--backward", "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    methods = ["sdpa"] + [name for name, *_ in indexed_model.VARIANTS]
    assert [row["method"] for row in report["layers"]] == methods * 2
    assert [row["method"] for row in report["all"]] == methods
    for row in report["layers"] + report["all"]:
        assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        if row["method"] == "sdpa":
            assert row["forward_x_sdpa"] == 1.0
        elif row["method"].startswith("certified"):
            assert row["max_rel_error"] < 1e-5  # exact α-entmax on a model's own inputs
        else:
            assert 0.0 < row["support_recall"] <= 1.0
    sums = report["all"][1]
    mine = [row for row in report["layers"] if row["method"] == sums["method"]]
    assert sums["forward_ms"] == pytest.approx(sum(row["forward_ms"] for row in mine))
    assert sums["forward_x_sdpa"] == pytest.approx(report["all"][0]["forward_ms"] / sums["forward_ms"])
    assert "| all | certified (scanned) |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["softmax"], "a softmax model (entmax_alpha 1); allowed: an α-entmax teacher"),
        (["teacher", "--n", "4096"], "--n 4096: the test split is too short"),
    ],
)
def test_inputs_it_cannot_measure_exit_2_with_one_line(
    root: Path, tmp_path: Path, capsys, args, named
) -> None:
    argv = [str(root / args[0]), *args[1:], "--data", str(root / "data"), "--out", str(tmp_path / "b.json")]
    with pytest.raises(SystemExit) as stopped:
        indexed_model.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.json").exists()


def test_occupancy_counts_the_causal_pairs_and_blocks_the_support_touches() -> None:
    n, block = 6, 4  # two blocks of queries and keys, the second padded
    support = torch.zeros(1, 2, n, n, dtype=torch.bool)
    support[0, 0].fill_diagonal_(True)  # head 0: the diagonal, 6 of 21 causal pairs, both diagonal blocks
    support[0, 1, 5, 0] = True  # head 1: one pair, in block (1, 0)
    occupancy = indexed_model.support_occupancy(support, block)
    assert occupancy["teacher_density"] == pytest.approx(7 / 42)
    assert occupancy["block_density"] == pytest.approx(3 / 6)  # of 3 causal blocks per head


def _layer(q: torch.Tensor, k: torch.Tensor, basis: torch.Tensor) -> dict:
    return {
        "q": q,
        "k": k,
        "scaling": 0.5,
        "basis": basis,
        "q_index": low_rank(q, basis),
        "k_index": low_rank(k, basis),
    }


def test_the_low_rank_bound_keeps_the_support_and_is_the_score_at_full_rank() -> None:
    torch.manual_seed(0)
    h, n, d, alpha = 2, 24, 4, 1.5
    q, k = torch.randn(1, h, n, d) * 2, torch.randn(1, h, n, d) * 2
    probs = indexed_model._dense_probs(q, k, alpha, 0.5)
    density = indexed_model.support_occupancy(probs > 0, 8)["teacher_density"]
    full = torch.eye(d).expand(h, d, d)  # r = d: nothing is left to Cauchy–Schwarz, the bound is the score
    exact = indexed_model.skipping_ceilings(_layer(q, k, full), probs, alpha=alpha, block=8)
    assert exact["bound_keeps"] == pytest.approx(density)
    low = indexed_model.skipping_ceilings(_layer(q, k, full[:, :2]), probs, alpha=alpha, block=8)
    assert low["bound_keeps"] > density  # an upper bound keeps every support pair, and here more


def test_the_clustered_density_counts_blocks_in_the_indexer_order() -> None:
    # one head, 4 tokens on a line at 0, 10, 1, 11: the k-d tree puts tokens {0, 2} in one block and {1, 3}
    # in the other, so every (query block, key block) pair holds a causal pair and the diagonal touches two
    # of the four (in position order: two of the three causal blocks)
    x = torch.tensor([0.0, 10.0, 1.0, 11.0]).view(1, 1, 4, 1)
    probs = torch.eye(4).view(1, 1, 4, 4)  # the support: the diagonal
    ceilings = indexed_model.skipping_ceilings(_layer(x, x, torch.ones(1, 1, 1)), probs, alpha=1.5, block=2)
    assert ceilings["clustered_block_density"] == pytest.approx(2 / 4)
    assert indexed_model.support_occupancy(probs > 0, 2)["block_density"] == pytest.approx(2 / 3)
