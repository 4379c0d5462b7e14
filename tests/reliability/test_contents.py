"""Artifacts whose hashes are right but whose contents lie are refused where they are read, in one line.

A hostile user can edit a file and rewrite the hash that vouches for it (a graph store shard and its
manifest's sha256, a predictor state and its header's tensor hash). So the readers check what the files
hold, not only that they are the files their manifests describe:

- graph store shards: key indices within the sentence (and causal where the kind is), probabilities in
  [0, 1] summing to 1 per query, monotone CSR offsets, finite queries and keys; the message names the
  shard and the first bad (sentence, layer, head). A forged 20 GB shard is refused before it is hashed.
- predictor states and projections: a format version, and state shapes that fit the teacher's heads, the
  projections' rank and the predictor's bucket count (``sparsefinder configure``, ``evaluate``).
- a teacher with NaN weights: extract stops at the first non-finite attention score, naming the layer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open

from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.finite import require_finite_tensors
from pipeline.graphs import GraphStore
from pipeline.graphs.extract import extract_graphs, teacher_fingerprint
from pipeline.graphs.store import MANIFEST
from pipeline.origin import Origin
from pipeline.predictors.state import load_states
from pipeline.tensor_file import HASH_KEY, write_tensor_file
from tests.pipeline.attention.test_configure import HEAD_DIM, HEADS, LAYERS, configure, fitted  # noqa: F401
from tests.reliability.test_graph_store import (
    SHARD_1,
    corrupted_copy,
    edit_manifest,
    read_manifest,
    rewrite_shard,
)
from tests.stage_runner import run_module

ROOT = Path(__file__).resolve().parents[2]
FIRST = 4  # shard 1 of the micro store holds sentences 4 … 7

# ----------------------------------------------------------------------------------------------------------
# graph store shards that pass their sha256 check but lie


def edge(arrays: dict[str, np.ndarray], kind: str, layer: int, head: int, sentence: int, query: int) -> int:
    """Index into ``kind``'s cols/probs of the first edge of ``query`` of shard 1's ``sentence``."""
    side = "source" if kind == "encoder_self" else "target"
    starts = np.concatenate([[0], np.cumsum(arrays[f"lengths.{side}"])])
    return int(arrays[f"{kind}.indptr"][layer, head, starts[sentence] + query])


def set_at(kind: str, part: str, value: float, layer: int, head: int, sentence: int, query: int):
    """A shard rewrite putting ``value`` in ``kind.part`` at the first edge of that query."""

    def change(arrays: dict[str, np.ndarray]) -> None:
        arrays[f"{kind}.{part}"][edge(arrays, kind, layer, head, sentence, query)] = value

    return change


def halve_row(arrays: dict[str, np.ndarray]) -> None:
    """Query 0 of a causal head attends only key 0, with probability 1: make it 0.5."""
    arrays["decoder_self.probs"][edge(arrays, "decoder_self", 0, 0, 0, 0)] = 0.5


def drop_offset(arrays: dict[str, np.ndarray]) -> None:
    """Make decoder_self's CSR offsets decrease at query 1 of shard sentence 2, layer 1, head 1."""
    starts = np.concatenate([[0], np.cumsum(arrays["lengths.target"])])
    row = starts[2] + 1
    arrays["decoder_self.indptr"][1, 1, row] = arrays["decoder_self.indptr"][1, 1, row - 1] - 1


def nan_key(arrays: dict[str, np.ndarray]) -> None:
    starts = np.concatenate([[0], np.cumsum(arrays["lengths.source"])])
    arrays["cross.k"][1, 0, starts[1] + 3, 5] = np.nan


@dataclass(frozen=True)
class Forgery:
    name: str
    change: Callable[[dict[str, np.ndarray]], Any]
    message: str  # what the one line must say after naming the shard


FORGERIES = [
    Forgery(
        "key 30000",
        set_at("cross", "cols", 30000, layer=1, head=0, sentence=1, query=2),
        f"cross.cols holds key 30000 at sentence {FIRST + 1}, layer 1, head 0, query 2; allowed: keys 0 … ",
    ),
    Forgery(
        "key -1",
        set_at("encoder_self", "cols", -1, layer=0, head=1, sentence=2, query=0),
        f"encoder_self.cols holds key -1 at sentence {FIRST + 2}, layer 0, head 1, query 0; allowed: keys "
        "0 … ",
    ),
    Forgery(
        "future key in a causal store",
        set_at("decoder_self", "cols", 2, layer=0, head=0, sentence=1, query=1),
        f"decoder_self.cols holds key 2 at sentence {FIRST + 1}, layer 0, head 0, query 1; allowed: keys "
        "0 … 1, within the sentence and at or before the query (decoder_self is causal)",
    ),
    Forgery(
        "NaN probability",
        set_at("decoder_self", "probs", np.nan, layer=0, head=1, sentence=3, query=2),
        f"decoder_self.probs holds nan at sentence {FIRST + 3}, layer 0, head 1, query 2; allowed: "
        "probabilities in [0, 1]",
    ),
    Forgery(
        "row not summing to 1",
        halve_row,
        f"decoder_self.probs sum to 0.5 at sentence {FIRST}, layer 0, head 0, query 0; allowed: every "
        "query's probabilities sum to 1 (± 0.01)",
    ),
    Forgery(
        "offsets not monotone",
        drop_offset,
        "tensor decoder_self.indptr is not non-decreasing offsets from 0 to ",
    ),
    Forgery(
        "NaN key",
        nan_key,
        f"cross.k is not finite at sentence {FIRST + 1}, layer 1, head 0, token 3; allowed: finite values",
    ),
]


def forged_copy(micro_store: Path, where: Path, forgery: Forgery) -> Path:
    """A copy of the micro store whose shard 1 is rewritten by ``forgery``, its sha256 and size resealed."""
    folder = corrupted_copy(micro_store, where, rewrite_shard(forgery.change))
    entry = read_manifest(folder)["shards"][1]
    assert (folder / SHARD_1).stat().st_size == entry["bytes"]  # only the content check can tell
    return folder


@pytest.mark.parametrize("forgery", FORGERIES, ids=lambda forgery: forgery.name)
def test_a_shard_that_lies_under_a_valid_sha256_is_refused_on_read(
    micro_store: Path, tmp_path: Path, forgery: Forgery
) -> None:
    folder = forged_copy(micro_store, tmp_path, forgery)
    with pytest.raises(UserError) as raised:
        GraphStore(folder).sentence_ids()
    line = str(raised.value)
    assert line.startswith(f"graph store shard {folder / SHARD_1}: {forgery.message}"), line
    assert line.endswith("; re-run extract") and "\n" not in line
    if forgery.name == "offsets not monotone":
        assert f", first at sentence {FIRST + 2}, layer 1, head 1, query 1;" in line
    problems = GraphStore(folder).verify()  # inspect --check says the same
    assert problems[0].startswith(f"{SHARD_1}: {forgery.message}")


def project_params(tmp_path: Path, graphs: Path) -> Path:
    """The micro profile's params with ``project`` reading ``graphs`` and writing under ``tmp_path/out``."""
    params = yaml.safe_load((ROOT / "configs/micro.yaml").read_text())
    out = tmp_path / "out"
    params["project"].update(
        graphs=str(graphs),
        out=str(out / "projections.safetensors"),
        metrics=str(out / "project.json"),
        plot=str(out / "project_loss.csv"),
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def assert_refused(result: Any, *parts: str) -> str:
    """Exit 2, one ``error:`` line holding every part, no traceback; returns the line."""
    err = result.stderr
    assert result.returncode == 2, err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(part in err for part in parts), err
    return err.strip()


@pytest.mark.parametrize("name", ["key 30000", "future key in a causal store"])
def test_project_exits_2_on_a_lying_shard_and_writes_nothing(micro_store: Path, tmp_path: Path, name: str):
    forgery = next(f for f in FORGERIES if f.name == name)
    folder = forged_copy(micro_store, tmp_path, forgery)
    result = run_module("stages.project", "--params", str(project_params(tmp_path, folder)), cwd=tmp_path)
    assert_refused(result, f"error: graph store shard {folder / SHARD_1}: {forgery.message}")
    assert not (tmp_path / "out").exists()


def sparse_huge_shard(*, claimed: bool) -> Callable[[Path], None]:
    """Shard 1 replaced by a 20 GB sparse file (no disk used); with ``claimed`` the manifest's size and
    sha256 for it are rewritten too, as a forger would."""

    def corrupt(folder: Path) -> None:
        with open(folder / SHARD_1, "r+b") as handle:
            handle.truncate(20 * 2**30)
        if claimed:

            def claim(manifest: dict[str, Any]) -> None:
                entry = manifest["shards"][1]
                manifest["counts"]["bytes"] += 20 * 2**30 - entry["bytes"]
                entry.update(bytes=20 * 2**30, sha256="0" * 64)

            edit_manifest(claim)(folder)

    return corrupt


@pytest.mark.parametrize("claimed", [True, False], ids=["manifest claims it", "manifest untouched"])
def test_a_20_gb_forged_shard_is_refused_without_hashing_it(
    micro_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claimed: bool
) -> None:
    """Its size is checked against the manifest, and the manifest's against its counts, before any hash."""

    def hash_all_but_the_forgery(path: Any) -> str:
        assert Path(path).name != SHARD_1, f"{path} was hashed"
        return file_sha256(path)

    monkeypatch.setattr("pipeline.fingerprint.file_sha256", hash_all_but_the_forgery)
    monkeypatch.setattr("pipeline.fingerprint._DIGESTS", {})
    folder = corrupted_copy(micro_store, tmp_path, sparse_huge_shard(claimed=claimed))
    with pytest.raises(UserError) as raised:
        GraphStore(folder).sentence_ids()
    line = str(raised.value)
    if claimed:
        assert line.startswith(f"{folder / MANIFEST}: shards[1].bytes = 21474836480: more than the "), line
        assert "bytes the store's counts and shapes allow" in line
        result = run_module("stages.project", "--params", str(project_params(tmp_path, folder)), cwd=tmp_path)
        assert_refused(result, "shards[1].bytes = 21474836480: more than the ")
    else:
        assert line.startswith(f"graph store shard {folder / SHARD_1}: 21474836480 bytes, manifest says ")


# ----------------------------------------------------------------------------------------------------------
# predictor states and projections: a format version, shapes that fit the teacher and the projections


def rewrite_tensor_file(
    source: Path,
    path: Path,
    key: str,
    tensors: Callable[[dict[str, torch.Tensor]], Any] = lambda t: None,
    header: Callable[[dict[str, Any]], Any] = lambda h: None,
) -> Path:
    """``source`` written again to ``path`` after ``tensors`` and ``header`` changed its tensors and its
    header (metadata ``key``), with a matching tensor hash: only the reader's own checks can tell."""
    with safe_open(str(source), framework="pt") as handle:
        described = json.loads(handle.metadata()[key])
        arrays = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    described.pop(HASH_KEY)
    tensors(arrays)
    header(described)
    write_tensor_file(path, arrays, key, described)
    return path


def kmeans4_centroids(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    """A tensor rewrite applying ``change`` to every layer's centroids of the 4-bucket k-means state."""

    def rewrite(tensors: dict[str, torch.Tensor]) -> None:
        for name in [n for n in tensors if n.startswith("kmeans[buckets=4,") and n.endswith(".centroids")]:
            tensors[name] = change(tensors[name]).contiguous()

    return rewrite


STATE_CASES = {
    "state without a format version": (
        "state",
        "predictors",
        {"header": lambda h: h.pop("format_version")},
        "no format_version in its header: written by an older or foreign tool (this reader reads version 1); "
        "re-run cluster",
    ),
    "state of another rank": (
        "state",
        "predictors",
        {"tensors": kmeans4_centroids(lambda c: c[..., :3])},
        f"/layer0.centroids has shape ({HEADS}, 4, 3); kmeans(buckets=4, top_k=1, iterations=5, "
        f"max_points_per_centroid=None, backend=sklearn) with {HEADS} heads and rank-4 projections needs "
        f"({HEADS}, 4, 4); re-run cluster",
    ),
    "state of another bucket count": (
        "state",
        "predictors",
        {"tensors": kmeans4_centroids(lambda c: torch.cat([c, c], dim=1))},
        f"/layer0.centroids has shape ({HEADS}, 8, 4); ",
    ),
    "projections without a format version": (
        "projections",
        "projections",
        {"header": lambda h: h.pop("format_version")},
        "no format_version in its header: written by an older or foreign tool (this reader reads version 1); "
        "re-run the project stage",
    ),
}


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_configure_refuses_a_state_or_projections_that_do_not_fit(fitted, tmp_path: Path, case: str) -> None:  # noqa: F811
    artifact, key, changes, message = STATE_CASES[case]
    path = rewrite_tensor_file(fitted[artifact], tmp_path / f"{artifact}.safetensors", key, **changes)
    out = tmp_path / "configured"
    args = configure({**fitted, artifact: path}, out, "--method", "kmeans", "--knob", "buckets=4")
    line = assert_refused(run_module("pipeline", *args), message)
    assert line.startswith(f"error: {path}: ")
    assert not out.exists()


def test_evaluate_reads_the_state_against_the_store_and_the_projections(fitted, tmp_path: Path) -> None:  # noqa: F811
    """What ``evaluate`` calls with its graph store's shape and its projections' ranks."""
    origin = Origin(None, LAYERS, HEADS, HEAD_DIM, "the graph store x")
    ranks = dict.fromkeys(range(LAYERS), 4)
    assert {p.name for p in load_states(fitted["state"], origin, ranks=ranks)} == {"kmeans", "indexer"}
    _, key, changes, message = STATE_CASES["state of another rank"]
    path = rewrite_tensor_file(fitted["state"], tmp_path / "state.safetensors", key, **changes)
    with pytest.raises(UserError) as raised:
        load_states(path, origin, ranks=ranks)
    assert str(raised.value).startswith(f"{path}: kmeans[buckets=4,") and message in str(raised.value)


# ----------------------------------------------------------------------------------------------------------
# a teacher with NaN weights


def test_extract_names_the_layer_of_a_teacher_with_a_nan_weight(teacher, dataset, tmp_path: Path) -> None:
    model, tokenizer, folder = teacher
    broken = copy.deepcopy(model)  # the session's teacher stays whole
    with torch.no_grad():
        broken.model.decoder.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
    out = tmp_path / "graphs"
    with pytest.raises(UserError) as raised:
        extract_graphs(
            broken,
            tokenizer,
            dataset,
            out,
            fingerprint=teacher_fingerprint(model, folder),
            split="train",
            kinds=("decoder_self", "cross"),
            min_length=4,
        )
    assert str(raised.value) == (
        f"teacher {folder}: the attention scores are not finite in layer 1 (decoder self-attention): the "
        "model's weights or inputs hold NaN or infinite values (a corrupt or diverged checkpoint)"
    )
    assert not out.exists() and not list(tmp_path.iterdir())  # no store, no temporary left


def test_non_finite_weights_are_named_by_tensor(teacher) -> None:
    """:func:`require_finite_tensors`, for loaders: the first tensor holding NaN or Inf, by name."""
    model, _, folder = teacher
    state = dict(model.state_dict())
    require_finite_tensors(state, str(folder))
    name = "model.encoder.layers.1.fc1.weight"
    state[name] = state[name].clone()
    state[name][0, 0] = float("inf")
    with pytest.raises(UserError) as raised:
        require_finite_tensors(state, str(folder))
    assert str(raised.value) == (
        f"{folder}: {name} holds NaN or infinite values (a corrupt or diverged checkpoint); re-run the stage "
        "that wrote it"
    )


def test_load_model_refuses_nan_weights_behind_a_rewritten_manifest(teacher, tmp_path: Path) -> None:
    """A NaN edited into model.safetensors, with the manifest's sha256 rewritten to match: the hash check
    passes, and :func:`load_model` still refuses the weights, naming the tensor."""
    from safetensors.torch import load_file, save_file

    from pipeline.attention.loading import load_model

    _, _, folder = teacher
    forged = tmp_path / "teacher"
    forged.mkdir()
    for path in Path(folder).iterdir():
        forged.joinpath(path.name).write_bytes(path.read_bytes())
    weights = forged / "model.safetensors"
    state = load_file(weights)
    name = "model.decoder.layers.1.self_attn.q_proj.weight"
    state[name][0, 0] = float("nan")
    save_file(state, weights, metadata={"format": "pt"})
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = manifest["model_sha256"] = file_sha256(weights)
    (forged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError) as raised:
        load_model(forged)
    assert str(raised.value) == (
        f"{forged}: {name} holds NaN or infinite values (a corrupt or diverged checkpoint); re-run the stage "
        "that wrote it"
    )
