"""Keep freed memory for reuse, so that a kernel's large temporaries do not cost page faults at every call.

On Linux, PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves a block above its mmap
threshold with a fresh mapping (the threshold starts at 128 KiB and rises with the blocks freed, up to
32 MiB) and hands the top of its heap back to the system once more than the trim threshold lies free
there. An attention call whose temporaries are megabytes (gathered queries, keys and values, scores,
outputs) thus touches new pages at every call: one page fault per 4 KiB, which on one thread costs about as
much as the gather that fills them. :func:`keep_freed_memory` sets, through ``mallopt(3)``,

    M_MMAP_THRESHOLD = 32 MiB   (glibc's largest: blocks up to it are served from the heap),
    M_TRIM_THRESHOLD = 1 GiB    (freed heap is kept for the next call),

which is what PyTorch's performance guide obtains by preloading jemalloc or tcmalloc, without either. The
price: a process keeps up to 1 GiB of freed heap resident. The pipeline's stage processes and benchmarks
call it once at start; a program of one's own may too. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for reuse (module docstring); True when both settings took effect,
    False where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    # mallopt returns 1 on success
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
