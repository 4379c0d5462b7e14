"""Kernel tests run the Triton code itself: through the CPU interpreter when no GPU is present.

The interpreter is chosen when ``triton.jit`` decorates a kernel, so the variable must be set before any
kernel module is imported.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny shapes: intra-op threads only add synchronisation (badly so on a busy machine). Modules opt in
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
