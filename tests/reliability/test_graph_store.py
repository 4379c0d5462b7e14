"""A graph store verifies itself where it is read: every corruption is one line naming the file, exit 2.

Each case copies the micro store, damages the copy and checks what a reader sees: a bad manifest refuses
to open, a bad shard fails on first use, both as one :class:`UserError` line naming the file, and
``GraphStore.verify()`` (``inspect --check``) reports the same problem. Shards rewritten with a bad shape or
header get a matching sha256 and size in the manifest, so only the header checks can tell.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from pipeline.cli import main
from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.graphs import GraphStore
from pipeline.graphs.mmap import map_safetensors
from pipeline.graphs.store import MANIFEST, shard_name
from tests.stage_runner import run_module

ROOT = Path(__file__).resolve().parents[2]
SHARD_0, SHARD_1 = shard_name(0), shard_name(1)


def read_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest))


def edit_manifest(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A corruption applying ``change`` to the parsed manifest."""

    def corrupt(folder: Path) -> None:
        manifest = read_manifest(folder)
        change(manifest)
        write_manifest(folder, manifest)

    return corrupt


def reseal(folder: Path, index: int) -> None:
    """Make the manifest's bytes and sha256 agree with shard ``index`` as it now is."""
    path = folder / shard_name(index)
    manifest = read_manifest(folder)
    entry = manifest["shards"][index]
    manifest["counts"]["bytes"] += path.stat().st_size - entry["bytes"]
    entry.update(bytes=path.stat().st_size, sha256=file_sha256(path))
    write_manifest(folder, manifest)


def rewrite_shard(change: Callable[[dict[str, np.ndarray]], Any]) -> Callable[[Path], None]:
    """A corruption rewriting shard 1 with ``change`` applied to its arrays, resealed in the manifest."""

    def corrupt(folder: Path) -> None:
        path = folder / SHARD_1
        arrays = {name: np.array(view) for name, view in map_safetensors(path).items()}  # off the map
        change(arrays)
        safetensors.numpy.save_file(arrays, str(path))
        reseal(folder, 1)

    return corrupt


def flip_byte(folder: Path) -> None:
    path = folder / SHARD_1
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def truncate(folder: Path) -> None:
    path = folder / SHARD_1
    path.write_bytes(path.read_bytes()[:-100])


def garble_header(folder: Path) -> None:
    """Overwrite shard 1's JSON header (same length), resealed: only the header parser can tell."""
    path = folder / SHARD_1
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    raw[8 : 8 + header_len] = b"}" * header_len
    path.write_bytes(bytes(raw))
    reseal(folder, 1)


def move_outside(name: str) -> Callable[[Path], None]:
    """Replace ``name`` by a symlink to the same file, moved outside the store folder."""

    def corrupt(folder: Path) -> None:
        outside = folder.parent / f"outside-{name}"
        (folder / name).rename(outside)
        (folder / name).symlink_to(outside)

    return corrupt


def link_every_file(folder: Path) -> None:
    """Every file of the store moved out and replaced by a symlink to it, as DVC's symlink cache does."""
    for name in sorted(path.name for path in folder.iterdir()):
        move_outside(name)(folder)


def overlap(manifest: dict[str, Any]) -> None:
    manifest["shards"][1]["sentences"][0] -= 1


def drop_first_row(arrays: dict[str, np.ndarray]) -> None:
    arrays["cross.k"] = arrays["cross.k"][:, :, 1:]


def reverse_indptr(arrays: dict[str, np.ndarray]) -> None:
    arrays["decoder_self.indptr"] = arrays["decoder_self.indptr"][..., ::-1].copy()


@dataclass(frozen=True)
class Corruption:
    name: str
    corrupt: Callable[[Path], None]
    file: str  # the file the message must name
    message: str  # what it must say


CORRUPTIONS = [
    Corruption(
        "absolute path",
        edit_manifest(lambda m: m["shards"][0].update(file="/tmp/x.safetensors")),
        MANIFEST,
        "shards[0].file = '/tmp/x.safetensors': not a shard file name inside the store "
        "(allowed: shard-NNNNN.safetensors)",
    ),
    Corruption(
        "parent path",
        edit_manifest(lambda m: m["shards"][0].update(file="../../../etc/passwd")),
        MANIFEST,
        "shards[0].file = '../../../etc/passwd': not a shard file name inside the store",
    ),
    Corruption("missing key", edit_manifest(lambda m: m.pop("heads")), MANIFEST, "heads: Field required"),
    Corruption(
        "bad JSON", lambda folder: (folder / MANIFEST).write_text('{"format": '), MANIFEST, "not valid JSON"
    ),
    Corruption("mistyped key", edit_manifest(lambda m: m.update(layers="2")), MANIFEST, "layers = '2': "),
    Corruption(
        "unknown kind",
        edit_manifest(lambda m: m["attention_kinds"].__setitem__(0, "decoder")),
        MANIFEST,
        "attention_kinds[0] = 'decoder': unknown attention kind 'decoder'; allowed: decoder_self",
    ),
    Corruption(
        "kind definition",
        edit_manifest(lambda m: m["kinds"]["cross"].update(causal=True)),
        MANIFEST,
        "kinds.cross = {'causal': True, ",
    ),
    Corruption(
        "scaling not finite",
        edit_manifest(lambda m: m.update(scaling=float("nan"))),
        MANIFEST,
        "scaling = nan: Input should be a finite number",
    ),
    Corruption(
        "overlapping ranges",
        edit_manifest(overlap),
        MANIFEST,
        "shards[1].sentences = [3, ",
    ),
    Corruption(
        "counts off",
        edit_manifest(lambda m: m["counts"].update(sentences=m["counts"]["sentences"] + 1)),
        MANIFEST,
        ": the shards hold ",
    ),
    Corruption(
        "bytes off",
        edit_manifest(lambda m: m["shards"][1].update(bytes=m["shards"][1]["bytes"] + 1)),
        MANIFEST,
        "counts.bytes = ",
    ),
    Corruption(
        "heads off",
        edit_manifest(lambda m: m.update(heads=m["heads"] + 1)),
        SHARD_0,
        "expected float32 [2, 3, ",
    ),
    Corruption("flipped byte", flip_byte, SHARD_1, "sha256 mismatch"),
    Corruption("truncated shard", truncate, SHARD_1, "truncated ("),
    Corruption("corrupt header", garble_header, SHARD_1, "corrupt safetensors header (not valid JSON)"),
    Corruption("wrong shape", rewrite_shard(drop_first_row), SHARD_1, "tensor cross.k is float32 [2, 2, "),
    Corruption(
        "indptr decreasing",
        rewrite_shard(reverse_indptr),
        SHARD_1,
        "tensor decoder_self.indptr is not non-decreasing offsets",
    ),
    Corruption(
        "tensor missing",
        rewrite_shard(lambda a: a.pop("cross.probs")),
        SHARD_1,
        "(missing: ['cross.probs']; unexpected: [])",
    ),
]
CASES = {case.name: case for case in CORRUPTIONS}


def corrupted_copy(store: Path, where: Path, corrupt: Callable[[Path], None]) -> Path:
    """A copy of ``store`` at ``where/graphs``, damaged by ``corrupt``."""
    folder = where / "graphs"
    shutil.copytree(store, folder)
    corrupt(folder)
    return folder


@pytest.mark.parametrize("case", CORRUPTIONS, ids=lambda case: case.name)
def test_corruption_is_one_line_naming_the_file(micro_store: Path, tmp_path: Path, case: Corruption) -> None:
    assert len(read_manifest(micro_store)["shards"]) >= 2
    folder = corrupted_copy(micro_store, tmp_path, case.corrupt)
    with pytest.raises(UserError) as raised:
        GraphStore(folder).sentence_ids()  # opening reads the manifest; this reads every shard
    message = str(raised.value)
    assert str(folder / case.file) in message and case.message in message and "\n" not in message
    if case.file != MANIFEST:  # a bad manifest refuses to open, so there is nothing to verify
        problems = GraphStore(folder).verify()
        assert problems[0].startswith(f"{case.file}: ") and case.message in problems[0]


def test_a_store_of_symlinks_into_a_cache_opens_and_verifies(micro_store: Path, tmp_path: Path) -> None:
    """DVC's symlink cache type turns every file of a store into a link to elsewhere: that is no attack
    (the manifest names only bare shard names; sha256 vouches for what they hold), so it must work."""
    folder = corrupted_copy(micro_store, tmp_path, link_every_file)
    assert all(path.is_symlink() for path in folder.iterdir())
    assert GraphStore(folder).verify() == []
    assert len(GraphStore(folder).sentence_ids()) == len(GraphStore(micro_store))


def test_verify_checks_the_counts(micro_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tokens = read_manifest(micro_store)["counts"]["tokens"]["target"]
    tokens_off = edit_manifest(lambda m: m["counts"]["tokens"].update(target=tokens + 1))
    folder = corrupted_copy(micro_store, tmp_path, tokens_off)
    (problem,) = GraphStore(folder).verify()
    assert problem == f"{MANIFEST}: counts.tokens.target = {tokens + 1}: the shards hold {tokens}"
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(folder), "--check"])
    assert exit_info.value.code == 2 and problem in capsys.readouterr().err


def test_shards_are_hashed_once_per_process(micro_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many stores over one folder hash each shard once; ``verify`` always hashes afresh."""
    hashed: list[Path] = []
    monkeypatch.setattr("pipeline.fingerprint.file_sha256", lambda p: hashed.append(p) or file_sha256(p))
    monkeypatch.setattr("pipeline.fingerprint._DIGESTS", {})
    shards = len(read_manifest(micro_store)["shards"])
    for _ in range(3):
        GraphStore(micro_store).sentence_ids()
    assert len(hashed) == shards
    assert GraphStore(micro_store).verify() == [] and len(hashed) == 2 * shards


def test_cli_check_is_one_line_and_exit_2(micro_store: Path, tmp_path: Path) -> None:
    """``python -m pipeline inspect COPY --check``: exit 2, one ``error:`` line, no traceback."""
    for i, name in enumerate(("absolute path", "corrupt header")):
        case = CASES[name]
        folder = corrupted_copy(micro_store, tmp_path / str(i), case.corrupt)
        result = run_module("pipeline", "inspect", str(folder), "--check", cwd=ROOT)
        err = result.stderr
        assert result.returncode == 2, err
        assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err
        assert case.message in err and case.file in err
