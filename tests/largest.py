"""The largest tensor any operation produces while a block runs: how tests prove that nothing n × n is built.

Counting elements instead of timing or reading allocator statistics keeps the check exact and the same on
every machine: a path that is sub-quadratic never creates a tensor with as many elements as n², however
the allocator reuses its memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _LargestOutput(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.numel = 0
        self.op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.numel() > self.numel:
                self.numel, self.op = leaf.numel(), str(func)
        return out


@contextmanager
def largest_tensor() -> Iterator[_LargestOutput]:
    """Within the block, ``.numel`` holds the element count of the largest tensor any aten operation returned
    (forward and backward alike) and ``.op`` the operation that returned it."""
    mode = _LargestOutput()
    with mode:
        yield mode
