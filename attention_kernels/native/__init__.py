"""The project's C++ kernels, compiled on first use for the processor they run on and loaded with ctypes.

A kernel is one C++ file beside this module with ``extern "C"`` functions on raw pointers, which may include
the headers beside it: no Python or torch headers, so it compiles in about a second with the system's C++
compiler (the one TorchInductor's CPU backend needs already). The shared library lands in a cache folder
(``$SPARSEFINDER_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/sparsefinder-native``, else
``~/.cache/sparsefinder-native``) under a name that hashes the source, the headers, the compiler, the flags
and the processor, so an edit, another compiler or another machine sharing
the folder gets its own build; it is written under a temporary name and renamed into place, so processes
that build at once never load half a file. Beside ``NAME-KEY.so`` the builder writes ``NAME-KEY.json``, the
full hash of what the key covers and the library's sha256: a library is loaded only when that record matches
both, and the folder and both files are the user's own and writable by nobody else; anything else (a
planted, truncated or foreign file) is rebuilt, never loaded. Where no library can be built or trusted (no
compiler, a read-only cache, a cache others may write to), :func:`library` warns once and returns None, and
callers run their PyTorch reference instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC")
"""-march=native: the vector width of the machine that runs it (the cache key names the processor)."""


def cache_folder() -> Path:
    """Where built libraries are kept."""
    if "SPARSEFINDER_NATIVE_CACHE" in os.environ:
        return Path(os.environ["SPARSEFINDER_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sparsefinder-native"


def _cpuinfo() -> list[str]:
    """The lines of /proc/cpuinfo (Linux); none elsewhere."""
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _processor() -> str:
    """The processor's model and features (Linux), else the architecture: -march=native code may use any
    feature of the machine that built it."""
    features = ("model name", "flags", "Features", "CPU part")
    described = {line for line in _cpuinfo() if line.startswith(features)}
    return "\n".join(sorted(described)) or platform.machine()


def processor_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what the platform module knows of it."""
    for line in _cpuinfo():
        if line.startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _private_folder(folder: Path) -> None:
    """Create the cache ``folder`` (mode 700) or check the one there: the user's own, writable by nobody
    else, or another user could swap a library between its check and its loading (an OSError)."""
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(
            f"the kernel cache {folder} is not yours alone (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}); make it your own and run chmod go-w on it, or set "
            "SPARSEFINDER_NATIVE_CACHE to a folder of your own"
        )


def _own_file(path: Path) -> bool:
    """``path`` is a regular file (not a link) of this user that nobody else may write."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not writable


def _sha256(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _verified(target: Path, record: Path, key: str) -> bool:
    """The library ``target`` is the build its ``record`` describes, for these sources (``key``)."""
    if not (_own_file(target) and _own_file(record)):
        return False
    try:
        recorded = json.loads(record.read_text())
    except (ValueError, OSError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("key") == key
        and recorded.get("sha256") == _sha256(target)
    )


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` atomically: a temporary file beside it, given ``mode``, renamed into place."""
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(partial, mode)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _build(source: Path, compiler: str, target: Path, record: Path, key: str) -> None:
    """Compile ``source`` into the shared library ``target`` and write its ``record`` (``key`` and the
    library's sha256), each atomically; the record first, so a reader never trusts a library by an older
    record."""
    handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=".so")
    os.close(handle)
    try:
        subprocess.run(
            [compiler, *FLAGS, str(source), "-o", partial], check=True, capture_output=True, text=True
        )
        os.chmod(partial, 0o755)  # whatever the umask: a library others may write is never trusted
        described = {"key": key, "sha256": _sha256(partial), "compiler": compiler, "flags": list(FLAGS)}
        _write_private(record, (json.dumps(described, indent=2) + "\n").encode(), 0o644)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def cache_entry(name: str, compiler: str) -> tuple[Path, Path, str]:
    """(library, record, key) of ``attention_kernels/native/<name>.cpp`` built with ``compiler``: the key
    hashes the source, the headers beside it, the compiler, the flags and the processor; the file names hold
    its first 16 digits."""
    source = Path(__file__).with_name(f"{name}.cpp")
    headers = [path.read_bytes() for path in sorted(source.parent.glob("*.h"))]
    described = [compiler.encode(), " ".join(FLAGS).encode(), _processor().encode()]
    key = hashlib.sha256(b"\0".join([source.read_bytes(), *headers, *described])).hexdigest()
    target = cache_folder() / f"{name}-{key[:16]}.so"
    return target, target.with_suffix(".json"), key


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """The compiled ``attention_kernels/native/<name>.cpp``, built once per source, compiler and processor and
    loaded only when its record vouches for it (:func:`_verified`, once per process); None (with one warning)
    where it cannot be built, trusted or loaded."""
    source = Path(__file__).with_name(f"{name}.cpp")
    compiler = os.environ.get("CXX") or "c++"
    target, record, key = cache_entry(name, compiler)
    try:
        _private_folder(target.parent)
        if not _verified(target, record, key):
            if shutil.which(compiler) is None:
                raise OSError(f"no C++ compiler {compiler!r} on PATH (set CXX)")
            _build(source, compiler, target, record, key)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError) as err:
        if isinstance(err, subprocess.CalledProcessError):  # the compiler's last words, if it said any
            detail = f"{compiler} exited with status {err.returncode}: {err.stderr.strip()[-300:]}"
        else:
            detail = str(err)
        message = f"the C++ kernel {name} could not be built or loaded, its PyTorch reference runs instead"
        warnings.warn(f"{message}: {detail}", stacklevel=2)
        return None


def wide(kernel: ctypes.CDLL | None, min_bytes: int) -> ctypes.CDLL | None:
    """``kernel`` where it was built for vectors of at least ``min_bytes`` with fused multiply-add
    (``vector_bytes`` of attention_kernels/native/vectors.h: 64 with AVX-512, 32 with AVX2), else None:
    elsewhere its register tiles would spill, and the tensor reference is as fast."""
    return kernel if kernel is not None and kernel.vector_bytes() >= min_bytes else None


def _argument(value: torch.Tensor | int | float | None) -> ctypes.c_void_p | ctypes.c_int64 | ctypes.c_double:
    """A tensor by address (contiguous; None as a null pointer), an int as int64, a float as double."""
    if value is None or isinstance(value, torch.Tensor):
        if value is not None and not value.is_contiguous():
            raise ValueError("the C++ kernels read tensors as contiguous memory; got a strided one")
        return ctypes.c_void_p(None if value is None else value.data_ptr())
    return ctypes.c_double(value) if isinstance(value, float) else ctypes.c_int64(value)


def call(kernel: ctypes.CDLL, name: str, *args: torch.Tensor | int | float | None) -> None:
    """The kernel's function ``name`` on ``args`` (see :func:`_argument`) and torch's thread count. Its
    status (no exception may cross into C): 0 done, −1 out of memory (a MemoryError), any other a refusal of
    its arguments (a ValueError)."""
    status = getattr(kernel, name)(*map(_argument, args), ctypes.c_int(torch.get_num_threads()))
    if status == -1:
        raise MemoryError(f"{name} ran out of memory")
    if status != 0:
        raise ValueError(
            f"{name} refused its arguments (status {status}; see attention_kernels/native/*.cpp)"
        )
