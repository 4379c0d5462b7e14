"""Huge pages are advised for the whole 2 MiB pages inside a large fresh tensor, and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attention_kernels.bucketed import huge_pages
from attention_kernels.bucketed.huge_pages import HUGE_PAGE, LARGE, advise_huge_pages, empty_large

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists(), reason="needs Linux with transparent huge pages")
def test_a_large_tensor_gets_its_whole_huge_pages_advised():
    x = empty_large(3 * LARGE // 4 + 5, like=torch.zeros(1, dtype=torch.float64))  # 48 MiB and a bit
    size = x.numel() * x.element_size()
    assert x.dtype == torch.float64 and size > LARGE
    assert size - 2 * HUGE_PAGE < advise_huge_pages(x) <= size  # again: the advice is idempotent
    x.fill_(0.5)  # the memory behaves as any other
    assert x.sum().item() == 0.5 * x.numel()


def test_small_tensors_and_other_systems_are_left_alone(monkeypatch):
    assert advise_huge_pages(torch.empty(LARGE // 4 - 1)) == 0  # just under 32 MiB of float32
    monkeypatch.setattr(huge_pages.platform, "system", lambda: "Darwin")
    huge_pages._madvise.cache_clear()
    try:
        assert advise_huge_pages(torch.empty(LARGE // 4 + HUGE_PAGE)) == 0
    finally:
        huge_pages._madvise.cache_clear()
