"""Bucket ids → mask: shared id ≥ 0, whatever the number of ids per token."""

import torch

from pipeline.predictors.buckets import buckets_to_mask


def test_buckets_to_mask_matches_loops():
    gen = torch.Generator().manual_seed(0)
    qb = torch.randint(-1, 4, (2, 2, 5, 3), generator=gen, dtype=torch.int32)
    kb = torch.randint(-1, 4, (2, 2, 6, 3), generator=gen, dtype=torch.int32)
    mask = buckets_to_mask(qb, kb)
    assert mask.shape == (2, 2, 5, 6)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                for j in range(6):
                    shared = {x for x in qb[b, h, i].tolist() if x >= 0} & set(kb[b, h, j].tolist())
                    assert mask[b, h, i, j].item() == bool(shared)


def test_none_never_matches_none():
    qb = torch.full((1, 1, 2, 2), -1, dtype=torch.int32)
    assert not buckets_to_mask(qb, qb).any()
