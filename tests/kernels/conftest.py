"""Kernel tests run the Triton code itself: through the CPU interpreter when no GPU is present.

The interpreter is chosen when ``triton.jit`` decorates a kernel, so the variable must be set before any
kernel module is imported.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attention_kernels.bucketed import torch_path  # after the interpreter's variable


@pytest.fixture(autouse=True)
def blocks_at_every_length(monkeypatch):
    """The PyTorch path's blocks at every length: the small shapes of these tests would otherwise take its
    dense computation of short rows, which tests of that path switch back on."""
    monkeypatch.setattr(torch_path, "SHORT_KEYS", 0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny shapes: intra-op threads only add synchronisation (badly so on a busy machine). Modules opt in
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fused_plans(monkeypatch):
    """The plans the PyTorch path hands to the fused kernel, one per call (the kernel still runs)."""
    plans = []
    original = torch_path.block_attention
    monkeypatch.setattr(torch_path, "block_attention", lambda *args: plans.append(args[3]) or original(*args))
    return plans


@pytest.fixture
def slots_at_any_share(monkeypatch):
    """The fused kernel takes a pattern's slots however many they are beside the block rows: these tests'
    small shapes have short rows, where the rule would send the pattern to the spread rows."""
    from attention_kernels.bucketed import band_keys

    monkeypatch.setattr(band_keys, "SLOT_SHARE", float("inf"))
