"""The sub-quadratic PyTorch path against the dense reference in ``attention_kernels/bucketed/reference.py``.

Tolerances are derived, not guessed: the PyTorch path and the reference, both run in the test dtype, are
compared with a float64 evaluation of the same (rounded) inputs, and the PyTorch path may deviate by at most
``ERROR_FACTOR`` times the reference's own deviation, plus one unit of the dtype's precision for the final
rounding of the output.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from entmax import entmax15, sparsemax
from torch.utils._python_dispatch import TorchDispatchMode

from attention_kernels.attended import window_radius
from attention_kernels.bucketed import bucketed_attention, torch_path
from attention_kernels.bucketed.exact_entmax import exact_entmax
from attention_kernels.bucketed.planning import BlockPlan, attended
from attention_kernels.bucketed.reference import attended_mask, dense_bucketed_attention
from attention_kernels.bucketed.torch_path import _normalise, _SpreadRows, plan_attention
from attention_kernels.entmax.dense import entmax_normalize
from attention_kernels.entmax.gradient import entmax_gradient_weight

# the PyTorch path through the public entry, which turns the window size into the band radius
torch_bucketed_attention = functools.partial(bucketed_attention, backend="torch")

# Both paths normalise in fp32 but sum in different orders; measured ratios stay below 2.
ERROR_FACTOR = 4.0


pytestmark = pytest.mark.usefixtures("one_thread")


ALPHAS = (1.0, 1.5, 2.0)
PATTERNS = {
    "none": {},
    "window+global": {"window": 7, "global_tokens": 2},
    # a band wide enough that the global keys lead its blocks' columns
    "wide-window+global": {"window": 33, "global_tokens": 3},
}


def make_inputs(
    n: int, d: int, t: int, *, seed: int, dtype=torch.float32, m: int | None = None, buckets: int = 7
) -> tuple[torch.Tensor, ...]:
    """q, k, v (2, 2, n|m, d) and bucket ids (2, 2, n|m, t) in [−1, buckets)."""
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = torch.randn(2, 2, n, d, generator=gen).to(dtype)
    k = torch.randn(2, 2, m, d, generator=gen).to(dtype)
    v = torch.randn(2, 2, m, d, generator=gen).to(dtype)
    qb = torch.randint(-1, buckets, (2, 2, n, t), generator=gen, dtype=torch.int32)
    kb = torch.randint(-1, buckets, (2, 2, m, t), generator=gen, dtype=torch.int32)
    return q, k, v, qb, kb


def dense64(q, k, v, qb, kb, *, alpha, causal=False, window=0, global_tokens=0) -> torch.Tensor:
    """Float64 ground truth: the reference mask and normaliser on float64 scores."""
    mask = attended_mask(qb, kb, causal=causal, window=window, global_tokens=global_tokens)
    scores = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    return entmax_normalize(scores.masked_fill(~mask, float("-inf")), alpha) @ v.double()


def assert_close_to_truth(
    ours: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, *, terms: float = 1.0
) -> None:
    """Our deviation from float64 is at most ERROR_FACTOR × the reference's, plus one rounding of the output
    or of the ``terms`` it is a difference of (a gradient that cancels to 0 keeps their rounding, which a
    reference that cancels exactly does not show)."""
    assert ours.dtype == ref.dtype
    assert torch.isfinite(ours).all()
    err_ours = (ours.double() - truth).abs().max().item()
    err_ref = (ref.double() - truth).abs().max().item()
    rounding = torch.finfo(ours.dtype).eps * max(1.0, terms, truth.abs().max().item())
    assert err_ours <= ERROR_FACTOR * err_ref + rounding, (err_ours, err_ref)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("n", [1, 17, 97, 130, 257])
def test_forward_fp32_matches_reference(n, d, t, alpha, causal, pattern):
    q, k, v, qb, kb = make_inputs(n, d, t, seed=n * 1000 + d * 10 + t)
    opts = dict(alpha=alpha, causal=causal, **PATTERNS[pattern])
    assert_close_to_truth(
        torch_bucketed_attention(q, k, v, qb, kb, **opts),
        dense_bucketed_attention(q, k, v, qb, kb, **opts),
        dense64(q, k, v, qb, kb, **opts),
    )


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("n", [17, 130, 257])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_low_precision_matches_reference(dtype, n, alpha, causal, pattern):
    q, k, v, qb, kb = make_inputs(n, 64, 2, seed=n, dtype=dtype)
    opts = dict(alpha=alpha, causal=causal, **PATTERNS[pattern])
    assert_close_to_truth(
        torch_bucketed_attention(q, k, v, qb, kb, **opts),
        dense_bucketed_attention(q, k, v, qb, kb, **opts),
        dense64(q, k, v, qb, kb, **opts),
    )


@pytest.mark.parametrize(("n", "m"), [(17, 40), (130, 65)])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_cross_attention_matches_reference(n, m, alpha):
    q, k, v, qb, kb = make_inputs(n, 32, 3, seed=n + m, m=m)
    opts = dict(alpha=alpha, window=9, global_tokens=3)
    assert_close_to_truth(
        torch_bucketed_attention(q, k, v, qb, kb, **opts),
        dense_bucketed_attention(q, k, v, qb, kb, **opts),
        dense64(q, k, v, qb, kb, **opts),
    )


def _grads(fn, q, k, v, qb, kb, opts, grad_out):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    fn(q, k, v, qb, kb, **opts).backward(grad_out.to(q.dtype))
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    ("causal", "pattern"), [(False, "none"), (True, "window+global")], ids=["full", "causal-pattern"]
)
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("n", [17, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gradients_match_reference(dtype, n, t, alpha, causal, pattern):
    q, k, v, qb, kb = make_inputs(n, 32, t, seed=7 * n + t, dtype=dtype)
    opts = dict(alpha=alpha, causal=causal, **PATTERNS[pattern])
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    ours = _grads(torch_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    ref = _grads(dense_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    truth = _grads(dense64, q.double(), k.double(), v.double(), qb, kb, opts, grad_out)
    for g_ours, g_ref, g_truth in zip(ours, ref, truth, strict=True):
        assert_close_to_truth(g_ours, g_ref, g_truth)


@pytest.mark.parametrize(("n", "kv_heads"), [(40, 2), (48, 1)])
@pytest.mark.parametrize(
    ("causal", "pattern"), [(False, "none"), (True, "window+global")], ids=["full", "causal-pattern"]
)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_short_rows_are_computed_densely_with_the_blocks_values_and_gradients(
    alpha, causal, pattern, n, kv_heads, monkeypatch
):
    """Up to SHORT_KEYS keys the PyTorch path plans no blocks and computes the dense masked reference; the
    blocks' output and gradients (of grouped keys and values too: one head for two) are as close to float64
    as its."""
    q, k, v, qb, kb = make_inputs(n, 32, 2, seed=n + kv_heads)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    opts = dict(alpha=alpha, causal=causal, **PATTERNS[pattern])
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    planned = []

    def plan(*args, **kwargs):
        planned.append(1)
        return plan_attention(*args, **kwargs)

    monkeypatch.setattr(torch_path, "plan_attention", plan)
    blocks = _grads(torch_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    assert planned == [1]
    monkeypatch.setattr(torch_path, "SHORT_KEYS", n)
    dense = _grads(torch_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    assert planned == [1]  # not planned again
    ref = _grads(dense_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    truth = _grads(dense64, q.double(), k.double(), v.double(), qb, kb, opts, grad_out)
    for got, want, exact, blocked in zip(dense, ref, truth, blocks, strict=True):
        assert torch.equal(got, want)
        assert_close_to_truth(blocked, got, exact)
    monkeypatch.setattr(torch_path, "SHORT_KEYS", n - 1)  # one key more than short: blocks again
    torch_bucketed_attention(q, k, v, qb, kb, **opts)
    assert planned == [1, 1]


@pytest.mark.parametrize("alpha", [1.0, 1.3, 1.5, 2.0, 2.5])
def test_spread_normaliser_equals_entmax_over_each_querys_keys(alpha):
    """Queries whose keys lie in rows of two parts of different widths, one query with no key: per query,
    the normaliser equals α-entmax over the union of its entries."""
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(3, 4, 5, generator=gen, dtype=torch.float64), torch.randn(2, 3, 6, generator=gen)]
    parts[1] = parts[1].double()
    rows = [torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6], [1, 6, 3, 3]]), torch.tensor([[0, 2, 5], [4, 6, 6]])]
    keep = [(torch.rand(p.shape, generator=gen) < 0.7).double() for p in parts]
    for part, row, on in zip(parts, rows, keep, strict=True):
        on[row == 3] = 0  # query 3 attends nothing
        part.add_((1 - on) * -torch.finfo(torch.float32).max)
    probs = _normalise([p.clone() for p in parts], alpha, _SpreadRows(rows, 7), [k.clone() for k in keep])
    for query in range(7):

        def entries(values, query=query):
            return torch.cat([x[r == query].flatten() for x, r in zip(values, rows, strict=True)])

        scores, mask, ours = entries(parts), entries(keep) > 0, entries(probs)
        expected = torch.zeros_like(scores)
        if mask.any():
            expected[mask] = entmax_normalize(scores[mask][None], alpha)[0]
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.7])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_gradcheck(alpha, causal):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    qb = torch.randint(-1, 3, (1, 2, 7, 2), generator=gen, dtype=torch.int32)
    kb = torch.randint(-1, 3, (1, 2, 7, 2), generator=gen, dtype=torch.int32)

    def fn(q, k, v):
        return torch_bucketed_attention(
            q, k, v, qb, kb, alpha=alpha, causal=causal, window=3, global_tokens=1
        )

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_bucket_equals_dense(causal):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 97, 32, generator=gen, dtype=torch.float64) for _ in "qkv")
    ids = torch.zeros(2, 3, 97, 1, dtype=torch.int32)
    scores = (q @ k.transpose(-1, -2)) * 32**-0.5
    if causal:
        scores = scores.masked_fill(torch.ones(97, 97, dtype=torch.bool).triu(1), float("-inf"))
    expected = {1.0: torch.softmax(scores, -1), 1.5: entmax15(scores, dim=-1), 2.0: sparsemax(scores, dim=-1)}
    for alpha, probs in expected.items():
        out = torch_bucketed_attention(q, k, v, ids, ids, alpha=alpha, causal=causal)
        torch.testing.assert_close(out, probs @ v, rtol=0, atol=1e-12)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(torch_bucketed_attention(q, k, v, ids, ids, alpha=1.0, causal=causal), sdpa)


def test_token_without_buckets_is_left_out():
    q, k, v, _, _ = make_inputs(40, 16, 2, seed=11, dtype=torch.float64)
    qb = torch.zeros(2, 2, 40, 2, dtype=torch.int32)
    qb[..., 1] = -1
    kb = qb.clone()
    qb[:, :, 3] = -1  # query 3 attends nothing
    kb[:, :, 5] = -1  # key 5 is attended by nobody
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = torch_bucketed_attention(q, k, v, qb, kb)
    assert (out[:, :, 3] == 0).all()
    out.sum().backward()
    assert (q.grad[:, :, 3] == 0).all() and (k.grad[:, :, 5] == 0).all() and (v.grad[:, :, 5] == 0).all()
    torch.testing.assert_close(out, dense64(q, k, v, qb, kb, alpha=1.5), rtol=0, atol=1e-12)


def test_pair_sharing_several_buckets_counts_once():
    n = 12
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    # Every token lists ids {1, 2} (the repeat of 2 in the third slot is the same id again), so every
    # pair shares two buckets and is met three times by naive enumeration.
    ids = torch.tensor([1, 2, 2], dtype=torch.int32).expand(1, 1, n, 3).contiguous()
    ids[0, 0, :4, 0] = 5  # the first four tokens hold {5, 2}: they share only bucket 2 with the rest
    plan = plan_attention(ids, ids)
    assert plan.num_pairs == n * n == int(attended_mask(ids, ids).sum())
    for alpha in ALPHAS:
        out = torch_bucketed_attention(q, k, v, ids, ids, alpha=alpha)
        full = entmax_normalize((q @ k.transpose(-1, -2)) * 8**-0.5, alpha) @ v  # union mask = every pair
        torch.testing.assert_close(out, full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_rows_without_keys_give_zeros(alpha):
    q, k, v, _, _ = make_inputs(30, 16, 1, seed=4)
    qb = torch.full((2, 2, 30, 1), 7, dtype=torch.int32)
    qb[..., ::2, :] = 3  # even queries match the keys' bucket, odd ones match nothing
    kb = torch.full((2, 2, 30, 1), 3, dtype=torch.int32)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = torch_bucketed_attention(q, k, v, qb, kb, alpha=alpha)
    assert (out[:, :, 1::2] == 0).all() and (out[:, :, ::2] != 0).any()
    out.square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert (q.grad[:, :, 1::2] == 0).all()


def test_no_keys_give_zeros_on_the_autograd_graph():
    """Called directly (the public entry refuses empty tensors), no keys give zero outputs that are still on
    the autograd graph, with zero gradients even where the queries hold infinities."""
    q = torch.full((1, 2, 5, 8), float("inf"), requires_grad=True)
    k, v = (torch.zeros(1, 2, 0, 8, requires_grad=True) for _ in range(2))
    ids = torch.zeros(1, 2, 5, 1, dtype=torch.int32)
    out = torch_path.torch_bucketed_attention(q, k, v, ids, ids[:, :, :0])
    assert out.shape == (1, 2, 5, 8) and (out == 0).all() and out.requires_grad
    out.sum().backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape


def test_pattern_only_matches_reference():
    q, k, v, _, _ = make_inputs(130, 32, 1, seed=8)
    none = torch.full((2, 2, 130, 1), -1, dtype=torch.int32)
    for causal, alpha in itertools.product([False, True], ALPHAS):
        opts = dict(alpha=alpha, causal=causal, window=11, global_tokens=3)
        assert_close_to_truth(
            torch_bucketed_attention(q, k, v, none, none, **opts),
            dense_bucketed_attention(q, k, v, none, none, **opts),
            dense64(q, k, v, none, none, **opts),
        )


def test_future_tokens_never_change_past_outputs():
    q, k, v, qb, kb = make_inputs(97, 32, 2, seed=9)
    opts = dict(causal=True, window=7, global_tokens=2)
    out = torch_bucketed_attention(q, k, v, qb, kb, **opts)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 50:] = torch.randn_like(k2[:, :, 50:]) * 10
    v2[:, :, 50:] = torch.randn_like(v2[:, :, 50:]) * 10
    out2 = torch_bucketed_attention(q, k2, v2, qb, kb, **opts)
    assert torch.equal(out[:, :, :50], out2[:, :, :50])
    assert not torch.equal(out[:, :, 50:], out2[:, :, 50:])


@pytest.mark.parametrize(
    ("n", "m", "t", "opts"),
    [
        (130, 130, 3, {}),
        (130, 130, 3, {"causal": True}),
        (130, 130, 3, {"window": 9, "global_tokens": 3}),
        (130, 130, 3, {"causal": True, "window": 141, "global_tokens": 65}),
        (97, 200, 2, {}),
        (97, 200, 2, {"window": 9, "global_tokens": 3}),
        (130, 130, 3, {"window": 41, "global_tokens": 3}),
        (130, 130, 3, {"causal": True, "window": 33, "global_tokens": 2}),
        (200, 97, 2, {"window": 41, "global_tokens": 3}),
    ],
    ids=[
        "plain",
        "causal",
        "pattern",
        "causal-wide-pattern",
        "cross",
        "cross-pattern",
        "global-keys-in-band",
        "causal-global-keys-in-band",
        "cross-queries-past-the-keys",
    ],
)
def test_pairs_are_exactly_the_attended_set(n, m, t, opts):
    _, _, _, qb, kb = make_inputs(n, 4, t, seed=n + t, m=m, buckets=9)
    mask = attended_mask(qb, kb, **opts)  # (2, 2, n, m)
    plan = plan_attention(qb, kb, **backend_options(opts))
    assert plan.num_pairs == int(mask.sum())
    assert torch.equal(pair_counts(plan, m).view(2, 2, n, m), mask.long())  # each attended pair once


@pytest.mark.parametrize(("window", "apart"), [(7, True), (33, False), (141, False)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_global_keys_lead_the_band_blocks_where_it_is_wide_enough(window, apart, causal):
    """With a band of at least BAND_ROWS − 1 keys each side, its blocks (rows ≤ radius + 1) begin with the
    global keys, so no block of non-global queries faces the global keys alone; a narrower band leaves them
    blocks of their own. The pairs are the attended set either way."""
    g, n = 3, 300
    _, _, _, qb, kb = make_inputs(n, 4, 1, seed=4, buckets=5)
    opts = dict(causal=causal, window=window, global_tokens=g)
    plan = plan_attention(qb, kb, **backend_options(opts))
    alone = 0  # blocks of queries past the global rows whose real keys are all global
    for blocks in plan.classes:
        real = ~blocks.padding_keys()
        only_global = ((blocks.keys % n < g) | ~real).all(1) & real.any(1)
        alone += int((only_global & (blocks.queries[:, 0] % n >= g)).sum())
    assert (alone > 0) == apart
    assert torch.equal(pair_counts(plan, n).view(2, 2, n, n), attended_mask(qb, kb, **opts).long())


def pair_counts(plan: BlockPlan, m: int) -> torch.Tensor:
    """(groups·n, m) how many times the plan's blocks attend each (query, key) pair."""
    found = torch.zeros(plan.num_queries, m, dtype=torch.int64)
    for blocks in plan.classes:
        b, r, c = attended(blocks).nonzero(as_tuple=True)
        found.index_put_((blocks.queries[b, r], blocks.keys[b, c] % m), torch.ones_like(b), accumulate=True)
    return found


def backend_options(opts: dict) -> dict:
    """Options as the backends take them: the window size w becomes the band radius w // 2."""
    opts = dict(opts)
    radius = window_radius(opts.pop("window", 0))
    return {**opts, "radius": radius}


def balanced_buckets(heads: int, n: int, buckets: int, seed: int) -> torch.Tensor:
    """(1, heads, n, 1) ids with exactly n / buckets tokens per bucket, at random positions."""
    gen = torch.Generator().manual_seed(seed)
    rank = torch.rand(1, heads, n, generator=gen).argsort(-1).argsort(-1)
    return (rank * buckets // n).to(torch.int32)[..., None]


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns (autograd included)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


def test_memory_grows_with_pairs_not_n_squared():
    n, buckets, d = 4096, 64, 64
    ids = balanced_buckets(1, n, buckets, seed=0)
    for opts in ({}, {"radius": 32, "global_tokens": 4}):
        plan = plan_attention(ids, ids, **opts)
        pattern = n * 65 - 32 * 33 + 8 * n if opts else 0  # band and global pairs, roughly
        assert plan.num_pairs <= n * n // buckets + pattern  # 1/64 of n² and the pattern's pairs
        assert plan.num_entries <= 2 * plan.num_pairs
        window = {"window": 65, "global_tokens": 4} if opts else {}
        q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in "qkv")
        with LargestTensor() as probe:
            torch_bucketed_attention(q, k, v, ids, ids, **window).sum().backward()
        # Blocks hold scores (entries) and gathered rows; inputs are n × d; nothing is n × n.
        assert probe.largest <= max(plan.num_entries, (n + 1) * d) <= n * n // 8


@pytest.mark.parametrize("pattern", [{}, {"radius": 2, "global_tokens": 3}], ids=["buckets", "pattern"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_masks_are_rules_on_rows_and_columns_not_entry_sized(causal, pattern):
    """Every class's mask is a rule on its rows and columns (positions, limits, tags), never a (blocks, L, M)
    tensor: bucket blocks of tokens with several ids carry the smaller ids of their rows and columns, pattern
    blocks every id and the band's lower limits; the plan's size stays linear in its rows and columns, and it
    still holds every attended pair once."""
    _, _, _, qb, kb = make_inputs(130, 4, 3, seed=5, buckets=9)
    plan = plan_attention(qb, kb, causal=causal, **pattern)
    tagged = [c for c in plan.classes if c.mask is not None and c.mask.q_tags is not None]
    assert tagged
    for c in plan.classes:
        if c.mask is None:
            continue
        blocks, rows = c.queries.shape
        keys = c.keys.shape[1]
        assert c.mask.key_pos.shape == (blocks, keys) and c.mask.limit.shape == (blocks, rows)
        assert c.mask.low is None or c.mask.low.shape == (blocks, rows)
        if c.mask.q_tags is not None:
            assert c.mask.q_tags.shape[1:] == (blocks, rows) and c.mask.k_tags.shape[1:] == (blocks, keys)
            assert c.mask.q_tags.shape[0] <= 3 and c.mask.k_tags.shape[0] <= 3
    assert any(c.mask is not None and c.mask.low is not None for c in plan.classes) == bool(pattern)
    window = 2 * pattern.get("radius", -1) + 1 if pattern else 0
    mask = attended_mask(qb, kb, causal=causal, window=window, global_tokens=pattern.get("global_tokens", 0))
    assert torch.equal(pair_counts(plan, 130).view(2, 2, 130, 130), mask.long())


def test_exact_entmax_over_many_block_shapes_equals_the_reference(monkeypatch):
    """Causal buckets of uneven sizes with a window and global tokens make many block shapes, some of widths
    that are not whole vectors; the C++ kernel takes them all in one call, each query's keys spread over
    several of them, and α = 1.5 still equals the reference. (The spread rows: the fused kernel would take
    the pattern's keys as slots beside whole buckets.)"""
    monkeypatch.setattr(torch_path, "takes_fused_kernel", lambda *args, **kwargs: False)
    q, k, v, qb, kb = make_inputs(700, 16, 1, seed=3, buckets=3)  # buckets of about 230 tokens
    calls = []

    def recording(parts, owners, *args, **kwargs):
        calls.append([p.shape[-1] for p in parts])
        return exact_entmax(parts, owners, *args, **kwargs)

    monkeypatch.setattr(torch_path, "exact_entmax", recording)
    opts = dict(alpha=1.5, causal=True, window=9, global_tokens=2)
    ours = bucketed_attention(q, k, v, qb, kb, backend="torch", **opts)
    [widths] = calls
    assert len(widths) >= 6 and any(w % 16 for w in widths)
    assert_close_to_truth(
        ours, dense_bucketed_attention(q, k, v, qb, kb, **opts), dense64(q, k, v, qb, kb, **opts)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_weight_of_entmax15_is_the_square_root(dtype):
    """g = √p for α = 1.5, taken without sqrt: within two ulps of it where p is a normal float, exactly 0
    off the support."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(64, 300, generator=gen, dtype=dtype) ** 4
    probs[torch.rand(probs.shape, generator=gen) < 0.8] = 0  # sparse, as entmax leaves it
    probs[0, :3] = torch.tensor([torch.finfo(dtype).tiny, 1.0, 0.5], dtype=dtype)
    weight = entmax_gradient_weight(probs, 1.5)
    on = probs > 0
    assert torch.equal(weight[~on], torch.zeros_like(weight[~on]))
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(weight[on], probs[on].sqrt(), rtol=2 * eps, atol=0)


def _slab_run(q, k, v, qb, kb, opts):
    """Outputs and input gradients of one forward and backward, the output of a forward without gradients,
    and the largest tensor that forward makes."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch_bucketed_attention(*leaves, qb, kb, **opts)
    out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view_as(out))
    with torch.no_grad(), LargestTensor() as probe:
        again = torch_bucketed_attention(q, k, v, qb, kb, **opts)
    return [out.detach(), *(x.grad for x in leaves), again], probe.largest


@pytest.mark.parametrize("alpha", ALPHAS)
def test_spread_forward_by_slabs_of_groups_is_the_same_in_less_memory(monkeypatch, alpha):
    """Where a query's keys are spread over several blocks, the forward takes (batch, head) groups a slab at
    a time, each query's rows all lying in its own group: with a slab per group, outputs and gradients are
    those of one slab for all, bit for bit, and without gradients the scores take one group's memory."""
    q, k, v, qb, kb = make_inputs(257, 8, 2, seed=11, dtype=torch.float64)
    opts = dict(alpha=alpha, causal=True, window=9, global_tokens=64)
    whole, largest_whole = _slab_run(q, k, v, qb, kb, opts)
    plan = plan_attention(qb, kb, causal=True, radius=4, global_tokens=64)
    monkeypatch.setattr(torch_path, "SLAB_ENTRIES", 1)
    assert [len(groups) for groups, _, _ in torch_path._slabs(plan)] == [1] * plan.groups
    sliced, largest_sliced = _slab_run(q, k, v, qb, kb, opts)
    for a, b in zip(whole, sliced, strict=True):
        assert torch.equal(a, b)
    assert largest_whole == plan.num_entries  # the scores of every block, at once
    assert largest_sliced <= 0.4 * largest_whole


def test_slabs_cut_each_class_by_group(monkeypatch):
    """Slabs hold consecutive groups, about ``SLAB_ENTRIES`` entries each, and every block once: each slab's
    slice of a class holds exactly the blocks of that class whose queries are in the slab's groups."""
    _, _, _, qb, kb = make_inputs(300, 4, 2, seed=2)
    # causal with 64 global tokens: the global rows' blocks (64 × 64) share a class with the global columns'
    plan = plan_attention(qb, kb, causal=True, radius=3, global_tokens=64)
    n = plan.num_queries // plan.groups
    for entries, count in ((1, plan.groups), (plan.num_entries // 3, None), (10 * plan.num_entries, 1)):
        monkeypatch.setattr(torch_path, "SLAB_ENTRIES", entries)
        slabs = torch_path._slabs(plan)
        assert [g for groups, _, _ in slabs for g in groups] == list(range(plan.groups))
        assert count is None or len(slabs) == count
        for c, blocks in enumerate(plan.classes):
            group = blocks.queries[:, 0] // n
            for groups, parts, _ in slabs:
                inside = (group >= groups.start) & (group < groups.stop)
                assert torch.equal(inside.nonzero().flatten(), torch.arange(parts[c].start, parts[c].stop))
