"""Indexed α-entmax attention against dense α-entmax (``dense_indexed_reference``), in float64.

Certified mode must equal dense attention on every input, skippable or not; approximate mode must compute
α-entmax over exactly the predicted sets Ŝ_i = {j valid : (α − 1) z′_ij ≥ τ′_i − margin} (capped at the top
``candidates``), which a dense helper below recomputes by bisection.
"""

from __future__ import annotations

import pytest
import torch

from attention_kernels.entmax.dense import entmax_normalize
from attention_kernels.entmax.threshold import entmax_threshold
from attention_kernels.index_grid import on_grid
from attention_kernels.indexed.attention import (
    RowEntmax,
    _bound_factors,
    _box_bounds,
    _compact,
    _exact_threshold,
    _indexer_blocks,
    _Layout,
    _reaching_blocks,
    clustered_orders,
    dense_indexed_reference,
    indexed_attention,
    predicted_sets,
)
from benchmarks.attention import scattered_inputs, structured_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def random_inputs(n: int, *, seed: int, m: int | None = None, d: int = 16, r: int = 4, spread: float = 2.0):
    """q, k, v (2, 2, n|m, d) in float64 and an unrelated (garbage) indexer (2, 2, n|m, r)."""
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = spread * torch.randn(2, 2, n, d, generator=gen, dtype=torch.float64)
    k = spread * torch.randn(2, 2, m, d, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, m, d, generator=gen, dtype=torch.float64)
    qi = torch.randn(2, 2, n, r, generator=gen, dtype=torch.float64)
    ki = torch.randn(2, 2, m, r, generator=gen, dtype=torch.float64)
    return q, k, v, qi, ki


def padding(batch: int, m: int, *, seed: int) -> torch.Tensor:
    """key_valid (batch, m) with some keys dropped and the second sequence shortened."""
    valid = torch.rand(batch, m, generator=torch.Generator().manual_seed(seed)) > 0.25
    valid[1, (m + 1) // 2 :] = False
    return valid


def clustered_layout(*, seed: int, causal: bool) -> _Layout:
    """The layout of random float64 inputs (n 97, padded keys, blocks of 16) in the clustered order."""
    q, k, v, qi, ki = random_inputs(97, seed=seed)
    orders = clustered_orders(qi, ki, block=16)
    valid = padding(2, 97, seed=seed)
    return _Layout(
        q, k, v, qi, ki, valid, block=16, causal=causal, scale=0.5, compute=torch.float64, orders=orders
    )


def check_matches_dense(q, k, v, qi, ki, *, grads: bool = True, **options) -> dict[str, float]:
    """Certified output and q, k, v gradients equal dense entmax's; returns the call's stats. The block path
    (``backend="torch"``) unless told otherwise: the scanned CPU kernel has tests of its own."""
    options.setdefault("backend", "torch")
    dense_opts = {key: options[key] for key in ("alpha", "causal", "key_valid", "scale") if key in options}
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, stats = indexed_attention(*inputs, qi, ki, return_stats=True, **options)
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = dense_indexed_reference(*ref_inputs, **dense_opts)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-7)
    if grads:
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
        grad = torch.autograd.grad((out * weight).sum(), inputs)
        ref_grad = torch.autograd.grad((ref * weight).sum(), ref_inputs)
        for name, g, rg in zip("qkv", grad, ref_grad, strict=True):
            torch.testing.assert_close(g, rg, atol=1e-8, rtol=1e-6, msg=f"gradient of {name}")
    return stats


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_certified_equals_dense_on_random_inputs(alpha, causal, padded):
    for n, seed in ((1, 0), (17, 1), (97, 2)):
        q, k, v, qi, ki = random_inputs(n, seed=seed)
        valid = padding(2, n, seed=seed) if padded else None
        check_matches_dense(q, k, v, qi, ki, alpha=alpha, causal=causal, key_valid=valid, block=16)


def test_certified_cross_attention_and_other_value_width():
    q, k, v, qi, ki = random_inputs(33, m=70, seed=4)
    v = torch.randn(2, 2, 70, 5, dtype=torch.float64)
    check_matches_dense(q, k, v, qi, ki, key_valid=padding(2, 70, seed=4), block=16, scale=0.3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_certified_skips_most_blocks_on_structured_inputs(causal, alpha):
    q, k, v, qi, ki = structured_inputs(1, 2, 520, 32, 8, seed=0, dtype=torch.float64)
    stats = check_matches_dense(q, k, v, qi, ki, alpha=alpha, causal=causal, block=32)
    assert stats["blocks_skipped"] > 0.6, stats
    assert 0 < stats["predicted_mean"] < 6 * 32 and stats["filled"] == 0  # keys of the needed blocks
    assert stats["recomputed"] < 0.5
    assert {"indexer_s", "bounds_s", "sparse_s"} <= set(stats)


@pytest.mark.parametrize("block", [3, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_certified_equals_dense_at_awkward_block_sizes(block, causal):
    """Blocks that do not divide n, a block wider than the sequence, padding, low-rank keys (the rotated
    bound's good case) and a noisy indexer."""
    q, k, v, qi, ki = structured_inputs(1, 2, 45, 16, 4, seed=5, dtype=torch.float64)
    qi = qi + 0.3 * torch.randn(qi.shape, generator=torch.Generator().manual_seed(1), dtype=qi.dtype)
    valid = torch.ones(1, 45, dtype=torch.bool)
    valid[0, 10:13] = False
    for alpha in (1.5, 1.3):
        check_matches_dense(q, k, v, qi, ki, alpha=alpha, causal=causal, key_valid=valid, block=block)


def scattered(n: int, *, seed: int):
    """:func:`benchmarks.attention.scattered_inputs` (supports spread over the whole sequence), float64."""
    return scattered_inputs(1, 2, n, 32, 8, seed=seed, dtype=torch.float64)


@pytest.mark.parametrize("alpha", [1.5, 1.3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_clustered_order_is_exact(alpha, causal, padded):
    """Certified mode laid out by clusters equals dense entmax, values and gradients: on garbage indexers
    (every block may be needed) and on scattered supports, with padding and blocks that do not divide n."""
    for q, k, v, qi, ki in (random_inputs(97, seed=20), scattered(75, seed=21)):
        valid = padding(q.shape[0], q.shape[2], seed=22) if padded and q.shape[0] == 2 else None
        check_matches_dense(
            q, k, v, qi, ki, alpha=alpha, causal=causal, key_valid=valid, block=16, order="clustered"
        )


@pytest.mark.parametrize("mode", ["certified", "approximate"])
def test_the_chunk_size_changes_the_work_not_the_result(monkeypatch, mode):
    """Row groups are computed within their chunk: many small chunks (a CPU's bound cut tiny) and one large
    one (the GPU's bound) give the same outputs and gradients."""
    from attention_kernels.indexed import attention as indexed

    assert indexed.chunk_entries(torch.device("cpu")) == indexed.CHUNK_ENTRIES
    assert indexed.chunk_entries(torch.device("cuda")) == indexed.GPU_CHUNK_ENTRIES > indexed.CHUNK_ENTRIES
    q, k, v, qi, ki = scattered(150, seed=29)
    cut, runs = indexed._chunks, []  # every cut made, per chunk limit
    monkeypatch.setattr(indexed, "_chunks", lambda *args: runs[-1].append(cut(*args)) or runs[-1][-1])
    results = []
    for limit in (256, indexed.GPU_CHUNK_ENTRIES):
        runs.append([])
        monkeypatch.setattr(indexed, "CHUNK_ENTRIES", limit)
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        options = dict(causal=True, block=16, mode=mode, margin=0.1, backend="torch")
        out = indexed_attention(*inputs, qi, ki, **options)
        results.append((out, *torch.autograd.grad(out.square().sum(), inputs)))
    small, large = (max(map(len, made)) for made in runs)
    assert small > 1 and large == 1  # the work was cut differently
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("causal", [False, True])
def test_approximate_mode_does_not_depend_on_the_order(causal):
    """The predicted sets are defined token by token, so the layout changes nothing but the work."""
    q, k, v, qi, ki = scattered(150, seed=23)
    valid = torch.ones(1, 150, dtype=torch.bool)
    valid[0, 40:47] = False
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    results = []
    for order in ("position", "clustered"):
        out = indexed_attention(
            *inputs,
            qi,
            ki,
            causal=causal,
            key_valid=valid,
            margin=0.1,
            block=16,
            mode="approximate",
            order=order,
        )
        results.append((out, *torch.autograd.grad(out.square().sum(), inputs)))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_clustered_orders_are_deterministic_permutations_of_tight_blocks():
    """Each row a permutation; blocks of the order are tighter (smaller per-channel ranges) than blocks of
    consecutive positions on scattered inputs."""
    _, _, _, qi, ki = scattered(200, seed=24)
    q_order, k_order = clustered_orders(qi, ki, block=16)
    again = clustered_orders(qi, ki, block=16)
    assert torch.equal(q_order, again[0]) and torch.equal(k_order, again[1])
    for order in (q_order, k_order):
        assert order.shape == (2, 200) and torch.equal(
            order.sort(dim=1).values, torch.arange(200).expand(2, 200)
        )

    def spread(x):  # mean per-channel range of blocks of 16 (the last block is partial: dropped)
        blocks = x[:, :192].reshape(2, 12, 16, -1)
        return float((blocks.amax(2) - blocks.amin(2)).mean())

    keys = ki.reshape(2, 200, -1)
    ordered = keys.gather(1, k_order[..., None].expand_as(keys))
    assert spread(ordered) < 0.5 * spread(keys)


def test_clustered_order_gathers_scattered_supports():
    """On scattered supports blocks of consecutive positions all hold support keys (almost nothing can be
    skipped); clustered by the indexer, most key blocks hold none of a row group's support."""
    q, k, v, qi, ki = scattered(1024, seed=25)
    skipped = {}
    for order in ("position", "clustered"):
        stats = check_matches_dense(q, k, v, qi, ki, block=32, grads=False, order=order)
        skipped[order] = stats["blocks_skipped"]
    assert skipped["position"] < 0.2 and skipped["clustered"] > 0.5, skipped


def assert_row_entmax_is_dense(scores, tau, alpha: float, mode: str, gen: torch.Generator) -> None:
    """RowEntmax from threshold ``tau`` equals dense entmax of ``scores``: values and gradients."""
    inputs, ref_inputs = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    probs = RowEntmax.apply(inputs, tau, alpha, mode)
    ref = entmax_normalize(ref_inputs, alpha)
    torch.testing.assert_close(probs, ref, atol=1e-12, rtol=0)
    weight = torch.randn(probs.shape, generator=gen, dtype=probs.dtype)
    (grad,) = torch.autograd.grad((probs * weight).sum(), inputs)
    (ref_grad,) = torch.autograd.grad((ref * weight).sum(), ref_inputs)
    torch.testing.assert_close(
        grad.masked_fill(scores.isinf(), 0), ref_grad.nan_to_num(0), atol=1e-10, rtol=0
    )


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
@pytest.mark.parametrize("shift", [0.0, -1e-9, -0.05, -3.0])
def test_row_entmax_from_a_trusted_threshold(alpha, shift):
    """A trusted threshold at, just below or far below the true τ (a subset that missed support keys) gives
    exact entmax and its gradient: one Newton step absorbs round-off, and rows off by more are solved."""
    gen = torch.Generator().manual_seed(4)
    scores = 3 * torch.randn(6, 5, 30, generator=gen, dtype=torch.float64)
    scores[0, 0] = float("-inf")  # a query with no key
    scores[1, :, 20:] = float("-inf")
    x = scores * (alpha - 1)
    tau = (dense_threshold(x, alpha) + shift).masked_fill(torch.isneginf(x.amax(-1)), float("inf"))
    assert_row_entmax_is_dense(scores, tau, alpha, "trusted", gen)


def test_compact_packs_kept_entries_left_in_order():
    values = torch.arange(24, dtype=torch.float64).view(2, 3, 4)
    keep = torch.tensor(
        [[[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], [[0, 0, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0]]]
    )
    keep = keep.bool()
    packed = _compact(values, keep, keep.sum(-1))
    inf = float("-inf")
    expected = [
        [0, 2, inf, inf],
        [inf] * 4,
        [8, 9, 10, 11],
        [15, inf, inf, inf],
        [17, 18, inf, inf],
        [20] + [inf] * 3,
    ]
    assert torch.equal(packed, torch.tensor(expected, dtype=torch.float64))


def test_certified_stays_exact_when_nothing_can_be_skipped():
    """Equal scores (q = 0): every key is in the support, so no block may be skipped."""
    _, k, v, qi, ki = random_inputs(70, seed=5)
    q = torch.zeros(2, 2, 70, 16, dtype=torch.float64)
    stats = check_matches_dense(q, k, v, qi, ki, causal=True, block=16, candidates=8)
    assert stats["blocks_skipped"] == 0


def test_certified_is_exact_with_a_misleading_indexer():
    """An indexer anti-correlated with the scores predicts the wrong keys; the bounds still keep the right
    ones, and the row groups whose kept blocks leave the needed ones are recomputed."""
    q, k, v, qi, ki = structured_inputs(1, 2, 260, 32, 8, seed=1, dtype=torch.float64)
    for alpha in (1.5, 1.3, 2.0):
        stats = check_matches_dense(q, k, v, -qi, ki, alpha=alpha, causal=True, block=32)
        assert stats["recomputed"] > 0.2, stats
        # a recomputed group's needed blocks are computed twice but counted once
        assert 0.0 <= stats["blocks_skipped"] < 1.0, stats


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
@pytest.mark.parametrize("causal", [False, True])
def test_certified_equals_dense_with_wide_heads(alpha, causal):
    """Head dim above the bound's per-channel axes (the norm channel is live), padding, blocks that do not
    divide n, and both a good and a noisy indexer (no recomputation, then some)."""
    q, k, v, qi, ki = structured_inputs(2, 2, 75, 40, 8, seed=6, dtype=torch.float64)
    valid = padding(2, 75, seed=6)
    noisy = qi + 0.5 * torch.randn(qi.shape, generator=torch.Generator().manual_seed(2), dtype=qi.dtype)
    for index in (qi, noisy):
        check_matches_dense(q, k, v, index, ki, alpha=alpha, causal=causal, key_valid=valid, block=11)


@pytest.mark.parametrize("d", [5, 16, 40])
def test_bound_factors_bound_every_score(d):
    """Σ_c min(q_c, 0)·low_cb + max(q_c, 0)·high_cb ≥ q·k for every valid key of block b, in float64."""
    q, k, _, qi, ki = random_inputs(45, seed=14, d=d)
    valid = padding(2, 45, seed=14)
    lay = _Layout(q, k, k, qi, ki, valid, block=7, causal=False, scale=0.5, compute=torch.float64)
    queries, low, high = _bound_factors(lay)  # (G, n_pad, c + 1), (G, c + 1, nkb)
    upper = queries.clamp_max(0) @ low + queries.clamp_min(0) @ high  # (G, n_pad, nkb)
    scores = lay.q.view(lay.G, lay.n_pad, d) @ lay.k[:-1].view(lay.G, lay.m_pad, d).transpose(1, 2)
    block_max = scores.masked_fill(~lay.key_valid.view(lay.G, 1, -1), float("-inf"))
    block_max = block_max.view(lay.G, lay.n_pad, lay.nkb, lay.B).amax(-1)
    assert (upper >= block_max - 1e-12).all()
    assert torch.isfinite(upper).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spread", [1.0, 0.0])
def test_box_bounds_bound_every_query_of_a_group_against_every_key_of_a_block(dtype, spread):
    """A row group's bound is at least q_i·k_j for each of its queries and each key of the block, round-off
    included (spread 0: all queries of a group alike and all keys of a block alike, where the bound is the
    score itself and only its slack keeps it above), and never looser than Σ_c max |q_c| · max |k_c|."""
    gen = torch.Generator().manual_seed(31)
    shape_q, shape_k = (3, 5, 8, 6), (3, 7, 9, 6)  # (G, nqb, B, c), (G, nkb, keys, c)
    queries = 3 * torch.randn(3, 5, 1, 6, generator=gen) + spread * torch.randn(shape_q, generator=gen)
    keys = 4 + 3 * torch.randn(3, 7, 1, 6, generator=gen) + spread * torch.randn(shape_k, generator=gen)
    queries, keys = (x.expand(shape).to(dtype) for x, shape in ((queries, shape_q), (keys, shape_k)))
    low, high = (x.transpose(1, 2) for x in (keys.amin(2), keys.amax(2)))  # (G, c, nkb)
    box = _box_bounds(queries, low, high).double().view(3, 5, 7)
    scores = torch.einsum("gqbc,gkjc->gqkbj", queries.double(), keys.double())  # (G, nqb, nkb, B, keys)
    assert (box >= scores.amax((-1, -2))).all()
    naive = queries.abs().amax(2).double() @ torch.maximum(low.abs(), high.abs()).double()
    assert (box <= naive * (1 + 1e-5)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_reaching_blocks_equal_per_query_bounds_everywhere(causal):
    """The two-level test (group bound first, per-query bounds on the blocks left) keeps exactly the
    allowed blocks some query that may attend them reaches with its own bound; limits ±inf included."""
    lay = clustered_layout(seed=24, causal=causal)
    queries, low, high = _bound_factors(lay)  # (G, n_pad, c), (G, c, nkb)
    G, B = lay.G, lay.B
    gen = torch.Generator().manual_seed(24)
    limit = 2.0 + 2 * torch.randn(G * lay.nqb, B, generator=gen, dtype=torch.float64)
    limit[3, :4] = float("-inf")
    limit[~lay.query_live] = float("inf")
    box = _box_bounds(queries.view(G, lay.nqb, B, -1), low, high)
    got = _reaching_blocks(lay, box, queries, low, high, limit)
    upper = (queries.clamp_max(0) @ low + queries.clamp_min(0) @ high).view(G * lay.nqb, B, -1)
    allowed = lay.key_valid.view(G, 1, -1) & (
        ~torch.tensor(causal) | (lay.k_pos[:-1].view(G, 1, -1) <= lay.q_pos.view(G, -1, 1))
    )  # (G, n_pad, m_pad)
    sees = allowed.view(G * lay.nqb, B, lay.nkb, B).any(-1) & lay.query_live[..., None]
    want = ((upper >= limit[..., None]) & sees).any(1)
    assert torch.equal(got, want)
    assert 0 < want.sum() < lay.allowed.sum()


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
def test_exact_threshold_matches_bisection(alpha):
    """Packed to the entries within 1 of the row maximum, the solve still gives every row's τ (rows with
    no entry: +inf; flat rows: everything packed)."""
    gen = torch.Generator().manual_seed(15)
    scores = 4 * torch.randn(50, 37, generator=gen, dtype=torch.float64)
    scores[3] = float("-inf")
    scores[4, 1:] = float("-inf")
    scores[5] = 0.25
    scores[6, ::2] = float("-inf")
    truth = dense_threshold(scores * (alpha - 1), alpha)
    torch.testing.assert_close(_exact_threshold(scores, alpha), truth, atol=1e-10, rtol=0)


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
def test_row_entmax_from_an_exact_threshold(alpha):
    gen = torch.Generator().manual_seed(16)
    scores = 3 * torch.randn(4, 6, 25, generator=gen, dtype=torch.float64)
    scores[0, 0] = float("-inf")
    scores[1, :, 9:] = float("-inf")
    tau = _exact_threshold(scores.view(-1, 25), alpha).view(4, 6)
    assert_row_entmax_is_dense(scores, tau, alpha, "exact", gen)


def test_float32_matches_dense_float32():
    q, k, v, qi, ki = structured_inputs(1, 2, 200, 32, 8, seed=2)
    out = indexed_attention(q, k, v, qi, ki, causal=True, block=32)
    assert out.dtype == torch.float32
    ref = dense_indexed_reference(q.double(), k.double(), v.double(), causal=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)


def test_rows_without_keys_give_zeros():
    q, k, v, qi, ki = random_inputs(20, seed=6)
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[0] = False  # no key at all in the first sequence
    valid[1, :5] = False  # causal: the first five queries of the second see no valid key
    out = indexed_attention(q, k, v, qi, ki, causal=True, key_valid=valid, block=8)
    assert out[0].abs().max() == 0 and out[1, :, :5].abs().max() == 0
    check_matches_dense(q, k, v, qi, ki, causal=True, key_valid=valid, block=8)


def test_indexer_tensors_get_no_gradient():
    q, k, v, qi, ki = random_inputs(17, seed=7)
    qi, ki = qi.clone().requires_grad_(), ki.clone().requires_grad_()
    q = q.clone().requires_grad_()
    indexed_attention(q, k, v, qi, ki, block=8).sum().backward()
    assert q.grad is not None and qi.grad is None and ki.grad is None


# ----------------------------------------------------------------------------------------------- indexer


def dense_threshold(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """τ per row of x = (α − 1) z (−inf masked) by 200 bisection steps in float64 (+inf on empty rows)."""
    top = x.amax(-1, keepdim=True)
    lo, hi = top - 1.0, top.clone()
    for _ in range(200):
        mid = (lo + hi) / 2
        mass = (x - mid).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    return torch.where(torch.isneginf(top), float("inf"), lo)[..., 0]


def dense_predicted(qi, ki, *, alpha, causal, key_valid, scale, margin) -> torch.Tensor:
    """The definition: {j valid : (α − 1) z′_ij ≥ τ′_i − margin}, τ′ of the whole low-rank row, the index
    on the 7-bit grid."""
    qi, ki = on_grid(qi), on_grid(ki)
    n, m = qi.shape[2], ki.shape[2]
    mask = torch.ones(n, m, dtype=torch.bool)
    if causal:
        mask = mask.tril()
    mask = mask.expand(qi.shape[0], qi.shape[1], n, m)
    if key_valid is not None:
        mask = mask & key_valid[:, None, None, :]
    x = ((qi @ ki.transpose(-1, -2)) * scale * (alpha - 1)).masked_fill(~mask, float("-inf"))
    return (x >= (dense_threshold(x, alpha) - margin)[..., None]) & mask


def test_threshold_matches_bisection_from_any_guess():
    x = 2 * torch.randn(300, 40, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x[:, 25:] = float("-inf")
    x[-1] = float("-inf")
    for alpha in (1.5, 1.3, 2.0, 2.5):
        truth = dense_threshold(x, alpha)
        for shift in (None, 0.0, 0.3, -0.3):
            guess = None if shift is None else truth.masked_fill(truth.isinf(), 0.0) + shift
            tau, top = entmax_threshold(x.clone(), guess, alpha)
            torch.testing.assert_close(tau + top, truth, atol=1e-10, rtol=0)


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0, 2.5])
def test_pass_one_bounds_the_low_rank_threshold_from_below(alpha):
    """Pass 1's L_i ≤ τ′_i (the threshold of query i's whole low-rank row) for every live query, +inf for
    padding; in the clustered causal order some queries see none of their row group's shared blocks and
    get −inf, and their groups then need every block they may see."""
    lay = clustered_layout(seed=20, causal=True)
    need, lower = _indexer_blocks(lay, alpha, 0.0)
    G = lay.G
    z = lay.qi.view(G, lay.n_pad, -1) @ lay.ki[:-1].view(G, lay.m_pad, -1).transpose(1, 2)  # scaled z′
    allowed = lay.key_valid.view(G, 1, -1) & (lay.k_pos[:-1].view(G, 1, -1) <= lay.q_pos.view(G, -1, 1))
    truth = dense_threshold(((alpha - 1) * z).masked_fill(~allowed, float("-inf")), alpha)  # (G, n_pad)
    live = lay.query_live.view(G, -1)
    lower = lower.view(G, -1)
    assert (lower[live] <= truth[live] + 1e-12).all()
    assert torch.isposinf(lower[~live]).all()
    blind = torch.isneginf(lower)  # (G, n_pad)
    assert blind.any()
    sees = allowed.view(G, lay.n_pad, lay.nkb, lay.B).any(-1)  # (G, n_pad, nkb)
    group_needs = need.view(G, lay.nqb, 1, lay.nkb).expand(-1, -1, lay.B, -1).reshape(G, lay.n_pad, -1)
    assert (group_needs | ~sees)[blind].all()


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
@pytest.mark.parametrize("margin", [0.0, 0.2])
@pytest.mark.parametrize("causal", [False, True])
def test_predicted_sets_follow_the_definition(alpha, margin, causal):
    _, _, _, qi, ki = random_inputs(45, seed=9, r=4)
    valid = padding(2, 45, seed=9)
    opts = dict(alpha=alpha, causal=causal, key_valid=valid, scale=0.7, margin=margin)
    got = predicted_sets(qi, ki, candidates=45, block=16, **opts)
    assert torch.equal(got, dense_predicted(qi, ki, **opts))


def test_predicted_sets_keep_the_top_candidates():
    _, _, _, qi, ki = random_inputs(40, seed=10, r=4)
    got = predicted_sets(qi, ki, candidates=3, block=16, scale=0.2, margin=5.0)  # flat rows, wide margin
    assert (got.sum(-1) == 3).all()
    z = on_grid(qi) @ on_grid(ki).transpose(-1, -2)
    third = z.topk(3, dim=-1).values[..., -1:]
    assert torch.equal(got, z >= third)


def test_approximate_is_entmax_over_the_predicted_sets():
    q, k, v, qi, ki = structured_inputs(1, 2, 150, 32, 4, seed=3, dtype=torch.float64)
    qi = qi + 0.5 * torch.randn(qi.shape, generator=torch.Generator().manual_seed(0), dtype=qi.dtype)
    scale = 32**-0.5
    for causal in (False, True):
        sets = predicted_sets(qi, ki, causal=causal, scale=scale, margin=0.05, block=32)
        out, stats = indexed_attention(
            q, k, v, qi, ki, causal=causal, margin=0.05, block=32, mode="approximate", return_stats=True
        )
        ref = dense_indexed_reference(q, k, v, causal=causal, allowed=sets)
        torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-7)
        assert stats["predicted_mean"] == pytest.approx(sets.sum(-1).double().mean().item())


def test_approximate_with_a_huge_margin_is_dense():
    q, k, v, qi, ki = random_inputs(37, seed=11)
    valid = padding(2, 37, seed=11)
    for causal in (False, True):
        out = indexed_attention(
            q,
            k,
            v,
            qi,
            ki,
            causal=causal,
            key_valid=valid,
            margin=1e6,
            candidates=37,
            block=16,
            mode="approximate",
        )
        ref = dense_indexed_reference(q, k, v, causal=causal, key_valid=valid)
        torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-7)


# ----------------------------------------------------------------------------------------------- errors


def _args():
    q, k, v, qi, ki = random_inputs(8, seed=12)
    return q, k, v, qi, ki


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a, o: (a.__setitem__(0, a[0][0]), o), "q must be"),
        (lambda a, o: (a.__setitem__(2, a[2].float()), o), "share one dtype"),
        (lambda a, o: (a.__setitem__(1, a[1][:, :, :, :3]), o), "k must be"),
        (lambda a, o: (a.__setitem__(3, a[3][:, :, :5]), o), "q_index must be"),
        (lambda a, o: (a.__setitem__(4, a[4][..., :2]), o), "k_index must be"),
        (lambda a, o: (a, {**o, "alpha": 1.0}), "alpha must be"),
        (lambda a, o: (a, {**o, "alpha": True}), "alpha must be"),
        (lambda a, o: (a, {**o, "mode": "exact"}), "mode must be"),
        (lambda a, o: (a, {**o, "order": "sorted"}), "order must be"),
        (lambda a, o: (a, {**o, "candidates": 0}), "candidates must be"),
        (lambda a, o: (a, {**o, "block": 2.0}), "block must be"),
        (lambda a, o: (a, {**o, "margin": -0.1}), "margin must be"),
        (lambda a, o: (a, {**o, "scale": 0}), "scale must be"),
        (lambda a, o: (a, {**o, "causal": 1}), "causal must be"),
        (lambda a, o: (a, {**o, "key_valid": torch.ones(2, 8)}), "key_valid must be"),
    ],
)
def test_bad_arguments_raise_one_line(change, match):
    args, opts = list(_args()), {}
    result = change(args, opts)
    opts = result[1]
    with pytest.raises(ValueError, match=match) as err:
        indexed_attention(*args, **opts)
    assert "\n" not in str(err.value)


def test_causal_needs_square_attention():
    q, k, v, qi, ki = random_inputs(8, m=9, seed=13)
    with pytest.raises(ValueError, match="causal"):
        indexed_attention(q, k, v, qi, ki, causal=True)
