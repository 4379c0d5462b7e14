"""The graph a predictor is scored on is exactly the set the kernel attends for the same bucket ids."""

import pytest
import torch

from attention_kernels import bucketed
from attention_kernels.attended import pattern_pairs, valid_pairs
from pipeline.predictors import DistancePredictor, HeadInputs, Prediction, predicted_graph


def kernel_attended(q_buckets, k_buckets, *, causal, window, global_tokens) -> torch.Tensor:
    """(b, h, n, m) pairs ``attention_kernels.bucketed.bucketed_attention`` gives weight, read off its output.

    With softmax every attended pair gets a positive weight, and with v = the identity over keys the output
    row of query i is its weight vector, so the nonzero cells are the attended set the kernel computed.
    """
    b, h, n, _ = q_buckets.shape
    m = k_buckets.shape[2]
    q = torch.zeros(b, h, n, m, dtype=torch.float64)  # equal scores: every weight is 1/|A_i| > 0
    k = torch.zeros(b, h, m, m, dtype=torch.float64)
    v = torch.eye(m, dtype=torch.float64).expand(b, h, m, m)
    out = bucketed.bucketed_attention(
        q, k, v, q_buckets, k_buckets, alpha=1.0, causal=causal, window=window, global_tokens=global_tokens
    )
    return out > 0


def padded_buckets(lengths, n, h, t, n_buckets, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (b, h, n, t) in [−1, n_buckets) with −1 on right padding, and the (b, n) valid mask."""
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(-1, n_buckets, (len(lengths), h, n, t), generator=gen, dtype=torch.int32)
    return ids.masked_fill(~valid[:, None, :, None], -1), valid


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("n", "t"), [(1, 1), (17, 2), (33, 3), (97, 1)])
@pytest.mark.parametrize(("window", "global_tokens"), [(0, 0), (1, 0), (3, 1), (7, 2)])
def test_bucket_graph_is_the_kernel_attended_set(causal, n, t, window, global_tokens):
    gen = torch.Generator().manual_seed(n * 10 + t)
    lengths = [n, max(1, n - 5), max(1, n // 2)]
    q_buckets, q_valid = padded_buckets(lengths, n, 2, t, 4, gen)
    k_buckets, k_valid = padded_buckets(lengths, n, 2, t, 4, gen)
    graph = predicted_graph(
        Prediction(q_buckets=q_buckets, k_buckets=k_buckets),
        q_valid,
        k_valid,
        causal=causal,
        window=window,
        global_tokens=global_tokens,
    )
    pattern = {"window": window, "global_tokens": global_tokens}
    attended = kernel_attended(q_buckets, k_buckets, causal=causal, **pattern)
    valid = valid_pairs(q_valid, k_valid, causal=causal)[:, None]
    assert torch.equal(graph, attended & valid)


@pytest.mark.parametrize("causal", [True, False])
def test_mask_graph_is_union_then_valid(causal):
    gen = torch.Generator().manual_seed(0)
    n, r = 9, 3
    q_valid = torch.arange(n)[None, :] < torch.tensor([[n], [6]])
    inputs = HeadInputs(
        q=torch.zeros(2, 2, n, 4),
        k=torch.zeros(2, 2, n, 4),
        q_valid=q_valid,
        k_valid=q_valid,
        causal=causal,
        q_proj=torch.randn(2, 2, n, r, generator=gen),
        k_proj=torch.randn(2, 2, n, r, generator=gen),
    )
    predictor = DistancePredictor(threshold=1.5)
    graph = predicted_graph(
        predictor.predict(0, inputs), q_valid, q_valid, causal=causal, window=3, global_tokens=1
    )
    near = torch.cdist(inputs.q_proj, inputs.k_proj) <= 1.5
    pattern = pattern_pairs(n, n, window=3, global_tokens=1)
    assert torch.equal(graph, (near | pattern) & valid_pairs(q_valid, q_valid, causal=causal)[:, None])
