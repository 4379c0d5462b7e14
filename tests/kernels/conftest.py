"""Kernel tests run the Triton code itself: through the CPU interpreter when no GPU is present.

The interpreter is chosen when ``triton.jit`` decorates a kernel, so the variable must be set before any
kernel module is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
