"""Graph store: round trip, random access, batches, integrity checks and crash safety."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.graphs import GraphStore, GraphStoreWriter, epoch_batches, iter_batches
from pipeline.graphs.store import MANIFEST, AttentionGraph

L, H, D = 2, 3, 8
SENTENCES = 7
TEACHER = {"checkpoint": "teacher", "model_sha256": "0" * 64}


def writer(folder: Path, **overrides) -> GraphStoreWriter:
    options = dict(
        teacher_fingerprint=TEACHER,
        split="test",
        attention_kinds=["decoder_self", "cross"],
        layers=L,
        heads=H,
        head_dim=D,
        scaling=D**-0.5,
        shard_sentences=3,
    )
    return GraphStoreWriter(folder, **{**options, **overrides})


def sentences(random_graph) -> list[tuple[dict, dict]]:
    """(tokens, graphs) of SENTENCES sentence pairs of random lengths, non-ASCII tokens included."""
    rng = np.random.default_rng(0)
    data = []
    for s in range(SENTENCES):
        n, m = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        tokens = {"target": [f"▁t{s}.{i}é" for i in range(n)], "source": [f"s{s}${i}" for i in range(m)]}
        graphs = {
            "decoder_self": random_graph(rng, n, n, causal=True, layers=L, heads=H, dim=D),
            "cross": random_graph(rng, n, m, causal=False, layers=L, heads=H, dim=D),
        }
        data.append((tokens, graphs))
    return data


def write_store(folder: Path, data: list[tuple[dict, dict]], **overrides) -> None:
    """Write ``data`` as sentences 100, 101, ... of a store at ``folder``."""
    with writer(folder, **overrides) as w:
        for s, (tokens, graphs) in enumerate(data):
            w.add(100 + s, tokens, graphs)


@pytest.fixture
def written(tmp_path: Path, random_graph) -> tuple[Path, list[tuple[dict, dict]]]:
    data = sentences(random_graph)
    folder = tmp_path / "graphs"
    write_store(folder, data)
    return folder, data


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_round_trip_random_access(tmp_path: Path, random_graph, dtype: str) -> None:
    data = sentences(random_graph)
    folder = tmp_path / "graphs"
    write_store(folder, data, dtype=dtype)

    store = GraphStore(folder)
    assert len(store) == SENTENCES
    assert store.sentence_ids().tolist() == [100 + s for s in range(SENTENCES)]
    # every (sentence, layer, head), visited out of order across the three shards
    for s in np.random.default_rng(1).permutation(SENTENCES):
        tokens, graphs = data[s]
        for kind, (q_side, k_side) in {
            "decoder_self": ("target", "target"),
            "cross": ("target", "source"),
        }.items():
            for layer in range(L):
                for head in range(H):
                    record = store.get(int(s), layer, head, kind)
                    graph = graphs[kind]
                    tolerance = 0 if dtype == "float32" else 2e-3
                    np.testing.assert_allclose(record.q, graph.q[layer, head], rtol=tolerance, atol=tolerance)
                    np.testing.assert_allclose(record.k, graph.k[layer, head], rtol=tolerance, atol=tolerance)
                    np.testing.assert_array_equal(record.gold_mask(), graph.probs[layer, head] > 0)
                    np.testing.assert_array_equal(record.gold_probs(), graph.probs[layer, head])
                    assert record.indptr[-1] == len(record.cols) == len(record.probs)
                    assert record.query_tokens == tokens[q_side] and record.key_tokens == tokens[k_side]
                    assert record.sentence_id == 100 + s and record.causal == (kind == "decoder_self")


def test_manifest(written) -> None:
    folder, data = written
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["format_version"] == 1 and manifest["teacher"] == TEACHER
    assert manifest["split"] == GraphStore(folder).split == "test"
    assert manifest["kinds"]["decoder_self"]["causal"] and not manifest["kinds"]["cross"]["causal"]
    counts = manifest["counts"]
    assert counts["sentences"] == SENTENCES
    assert counts["tokens"]["target"] == sum(len(t["target"]) for t, _ in data)
    for kind in ("decoder_self", "cross"):
        assert counts["edges"][kind] == sum(int((g[kind].probs > 0).sum()) for _, g in data)
    assert [s["sentences"] for s in manifest["shards"]] == [[0, 3], [3, 6], [6, 7]]
    assert counts["bytes"] == sum((folder / s["file"]).stat().st_size for s in manifest["shards"])
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST] + [s["file"] for s in manifest["shards"]]


def test_batches_are_padded_layers(written) -> None:
    folder, _ = written
    store = GraphStore(folder)
    indices = [5, 0, 3, 6, 1]
    batches = list(iter_batches(store, kind="cross", layer=1, indices=indices, batch_size=2))
    assert [b["sentence"].tolist() for b in batches] == [[5, 0], [3, 6], [1]]
    for batch in batches:
        n, m = batch["q_valid"].shape[1], batch["k_valid"].shape[1]
        assert batch["q"].dtype == torch.float32 and batch["gold"].dtype == torch.bool
        assert batch["q"].shape[:3] == (len(batch["sentence"]), H, n) and batch["gold"].shape[2:] == (n, m)
        for b, s in enumerate(batch["sentence"].tolist()):
            for head in range(H):
                record = store.get(s, 1, head, "cross")
                assert batch["q_valid"][b].sum() == record.n and batch["k_valid"][b].sum() == record.m
                gold = batch["gold"][b, head].numpy()
                np.testing.assert_array_equal(gold[: record.n, : record.m], record.gold_mask())
                assert not gold[record.n :].any() and not gold[:, record.m :].any()
                np.testing.assert_array_equal(batch["k"][b, head, : record.m].numpy(), record.k)
                assert not batch["q"][b, head, record.n :].any()


def test_epoch_batches_shuffle_reproducibly(written) -> None:
    store = GraphStore(written[0])
    train = [0, 2, 3, 5, 6]
    batches_fn = epoch_batches(store, kind="decoder_self", layer=0, indices=train)

    def order(seed: int) -> list[int]:
        batches = batches_fn(2, torch.Generator().manual_seed(seed))
        return [s for batch in batches for s in batch["sentence"].tolist()]

    assert sorted(order(0)) == train
    assert order(0) == order(0)


def test_verify_names_truncated_and_corrupt_shards(written) -> None:
    folder, _ = written
    store = GraphStore(folder)
    assert store.verify() == []

    truncated, flipped = folder / "shard-00001.safetensors", folder / "shard-00002.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:-100])
    raw = bytearray(flipped.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    flipped.write_bytes(bytes(raw))

    problems = GraphStore(folder).verify()
    assert len(problems) == 2
    assert problems[0].startswith("shard-00001.safetensors: truncated")
    assert problems[1].startswith("shard-00002.safetensors: sha256 mismatch")
    with pytest.raises(UserError, match=r"shard-00001\.safetensors"):
        GraphStore(folder).get(4, 0, 0)
    (folder / "shard-00000.safetensors").unlink()
    assert GraphStore(folder).verify()[0] == "shard-00000.safetensors: missing"


def test_crash_mid_write_leaves_no_store(tmp_path: Path, random_graph) -> None:
    data = sentences(random_graph)
    folder = tmp_path / "graphs"
    with pytest.raises(RuntimeError, match="teacher crashed"), writer(folder) as w:
        for s, (tokens, graphs) in enumerate(data):
            w.add(s, tokens, graphs)  # four sentences in: one shard already on disk
            if s == 4:
                raise RuntimeError("teacher crashed")
    assert list(tmp_path.iterdir()) == []


def test_crash_keeps_the_previous_store(written, random_graph) -> None:
    folder, data = written
    before = (folder / MANIFEST).read_text()
    with pytest.raises(KeyboardInterrupt), writer(folder) as w:
        w.add(0, *data[0])
        raise KeyboardInterrupt
    assert (folder / MANIFEST).read_text() == before
    assert GraphStore(folder).verify() == []
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_writer_rejects_bad_input(tmp_path: Path, random_graph) -> None:
    rng = np.random.default_rng(0)
    tokens = {"target": ["a", "b", "c"], "source": ["x", "y"]}
    cross = random_graph(rng, 3, 2, causal=False, layers=L, heads=H, dim=D)
    leaky = random_graph(rng, 3, 3, causal=False, layers=L, heads=H, dim=D)  # attends to future tokens
    folder = tmp_path / "graphs"
    with pytest.raises(ValueError, match="future"), writer(folder) as w:
        w.add(0, tokens, {"decoder_self": leaky, "cross": cross})
    with pytest.raises(ValueError, match=r"cross\.k has shape"), writer(folder) as w:
        w.add(0, tokens, {"decoder_self": leaky._replace(probs=np.tril(leaky.probs)), "cross": leaky})
    with pytest.raises(ValueError, match="no sentence"), writer(folder):
        pass
    with pytest.raises(RuntimeError, match="inside"):
        writer(folder).add(0, tokens, {"decoder_self": leaky, "cross": cross})
    with pytest.raises(ValueError, match="unknown attention kind"):
        writer(folder, attention_kinds=["decoder"])
    with pytest.raises(ValueError, match="split must be one of"):
        writer(folder, split="dev")
    assert list(tmp_path.iterdir()) == []


def test_reader_errors(written, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no graph store"):
        GraphStore(tmp_path / "missing")
    store = GraphStore(written[0])
    with pytest.raises(IndexError, match=r"sentence 7 out of range \[0, 7\)"):
        store.get(7, 0, 0)
    with pytest.raises(IndexError, match="layer"):
        store.get(0, L, 0)
    with pytest.raises(ValueError, match="stored: decoder_self, cross"):
        store.get(0, 0, 0, kind="encoder_self")


@pytest.mark.parametrize(
    ("split", "message"),
    [(None, "split: Field required"), ("dev", "split = 'dev': Input should be 'train', 'valid' or 'test'")],
)
def test_reader_refuses_a_manifest_without_a_known_split(written, split: str | None, message: str) -> None:
    folder, _ = written
    manifest = json.loads((folder / MANIFEST).read_text())
    if split is None:
        del manifest["split"]
    else:
        manifest["split"] = split
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=f"^{folder / MANIFEST}: {message}$"):
        GraphStore(folder)


# writes the pickled sentences argv[2] as a store at argv[1], one shard per sentence
_WRITE = (
    "import pickle, sys; from pathlib import Path; "
    "from tests.pipeline.graphs.test_graphs_store import write_store; "
    "write_store(Path(sys.argv[1]), pickle.loads(Path(sys.argv[2]).read_bytes()), shard_sentences=1)"
)


def test_writes_are_byte_reproducible(tmp_path: Path, random_graph) -> None:
    """The same sentences give byte-identical shards and manifest in two processes (different hash seeds).

    safetensors writes its metadata map in a per-process random order, so this needs one metadata key.
    """
    data = tmp_path / "sentences.pickle"
    data.write_bytes(pickle.dumps(sentences(random_graph)))
    folders = [tmp_path / f"run-{seed}" / "graphs" for seed in (1, 2)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITE, str(folder), str(data)],
            cwd=Path(__file__).resolve().parents[3],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        )
        for seed, folder in zip((1, 2), folders, strict=True)
    ]
    assert [run.wait() for run in runs] == [0, 0]
    first, second = ({p.name: file_sha256(p) for p in folder.iterdir()} for folder in folders)
    assert len(first) == SENTENCES + 1 and first == second


def test_long_sentences_use_wide_columns(tmp_path: Path) -> None:
    """Key indices beyond int16 are stored as int32 and read back exactly."""
    n, m = 1, 40_000
    probs = np.zeros((1, 1, n, m), np.float32)
    probs[0, 0, 0, [0, 39_999]] = 0.5
    graph = AttentionGraph(q=np.ones((1, 1, n, 2)), k=np.ones((1, 1, m, 2)), probs=probs)
    folder = tmp_path / "graphs"
    options = dict(attention_kinds=["cross"], layers=1, heads=1, head_dim=2)
    with writer(folder, **options) as w:
        w.add(0, {"target": ["q"], "source": ["k"] * m}, {"cross": graph})
    assert GraphStore(folder).get(0, 0, 0, "cross").cols.tolist() == [0, 39_999]
