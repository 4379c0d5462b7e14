"""The Triton plan (``attention_kernels.bucketed.triton_plan``) against the same plan written as plain
PyTorch ops: sorted entries, their tokens, buckets and ranks, the output rows of every (token, slot), the
valid counts, and each block's entry range from ``torch.searchsorted`` (cut at the block's own positions
when causal). Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, conftest);
with one, on CUDA tensors, with a case at n = 16384."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.bucketed.triton_plan import INT32_MAX, INT64_MAX, bucket_ranges, build_side

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# ----------------------------------------------------------------------------------- the PyTorch oracle


def side_oracle(buckets: torch.Tensor, none: int, pattern: bool) -> dict[str, torch.Tensor]:
    """Every field of :class:`Side` from plain PyTorch ops on ``buckets`` (BH, L, T)."""
    bh, length, t = buckets.shape
    ids = torch.where(buckets >= 0, buckets, INT32_MAX).sort(-1).values
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[..., 1:] = ids[..., 1:] == ids[..., :-1]
    ids = torch.where(repeat, INT32_MAX, ids).sort(-1).values
    valid = ids != INT32_MAX
    pos = torch.arange(length, device=buckets.device)
    key = torch.where(valid, ids.long() * length + pos[:, None], INT64_MAX).flatten(1)
    key, order = key.sort(-1)
    ok = key != INT64_MAX
    bucket = torch.where(ok, key // length, INT64_MAX)
    n_entries = length * t
    n_out = n_entries + (length if pattern else 0) + 1
    entry = torch.arange(n_entries, device=buckets.device).expand(bh, -1)
    inverse = torch.empty_like(order).scatter_(1, order, entry)
    parts = [torch.where(valid, inverse.view(bh, length, t), n_out - 1)]
    if pattern:
        parts.append((n_entries + pos).expand(bh, length)[..., None])
    return {
        "ids": torch.where(valid, ids, none).int(),
        "tok": (order // t).int(),
        "bkt": torch.where(ok, bucket, none).int(),
        "rank": (order % t).int(),
        "bucket_key": bucket,
        "count": ok.sum(-1, keepdim=True),
        "gather": torch.cat(parts, -1) + torch.arange(bh, device=buckets.device)[:, None, None] * n_out,
    }


def ranges_oracle(rows, cols, block: int, col_block: int, causal: bool, key_major: bool) -> torch.Tensor:
    """Each block's [lo, hi) by ``torch.searchsorted``."""
    n_entries = rows.bucket_key.shape[1]
    starts = torch.arange(0, n_entries, block, device=rows.tok.device)
    last = torch.minimum(starts + block - 1, rows.count - 1).clamp_min(0)
    lo = torch.searchsorted(cols.bucket_key, rows.bucket_key[:, starts].contiguous())
    hi = torch.searchsorted(cols.bucket_key, rows.bucket_key.gather(1, last), right=True)
    if causal:
        span = max(rows.ids.shape[1], cols.ids.shape[1])
        row_key, col_key = (
            torch.where(side.bucket_key != INT64_MAX, side.bucket_key * span + side.tok, INT64_MAX)
            for side in (rows, cols)
        )
        if key_major:
            first = torch.searchsorted(col_key, row_key[:, starts].contiguous())
            lo = lo + (first - lo) // col_block * col_block
        else:
            hi = torch.searchsorted(col_key, row_key.gather(1, last), right=True)
    empty = starts >= rows.count
    return torch.stack([lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)], -1).int()


# ----------------------------------------------------------------------------------------------- tests

CASES = {  # (BH, L, T, highest id): repeats, missing ids, empty rows and several blocks among them
    "T1": (3, 70, 1, 5),
    "T2": (2, 97, 2, 4),
    "T3 repeats": (2, 61, 3, 2),
    "T1 long": (1, 2100, 1, 16),
    **({"T1 16k": (8, 16384, 1, 16), "T2 16k": (8, 16384, 2, 16)} if DEVICE == "cuda" else {}),
}


def _buckets(bh: int, length: int, t: int, high: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, high, (bh, length, t), generator=gen, dtype=torch.int32)
    ids[0, : length // 3] = -1  # a run of tokens without any bucket
    if bh > 2:
        ids[2] = -1  # a row with no valid entry at all
    return ids.to(DEVICE)


@pytest.mark.parametrize("pattern", [False, True], ids=["buckets", "pattern"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sides_match_the_pytorch_plan(case: str, pattern: bool):
    bh, length, t, high = CASES[case]
    buckets = _buckets(bh, length, t, high, seed=length)
    for none in (-1, -2):
        side, expected = build_side(buckets, none, pattern), side_oracle(buckets, none, pattern)
        for name, value in expected.items():
            assert torch.equal(getattr(side, name), value), (name, none)
        assert side.n_out == length * t + (length if pattern else 0) + 1
        assert all(getattr(side, name).is_contiguous() for name in ("tok", "bkt", "rank", "bucket_key"))


@pytest.mark.parametrize("key_major", [False, True], ids=["query-major", "key-major"])
@pytest.mark.parametrize("causal", [False, True], ids=["open", "causal"])
@pytest.mark.parametrize(("n", "m", "t"), [(97, 61, 2), (61, 97, 1), (2100, 2100, 1)])
def test_block_ranges_match_searchsorted(n: int, m: int, t: int, causal: bool, key_major: bool):
    qs = build_side(_buckets(3, n, t, 6, seed=n), -1, False)
    ks = build_side(_buckets(3, m, t, 6, seed=m + 1), -2, False)
    rows, cols = (ks, qs) if key_major else (qs, ks)
    for block, col_block in ((16, 32), (64, 64)):
        got = bucket_ranges(rows, cols, block, col_block, causal=causal, key_major=key_major)
        assert torch.equal(got, ranges_oracle(rows, cols, block, col_block, causal, key_major))


def test_a_row_without_valid_ids_counts_none_and_sends_every_cell_to_the_neutral_row():
    buckets = torch.full((2, 40, 2), -1, dtype=torch.int32, device=DEVICE)
    buckets[1, ::3, 1] = 5  # the other row: every third token in bucket 5
    side = build_side(buckets, -2, True)
    assert side.count.flatten().tolist() == [0, 14]
    n_out = side.n_out
    assert (side.gather[0, :, :2] == n_out - 1).all()  # row 0: all bucket slots at its neutral row
    assert side.gather[0, :, 2].tolist() == [80 + t for t in range(40)]  # its pattern rows
    assert (side.bkt[0] == -2).all() and (side.bucket_key[0] == INT64_MAX).all()
    assert side.tok[1, :14].tolist() == list(range(0, 40, 3)) and (side.bkt[1, :14] == 5).all()
    ranges = bucket_ranges(side, side, 16, 16, causal=True, key_major=False)
    assert (ranges[0] == 0).all()  # no block of row 0 meets anything
