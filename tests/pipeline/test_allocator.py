"""Keeping freed memory: the temporaries of a kernel's forward and backward stop page-faulting (counted by
the OS, not timed)."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.allocator import keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]

# Eighteen steps of forward and backward through causal softmax bucketed attention at n = 2048 (4 heads, d 32,
# 8 buckets, a window of 17 and a global token): every block's probabilities are kept for the backward and,
# with the gradients' temporaries, freed together at the step's end. Prints the minor page faults of each of
# the last ten steps; with argument 1 it keeps freed memory first.
PROGRAM = """
import resource, sys, torch
from attention_kernels.bucketed import bucketed_attention
from pipeline.allocator import keep_freed_memory
from benchmarks.attention import balanced_buckets
if sys.argv[1] == "1":
    assert keep_freed_memory()
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 2048, 32, generator=g).requires_grad_() for _ in range(3))
ids = balanced_buckets(1, 4, 2048, 8, 1, seed=0)
for step in range(18):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    q.grad = k.grad = v.grad = None
    opts = dict(alpha=1.0, causal=True, window=17, global_tokens=1, backend="torch")
    bucketed_attention(q, k, v, ids, ids, **opts).sum().backward()
    if step >= 8:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(keep: bool) -> int:
    """The median of the last ten steps' page faults: without keeping, one step now and then finds its memory
    still there (glibc trims the heap only when its top is free); with it, the heap still grows now and then
    while its free blocks settle (100-1,100 faults in up to half of the first ten steps, measured; from the
    eighth step on in at most two of ten, none in the others)."""
    run = subprocess.run(
        [sys.executable, "-c", PROGRAM, "1" if keep else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = sorted(int(x) for x in run.stdout.split()[-10:])
    return steps[len(steps) // 2]


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)
def test_kept_memory_is_reused_without_page_faults():
    default, kept = page_faults(keep=False), page_faults(keep=True)
    assert default > 500  # the steps' temporaries land on fresh pages (1,000-3,000 a step measured)
    assert kept < default // 10  # and once kept, on reused ones (0 measured)


def test_elsewhere_it_does_nothing(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert keep_freed_memory() is False
