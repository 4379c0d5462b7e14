"""Huge pages for a large fresh CPU tensor: filling it then costs one page fault per 2 MiB, not one per 4 KiB.

glibc serves a block above 32 MiB (its largest mmap threshold, see ``pipeline/allocator.py``) with a fresh
mapping at every allocation, and Linux backs each 4 KiB page of it on first touch: for the 34 MB of scores of
8 heads × 4096 queries × 256 keys that is 8,300 faults, about as long as the matmul that fills them.
``madvise(MADV_HUGEPAGE)`` on the mapping before its first touch lets the kernel back it with 2 MiB pages
where transparent huge pages are enabled ("always" or "madvise" in
/sys/kernel/mm/transparent_hugepage/enabled). PyTorch does the same for every allocation when the process
starts with ``THP_MEM_ALLOC_ENABLE=1``; this asks it only for the tensors that need it, whatever the
environment. Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

import torch

HUGE_PAGE = 2**21
"""Bytes in a transparent huge page on x86-64 and arm64 with 4 KiB base pages."""

LARGE = 2**25
"""Tensors from this size up (glibc's largest mmap threshold, 32 MiB) are fresh mappings at every call."""

_MADV_HUGEPAGE = 14  # <sys/mman.h>


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    if platform.system() != "Linux":
        return None
    madvise = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def empty_large(*shape: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``like``'s dtype and device, its whole huge pages advised as such when it
    is large and on the CPU (:func:`advise_huge_pages`)."""
    out = like.new_empty(shape)
    advise_huge_pages(out)
    return out


def advise_huge_pages(tensor: torch.Tensor) -> int:
    """Advise huge pages for the whole 2 MiB pages inside a large CPU tensor not yet written; returns the
    bytes advised (0 for a small tensor, another device, another system, or where the advice fails)."""
    madvise = _madvise()
    size = tensor.numel() * tensor.element_size()
    if madvise is None or tensor.device.type != "cpu" or size < LARGE:
        return 0
    start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (tensor.data_ptr() + size) // HUGE_PAGE * HUGE_PAGE
    if end <= start or madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        return 0
    return end - start
