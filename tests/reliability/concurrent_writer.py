"""A writer process for the concurrency tests of :mod:`pipeline.atomic`.

It lives apart from the tests so that each spawned process imports this module and the writer alone, not
the test module's torch and transformers.
"""

from __future__ import annotations

from multiprocessing.synchronize import Barrier

from pipeline import atomic


def write_folders(target: str, writer: int, writes: int, exchange: bool, start: Barrier) -> None:
    """``writes`` times, write the folder ``target`` holding files a and b with one token per write;
    without ``exchange``, as where the C library or the filesystem cannot exchange two paths."""
    if not exchange:
        atomic._renameat2 = None
    start.wait()  # every writer starts at once
    for write in range(writes):
        token = f"writer {writer} write {write}"
        with atomic.atomic_path(target, directory=True) as tmp:
            (tmp / "a").write_text(token)
            (tmp / "b").write_text(token)
