"""Indexed α-entmax attention: a low-rank indexer predicts each query's support; certified pruning is exact.

Math (entmax15's convention). For scores z_ij = scale · q_i·k_j over the valid keys of query i (key_valid, and
j ≤ i when causal),

    p_ij = [(α − 1) z_ij − τ_i]₊^{1/(α−1)},   τ_i such that Σ_j p_ij = 1,   o_i = Σ_j p_ij v_j

(α = 1.5: p = [z/2 − τ]₊²; α = 2: sparsemax). Write τ(S) for the threshold of the scores of a key set S.
For α > 1, adding keys only raises the threshold (Σ_j [(α − 1) z_j − τ]₊^{1/(α−1)} grows with the set, so its
root moves right): τ(S) ≤ τ_i for every S, and any key with (α − 1) z_ij ≤ τ(S) has p_ij = 0 exactly.

Indexer (pass 1). Low-rank projections q_index (…, n, r) and k_index (…, m, r), r ≪ d, give cheap scores
z′_ij = scale · q_index_i·k_index_j (approximate mode: each row of both first put on its 7-bit grid, see
:mod:`attention_kernels.index_grid`; the CPU kernel multiplies the codes in integers). With τ′_i the
threshold of the top-``candidates`` z′ of row i (the exact threshold of the whole low-rank row whenever its
support fits in the candidates), the predicted set is

    Ŝ_i = {j among the top-``candidates`` z′_i : (α − 1) z′_ij ≥ τ′_i − margin}.

Equivalently (the form computed here), with τ′_i the exact threshold of the whole low-rank row, Ŝ_i is the
top-``candidates`` by z′ of {j valid : (α − 1) z′_ij ≥ τ′_i − margin}: when the row's support fits in the
candidates both thresholds agree, and when it does not, every candidate is in the support and both forms give
all the candidates. Nothing n × m is built: per query block, the per-channel min/max of k_index over each key
block bound z′ from above (Quest's bound Σ_c max(q_c · kmax_c, q_c · kmin_c)); the threshold of the keys in
the few key blocks with the largest bounds for the query block, or any lower bound of it, is a lower bound
L_i ≤ τ′_i (a subset's threshold), and only key blocks whose bound reaches L_i − margin for some query of
the block can hold members of Ŝ, so only those are scored.

Modes.

* ``"approximate"``: exact α-entmax with the exact scores z over Ŝ_i only.
* ``"certified"``: exact for every input (recall 1 by construction); the indexer only decides how much is
  skipped. (1) Exact scores over the key blocks pass 1 found needed (those that may hold members of Ŝ)
  and τ_S, their exact threshold (:func:`_exact_threshold`): a subset of the row, so τ_S ≤ τ_i; entmax
  attention over those blocks.
  (2) Per (query block, key block) an upper bound on q_i·k_j over the full head dim, in the keys'
  principal axes (any orthonormal basis keeps q·k; in that one the ranges are narrow): Quest's
  per-channel bound on the leading axes and Cauchy–Schwarz on the rest. A key block whose
  (α − 1) · bound ≤ τ_S for all queries of the block has p = 0 exactly. Where every kept block is a
  needed one, no key outside the needed blocks has weight, so τ_S = τ_i and step 1's output is the
  answer. (3) The other row groups are computed again over their kept blocks, from τ_S (one Newton step
  absorbs round-off; rows whose mass is off are solved).

Layout. Work runs per (batch·head, query block) "row group" of ``block`` queries facing a list of
``block``-key blocks, gathered into rows of scores (groups, block, K · block) padded with an empty block;
row groups are sorted by their block count and processed in chunks of about ``CHUNK_ENTRIES`` scores (2²⁰,
cache-sized, on a CPU; ``GPU_CHUNK_ENTRIES``, 2²⁵, on a GPU, where each chunk costs launches), so memory
stays linear in what is computed and no (n × m) tensor exists beyond such chunks.

Backends. ``backend="auto"`` runs certified mode on CUDA tensors in fp16, bf16 or fp32 through the Triton
forward of :mod:`attention_kernels.indexed.triton_kernel` (imported only then) when no gradient is needed; on
CPU tensors with α = 1.5 or 2 through the scanned C++ kernel of :mod:`attention_kernels.indexed.scanned`,
forward and backward (every pair scored by a register-tiled product, the entmax over the keys within
β = 1/(α − 1) of each row's maximum: on a trained model's scattered supports, where no bound rules out a
block, that is what beats softmax SDPA), and approximate mode there too (its low-rank rows scanned the same
way); and everything else (other α, approximate mode or gradients on a GPU, a machine where the C++ kernel
cannot be built) through the PyTorch code here. ``backend="triton"`` forces the Triton forward (certified mode
only; CPU tensors only under ``TRITON_INTERPRET=1``) and refuses, with a ValueError, a call that needs
gradients: it is forward-only, for inference (use ``"auto"`` or ``"torch"`` to train). ``backend="torch"``
forces this module's path.

The dense reference is :func:`dense_indexed_reference` (entmax of all masked scores, by
`attention_kernels.entmax.dense.entmax_normalize`), for tests.
"""

from __future__ import annotations

import math
import time
from numbers import Integral, Real

import torch

from attention_kernels.bucketed.torch_path import exact_row_thresholds
from attention_kernels.checks import check_backend, check_causal, check_qkv, check_scale
from attention_kernels.entmax.dense import entmax_normalize
from attention_kernels.entmax.gradient import entmax_gradient_weight
from attention_kernels.entmax.support_sums import support_sums
from attention_kernels.entmax.threshold import entmax_threshold, mass_and_slope, newton_step
from attention_kernels.index_grid import on_grid
from attention_kernels.indexed.principal_axes import principal_axes
from attention_kernels.indexed.scanned import scanned_attention, scanned_kernel

__all__ = [
    "MODES",
    "ORDERS",
    "clustered_orders",
    "dense_indexed_reference",
    "index_needed",
    "indexed_attention",
    "predicted_sets",
]

MODES = ("certified", "approximate")
ORDERS = ("position", "clustered")
CHUNK_ENTRIES = 2**20
"""Scores held per chunk of row groups on a CPU: bounds the transient memory and keeps a chunk near the
caches."""
GPU_CHUNK_ENTRIES = 2**25
"""The same on a GPU (128 MiB of fp32 scores), where each chunk's dozen or so ops cost launches rather than
cache misses: at n = 16384, 8 heads, blocks of 32, the approximate forward's two chunked phases take 1 and 3
chunks instead of 9 and 54, and its lower bounds one chunk instead of 16."""

_QUEST_AXES = 16
"""Leading principal axes the exact-score bound takes per channel; the rest is bounded by one norm."""
_LOWER_BLOCKS = 4
"""Key blocks per row group whose keys give pass 1's lower bounds L_i: those with the largest bounds for the
group, shared by its queries (one batched product, no per-query gather), so a support spread over a few
blocks still gets a bound near τ′."""
_LOWER_STEPS = 2
"""Newton steps from below that give L_i (α ≤ 2): a lower bound of the subset's threshold, within about 1e−3
of it on smooth supports, at a fraction of a solve."""
_NEG_INF = float("-inf")


class RowEntmax(torch.autograd.Function):
    """α-entmax over the last dim of scores (…, L) (−inf = masked; all-masked rows give zeros), with a
    threshold (…) in (α − 1)·score units used as ``how`` says. Backward: the exact entmax Jacobian,
    ds = g·(dp − Σ g·dp / Σ g) with g = p^{2−α}.

    * ``"guess"``: a starting point of the solve (or None).
    * ``"trusted"``: the threshold up to round-off (:func:`_trusted_probs`): one Newton step instead of a
      solve, and a solve only on rows whose mass is clearly off. A certified τ_S ≤ τ is the exact τ
      whenever its subset held the support; a missed support key raises the mass above 1.
    * ``"exact"``: the threshold of these very scores (:func:`_exact_threshold`); only the normalisation
      absorbs its last rounding.
    """

    @staticmethod
    def forward(
        ctx, scores: torch.Tensor, tau: torch.Tensor | None, alpha: float, how: str = "guess"
    ) -> torch.Tensor:
        if how == "exact" and tau is not None:
            x = torch.add(-tau[..., None], scores, alpha=alpha - 1.0)  # (…, L) one pass
            probs = _powered(x, alpha)  # −inf on masked entries and on rows with no key (τ = +inf)
        elif how == "trusted" and tau is not None:
            x = scores * (alpha - 1.0)
            probs = _trusted_probs(x, scores, tau, alpha).view_as(scores)
        else:
            x = scores * (alpha - 1.0)
            tau, _ = entmax_threshold(x, tau, alpha)  # x shifted in place
            probs = _powered(x.sub_(tau.masked_fill(torch.isinf(tau), 0.0)[..., None]), alpha)
        total = probs.sum(-1, keepdim=True)
        probs.div_(total.masked_fill(total == 0, 1.0))  # absorbs the threshold's last rounding
        ctx.save_for_backward(probs)
        ctx.alpha = alpha
        return probs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (probs,) = ctx.saved_tensors
        weight = entmax_gradient_weight(probs, ctx.alpha)
        wg = weight * grad
        den = weight.sum(-1, keepdim=True)
        ratio = wg.sum(-1, keepdim=True) / den.masked_fill(den == 0, 1.0)
        return wg.sub_(weight * ratio), None, None, None  # weight may be probs itself (α = 1)


def _powered(diff: torch.Tensor, alpha: float) -> torch.Tensor:
    """[diff]₊^{1/(α−1)} in place (−inf → 0)."""
    diff.clamp_min_(0)
    if alpha == 1.5:
        return diff.square_()
    if alpha != 2.0:
        return diff.pow_(1.0 / (alpha - 1.0))
    return diff


def _trusted_probs(x: torch.Tensor, scores: torch.Tensor, tau: torch.Tensor, alpha: float) -> torch.Tensor:
    """Unnormalised [x − τ₁]₊^β (…, L) of x = (α − 1)·scores, written over x, from a trusted threshold τ (…)
    (+inf: a query with no key, all zeros).

    τ came from other tiles of the same scores, so it is off by their round-off: one Newton step
    τ₁ = τ + β (F − F^{1−1/β}) / (−F′) on F(τ) = Σ [x − τ]₊^β fits it to these scores (its error is
    quadratic in F − 1). Rows whose mass misses 1 by more than √eps (a support key the subset missed) are
    solved from scratch instead; round-off alone stays far below that.
    """
    beta = 1.0 / (alpha - 1.0)
    width = x.shape[-1]
    x, scores, tau = x.view(-1, width), scores.reshape(-1, width), tau.reshape(-1)
    live = torch.isfinite(tau)
    mass, slope = mass_and_slope(x, tau, beta, torch.empty_like(x))  # (N,)
    fitted = newton_step(tau, mass, slope, beta).masked_fill_(~live, float("inf"))  # (N,)
    probs = _powered(x.sub_(fitted[:, None]), alpha)
    bad = ((mass - 1.0).abs() > torch.finfo(x.dtype).eps ** 0.5) & live
    rows = bad.nonzero().squeeze(1)
    if rows.numel():
        y = scores.index_select(0, rows).mul_(alpha - 1.0)
        again, _ = entmax_threshold(y, tau.index_select(0, rows), alpha)
        probs.index_copy_(
            0, rows, _powered(y.sub_(again.masked_fill(torch.isinf(again), 0.0)[:, None]), alpha)
        )
    return probs


# ----------------------------------------------------------------------------------------------- layout


class _Layout:
    """Flattened, block-padded views of one call's inputs, shared by every phase.

    Groups g = batch·heads; queries padded to n_pad = nqb·B and cut into row groups (G·nqb, B, ·); keys
    padded to m_pad = nkb·B and cut into blocks (G·nkb + 1, B, ·), the last an empty block that padding in
    block lists points at. ``bias`` (G·nkb + 1, B) is 0 on valid keys and −inf elsewhere.

    Tokens sit in the blocks in the order ``orders`` gives per group — (G, n) queries and (G, m) keys, each
    row a permutation of positions — or by position when it is None. ``q_pos`` (G·nqb, B) and ``k_pos``
    (G·nkb + 1, B) hold every slot's position (n_pad for padding queries, m_pad for padding keys); causal
    masks compare positions, so any order computes the same attention.
    """

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_index: torch.Tensor,
        k_index: torch.Tensor,
        key_valid: torch.Tensor | None,
        *,
        block: int,
        causal: bool,
        scale: float,
        compute: torch.dtype,
        orders: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        b, h, n, d = q.shape
        m = k.shape[2]
        B = block
        self.n, self.d, self.B, self.causal, self.orders = n, d, B, causal, orders
        self.G, self.nqb, self.nkb = b * h, -(-n // B), -(-m // B)
        self.n_pad, self.m_pad = self.nqb * B, self.nkb * B
        G, dev = self.G, q.device
        q_order, k_order = (None, None) if orders is None else orders

        def blocks(x: torch.Tensor, order: torch.Tensor | None, nb: int, extra: int) -> torch.Tensor:
            """x (b, h, length, c) → (G·nb + extra, B, c) in ``compute``, in ``order``, zero-padded."""
            length = x.shape[2]
            x = x.reshape(G, length, -1)
            if order is not None:
                x = x.gather(1, order[..., None].expand_as(x))
            out = x.new_empty(G * nb + extra, B, x.shape[-1], dtype=compute)
            body = out[: G * nb].view(G, nb * B, -1)
            body[:, :length] = x
            body[:, length:] = 0  # only the padding is filled: a zeroed buffer would be written twice
            out[G * nb :] = 0
            return out

        def slots(order: torch.Tensor | None, length: int, nb: int, pad: int) -> torch.Tensor:
            """Positions of the (G, nb·B) slots: ``order`` or 0, 1, …, then ``pad`` on padding."""
            pos = torch.full((G, nb * B), pad, dtype=torch.long, device=dev)
            pos[:, :length] = torch.arange(length, device=dev) if order is None else order
            return pos

        # the scale goes on the n × d queries, not on the scores
        self.q = blocks(q, q_order, self.nqb, 0).mul_(scale)  # (G·nqb, B, d)
        self.qi = blocks(q_index, q_order, self.nqb, 0).mul_(scale)  # (G·nqb, B, r)
        self.k, self.v = blocks(k, k_order, self.nkb, 1), blocks(v, k_order, self.nkb, 1)  # (G·nkb + 1, B, ·)
        self.ki = blocks(k_index, k_order, self.nkb, 1)  # (G·nkb + 1, B, r)
        q_pos = slots(q_order, n, self.nqb, self.n_pad)  # (G, n_pad)
        k_pos = slots(k_order, m, self.nkb, self.m_pad)  # (G, m_pad)
        self.q_pos = q_pos.view(-1, B)
        self.k_pos = torch.cat([k_pos.view(-1, B), k_pos.new_full((1, B), self.m_pad)])

        valid = torch.ones(b, m, dtype=torch.bool, device=dev) if key_valid is None else key_valid
        valid = valid[:, None].expand(b, h, m).reshape(G, m)  # by position
        # A query has a key if some valid key is allowed: any valid key, or one at j ≤ i when causal
        # (then n == m). (G, n) by position.
        has_key = valid.cumsum(1) > 0 if causal else valid.any(1, keepdim=True).expand(G, n)
        if orders is not None:
            valid, has_key = valid.gather(1, k_order), has_key.gather(1, q_order)
        self.key_valid = torch.nn.functional.pad(valid, (0, self.m_pad - m)).view(G * self.nkb, B)
        self.query_live = torch.nn.functional.pad(has_key, (0, self.n_pad - n)).view(-1, B)  # (G·nqb, B)
        bias = torch.zeros(G * self.nkb + 1, B, dtype=compute, device=dev)
        bias[:-1].masked_fill_(~self.key_valid, _NEG_INF)
        bias[-1] = _NEG_INF
        self.bias = bias
        self.block_live = self.key_valid.any(-1).view(G, self.nkb)  # (G, nkb) holds a valid key
        # causal masks: the latest and the earliest valid key of each key block (−1 and m_pad when none)
        latest = self.k_pos[:-1].masked_fill(~self.key_valid, -1).amax(1)  # (G·nkb,)
        self.latest_key = torch.cat([latest, latest.new_full((1,), -1)])  # (G·nkb + 1,)
        earliest = self.k_pos[:-1].masked_fill(~self.key_valid, self.m_pad).amin(1)
        self.earliest_key = earliest.view(G, self.nkb)  # (G, nkb)
        self.allowed = self._allowed_blocks()  # (G·nqb, nkb)

    def _allowed_blocks(self) -> torch.Tensor:
        """(G·nqb, nkb) bool: some live query of the row group may attend to a valid key of key block b —
        causal: the block's earliest valid key is at or before the group's latest live query."""
        live = self.block_live.repeat_interleave(self.nqb, 0)  # (G·nqb, nkb)
        allowed = live & self.query_live.any(1, keepdim=True)
        if self.causal:
            latest = self.q_pos.masked_fill(~self.query_live, -1).amax(1)  # (G·nqb,)
            earliest = self.earliest_key.repeat_interleave(self.nqb, 0)  # (G·nqb, nkb)
            allowed = allowed & (earliest <= latest[:, None])
        return allowed

    def sees(self, rows: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """(R, B, K) bool: which queries of row groups ``rows`` (R,) may attend a valid key of the key blocks
        ``blocks`` (R, K) of their group (causal: one at or before them; −1: none); padding queries attend
        nothing."""
        g = (rows // self.nqb)[:, None]
        if self.causal:
            sees = self.earliest_key[g, blocks][:, None, :] <= self.q_pos[rows][..., None]
        else:
            sees = self.block_live[g, blocks][:, None, :]
        return sees & (blocks >= 0)[:, None, :] & self.query_live[rows][..., None]

    def extrema(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel min and max over the valid keys of each key block of keys (G·nkb, B, c): (G·nkb, c)
        each (0 when empty)."""
        x, valid = keys, self.key_valid[..., None]  # (G·nkb, B, c), (G·nkb, B, 1)
        low = x.masked_fill(~valid, float("inf")).amin(1)
        high = x.masked_fill(~valid, _NEG_INF).amax(1)
        live = self.block_live.view(-1, 1)
        return low.where(live, 0.0), high.where(live, 0.0)

    def flat_blocks(self, rows: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """Flat key-block ids (R, K) of block lists ``blocks`` (R, K) (−1 = empty) of row groups ``rows``."""
        g = rows // self.nqb
        return torch.where(blocks >= 0, g[:, None] * self.nkb + blocks, self.G * self.nkb)

    def scores(
        self, queries: torch.Tensor, keys: torch.Tensor, rows: torch.Tensor, flat: torch.Tensor
    ) -> torch.Tensor:
        """Masked scores (R, B, K·B) of row-group queries (R, B, c) against key blocks ``flat`` (R, K).

        Invalid keys and padding are −inf through the bias added by ``baddbmm``; when causal, the future keys
        too, compared position by position.
        """
        R, K = flat.shape
        kb = keys.index_select(0, flat.reshape(-1)).view(R, K * self.B, -1)
        bias = self.bias.index_select(0, flat.reshape(-1)).view(R, 1, K * self.B)
        out = torch.baddbmm(bias, queries, kb.transpose(1, 2))
        if self.causal and self.orders is None:  # by position only the diagonal block holds future keys
            q_pos = self.q_pos[rows]  # (R, B)
            r, at = (self.latest_key[flat] > q_pos.amin(1, keepdim=True)).nonzero(as_tuple=True)
            future = self.k_pos[flat[r, at]][:, None, :] > q_pos[r][:, :, None]  # (P, B, B)
            view = out.view(R, self.B, K, self.B)
            view[r, :, at, :] = view[r, :, at, :].masked_fill(future, _NEG_INF)
        elif self.causal:  # in another order most blocks do: one comparison over the whole chunk
            k_pos = self.k_pos.index_select(0, flat.reshape(-1)).view(R, 1, K * self.B)
            out = out.masked_fill(k_pos > self.q_pos[rows][..., None], _NEG_INF)
        return out


def _box_bounds(queries: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """An upper bound on q·k for every query of each row group and every key of each key block, round-off
    included: queries (G, nqb, B, c); low, high (G, c, nkb) per-channel key-block extrema → (G·nqb, nkb).

    With the group's queries in the box m_q ± r_q and the block's keys in m_k ± r_k (per channel),
    q_c·k_c ≤ m_q·m_k + r_q·|m_k| + (|m_q| + r_q)·r_k: three small products, where per-query bounds take one
    entry per query. Round-off is covered by 8c ulps of Σ_c (|m_q| + r_q)(|m_k| + r_k), which bounds the size
    of every term.
    """
    G, nqb, _, c = queries.shape
    q_low, q_high = queries.amin(2), queries.amax(2)  # (G, nqb, c)
    m_q, r_q = (q_high + q_low) / 2, (q_high - q_low) / 2
    m_k, r_k = (high + low) / 2, (high - low) / 2  # (G, c, nkb)
    size_q, centre_k = m_q.abs() + r_q, m_k.abs()
    bound = torch.bmm(m_q, m_k).baddbmm_(r_q, centre_k).baddbmm_(size_q, r_k)
    eps = torch.finfo(bound.dtype).eps
    return bound.baddbmm_(size_q, centre_k + r_k, alpha=8 * c * eps).view(G * nqb, -1)


def _reaching_blocks(
    lay: _Layout,
    box: torch.Tensor,
    queries: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    limit: torch.Tensor,
) -> torch.Tensor:
    """(G·nqb, nkb) bool: the allowed key blocks b of each row group for which some query i that may attend
    b has Quest's bound Σ_c max(q_ic·high_cb, q_ic·low_cb) ≥ limit_i, in the units of queries (G, n_pad, c);
    low, high (G, c, nkb); limit (G·nqb, B), +inf for a query that needs nothing, −inf for one that needs
    every block it may attend.

    Two levels: the row group's bound ``box`` (:func:`_box_bounds`) discards the blocks below the group's
    smallest limit, and the per-query bounds (split by the sign of q_c: two batched products) run on the
    blocks left, row groups sorted by their count.
    """
    G, B, nkb = lay.G, lay.B, lay.nkb
    c = queries.shape[-1]
    left = (box >= limit.amin(1, keepdim=True)) & lay.allowed  # (G·nqb, nkb)
    low, high = (torch.cat([x.transpose(1, 2).reshape(G * nkb, c), x.new_zeros(1, c)]) for x in (low, high))
    queries = queries.view(-1, B, c)  # (G·nqb, B, c)
    out = torch.zeros_like(lay.allowed)
    for rows, blocks in _sorted_chunks(left, B):  # a block's bounds: one per query
        flat = lay.flat_blocks(rows, blocks)  # (R, K)
        q = queries[rows]  # (R, B, c)
        bound = torch.baddbmm(
            torch.bmm(q.clamp_max(0), low[flat].transpose(1, 2)), q.clamp_min(0), high[flat].transpose(1, 2)
        )  # (R, B, K)
        hit = ((bound >= limit[rows][..., None]) & lay.sees(rows, blocks)).any(1)  # (R, K)
        out[rows[:, None].expand_as(blocks)[hit], blocks[hit]] = True
    return out


def _block_lists(chosen: torch.Tensor, width: int) -> torch.Tensor:
    """(R, nkb) bool → (R, width) key-block ids of the True entries, ascending, −1 after them."""
    order = torch.sort(chosen.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :width]
    taken = torch.gather(chosen, 1, order)
    return torch.where(taken, order, -1)


def chunk_entries(device: torch.device) -> int:
    """Scores per chunk of row groups on ``device``: ``CHUNK_ENTRIES`` on a CPU, ``GPU_CHUNK_ENTRIES`` else.
    Chunks only bound memory: every row group's result is computed within its chunk."""
    return CHUNK_ENTRIES if device.type == "cpu" else GPU_CHUNK_ENTRIES


def _chunks(counts: list[int], width_entries: int, limit: int) -> list[tuple[int, int]]:
    """Cut a list sorted by block count into runs of at most ~``limit`` padded scores (zeros skipped)."""
    runs, start = [], next((i for i, c in enumerate(counts) if c > 0), len(counts))
    while start < len(counts):
        stop = start + 1
        while stop < len(counts) and (stop + 1 - start) * counts[stop] * width_entries <= limit:
            stop += 1
        runs.append((start, stop))
        start = stop
    return runs


def _sorted_chunks(chosen: torch.Tensor, entries: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row groups sorted by their number of chosen key blocks and cut into chunks of about
    :func:`chunk_entries` scores, a chosen block costing ``entries`` per row group: (rows, block lists)."""
    counts = chosen.sum(1)
    order = torch.sort(counts, stable=True).indices
    sorted_counts = counts[order].tolist()
    return [
        (order[a:z], _block_lists(chosen[order[a:z]], sorted_counts[z - 1]))
        for a, z in _chunks(sorted_counts, entries, chunk_entries(chosen.device))
    ]


def clustered_orders(
    q_index: torch.Tensor, k_index: torch.Tensor, *, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch·head, orders that put tokens of one direction in one block: (G, n) queries and (G, m) keys,
    each row a permutation of positions (G = batch·heads), from the indexer's rank-r coordinates.

    Each side is cut by recursive bisection (:func:`_bisection_order`) into blocks of ``block`` tokens. A key
    block then holds keys of one direction, so its per-channel ranges are narrow and its bounds tight; a row
    group holds queries of one direction, whose low-rank score rows, hence supports, are alike. Only the
    layout changes: the attention is the same in any order.
    """
    b, h, n, r = q_index.shape
    m = k_index.shape[2]
    return (
        _bisection_order(q_index.detach().reshape(b * h, n, r).float(), block),
        _bisection_order(k_index.detach().reshape(b * h, m, r).float(), block),
    )


def _bisection_order(points: torch.Tensor, leaf: int) -> torch.Tensor:
    """(G, L) permutations of points (G, L, r) by recursive bisection, a k-d tree: every segment is sorted
    along its axis of largest variance and cut in two at a multiple of ``leaf`` near its middle, until
    segments hold at most ``leaf`` points. Segment sizes depend on L alone, so all G rows are cut alike and
    a level is one sort of (segment, coordinate) keys: O(L·(r + log L)) per level, log₂(L/leaf) levels."""
    G, L, r = points.shape
    order = torch.arange(L, device=points.device).expand(G, L)
    x = points
    sizes = [L]
    while max(sizes) > leaf:
        count = torch.tensor(sizes, device=x.device)
        segment = torch.repeat_interleave(torch.arange(len(sizes), device=x.device), count)  # (L,)
        mean = x.new_zeros(G, len(sizes), r).index_add_(1, segment, x) / count[:, None]  # (G, S, r)
        variance = x.new_zeros(G, len(sizes), r).index_add_(1, segment, x * x) / count[:, None] - mean**2
        axis = variance.argmax(-1)[:, segment]  # (G, L): the axis each point's segment is cut along
        along = x.gather(2, axis[..., None])[..., 0].double()  # (G, L)
        # one sort: segment first, then the coordinate squashed monotonically into (0, 1)
        key = segment.double() + torch.atan(along) / torch.pi + 0.5
        step = torch.argsort(key, dim=1)
        order, x = order.gather(1, step), x.gather(1, step[..., None].expand(-1, -1, r))
        sizes = [part for size in sizes for part in _halves(size, leaf)]
    return order


def _halves(size: int, leaf: int) -> list[int]:
    """A segment's two parts, the first a multiple of ``leaf`` near half; a small segment stays whole."""
    if size <= leaf:
        return [size]
    first = max(leaf, size // 2 // leaf * leaf)
    return [first, size - first]


# ----------------------------------------------------------------------------------------------- phases


def _indexer_blocks(lay: _Layout, alpha: float, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 1's block step: need (G·nqb, nkb) bool, the key blocks that may hold members of Ŝ, and the
    lower bounds L (G·nqb, B).

    Per row group, the ``_LOWER_BLOCKS`` key blocks with the largest group bounds (:func:`_box_bounds`) are
    scored in low rank, and L_i is a lower bound (:func:`_threshold_lower_bound`) of the threshold of the
    keys among them query i may attend: a subset of the row, so L_i ≤ τ′_i (+inf for padding and queries
    with no key: they need nothing; −inf for a query that may attend none of those keys: it needs every
    block it may see). A block whose bound on (α − 1) z′ stays below L_i − margin for every query of its
    row group that may attend it holds no member (:func:`_reaching_blocks`).
    """
    G, B, nkb, rows = lay.G, lay.B, lay.nkb, lay.query_live.shape[0]
    low, high = (x.view(G, nkb, -1).transpose(1, 2) for x in lay.extrema(lay.ki[:-1]))  # (G, r, nkb)
    box = _box_bounds(lay.qi.view(G, lay.nqb, B, -1), low, high)  # (G·nqb, nkb) ≥ z′
    ranked = box.masked_fill(~lay.allowed, _NEG_INF).topk(min(_LOWER_BLOCKS, nkb), dim=-1)  # (G·nqb, t)
    ids = torch.arange(rows, device=box.device)
    flat = lay.flat_blocks(ids, ranked.indices.masked_fill(ranked.values == _NEG_INF, -1))
    lower = lay.qi.new_empty(rows, B)
    step = max(1, chunk_entries(box.device) // (B * flat.shape[1] * B))
    for a in range(0, rows, step):
        at = ids[a : a + step]
        x = lay.scores(lay.qi[at], lay.ki, at, flat[at]).mul_(alpha - 1.0)  # (R, B, t·B) (α − 1) z′
        lower[at] = _threshold_lower_bound(x, alpha)  # +inf where a query sees none of those keys
    lower = torch.where(lay.query_live, lower.masked_fill_(lower.isposinf(), _NEG_INF), float("inf"))
    slack = 64 * torch.finfo(lower.dtype).eps * (1.0 + lower.abs().masked_fill(lower.isinf(), 0.0))
    limit = (lower - margin - slack) / (alpha - 1.0)  # z′ units; rounding keeps a block
    queries = lay.qi.view(G, lay.n_pad, -1)
    return _reaching_blocks(lay, box, queries, low, high, limit), lower


def _threshold_lower_bound(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """A lower bound of τ per row of x = (α − 1)·scores (…, L), −inf on masked entries; +inf on rows with
    no finite entry.

    For α ≤ 2, ``_LOWER_STEPS`` Newton steps on F^{α−1} − 1 from max − 1: that function is convex, so
    steps from below stay below τ (:func:`entmax_threshold`). For α = 1.5 and 2 each step is one fused read
    of x (:func:`attention_kernels.entmax.support_sums.support_sums`: F and F′ from Σ (x − τ)₊, Σ (x − τ)₊²
    and the count). For α > 2, τ itself (x is then shifted in place).
    """
    if alpha > 2.0:
        tau, top = entmax_threshold(x, None, alpha)
        return tau + top
    beta = 1.0 / (alpha - 1.0)
    top = x.amax(-1)  # (…)
    empty = torch.isneginf(top)
    top = top.masked_fill_(empty, 0.0)
    tau = torch.full_like(top, -1.0)  # relative to the maximum: F(−1) ≥ 1, the maximum alone contributes 1
    if alpha in (1.5, 2.0):
        never = torch.full_like(top, float("inf"))
        for _ in range(_LOWER_STEPS):
            s1, s2, count, _ = support_sums(x, top, tau, never, 1.0)
            mass, slope = (s2, 2.0 * s1) if beta == 2.0 else (s1, count)
            tau = newton_step(tau, mass, slope, beta)
    else:
        y, diff = x - top[..., None], torch.empty_like(x)  # (…, L) ≤ 0 or −inf
        for _ in range(_LOWER_STEPS):
            tau = newton_step(tau, *mass_and_slope(y, tau, beta, diff), beta)
    return (tau + top).masked_fill_(empty, float("inf"))


def _principal_basis(lay: _Layout) -> torch.Tensor:
    """(G, d, d) orthonormal: per group, the eigenvectors of Σ_j k_j k_jᵀ over the valid keys
    (:func:`~attention_kernels.indexed.principal_axes.principal_axes`: the bounds hold in any orthonormal
    basis, and in this one they are several-fold tighter, at the price of two n × d × d products)."""
    keys = lay.k[:-1].view(lay.G, lay.m_pad, -1)
    keys = keys * lay.key_valid.view(lay.G, lay.m_pad, 1)
    return principal_axes(keys.transpose(1, 2) @ keys)  # (G, d, d)


def _bound_factors(lay: _Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Factors of an upper bound on the exact scores of each (query, key block), in the keys' principal
    basis (:func:`_principal_basis`): queries (G, n_pad, c + 1) and key-block lows and highs
    (G, c + 1, nkb) with

        z_ij ≤ Σ_c min(q_ic, 0)·low_cb + Σ_c max(q_ic, 0)·high_cb      for every key j of block b:

    Quest's per-channel bound on the c = ``_QUEST_AXES`` leading axes, and Cauchy–Schwarz on the rest,
    |q_rest|·max_j |k_j,rest|, as one more channel (q ≥ 0 there, low = high). On the trailing axes the
    keys are close to isotropic noise, where one norm bound is tighter than a sum of per-channel ones.
    """
    G, d, B = lay.G, lay.d, lay.B
    c = min(_QUEST_AXES, d)
    basis = _principal_basis(lay)  # eigenvalues ascending: the leading axes come last
    keys = torch.bmm(lay.k[:-1].view(G, lay.m_pad, d), basis).view(-1, B, d)  # (G·nkb, B, d)
    rest = keys[..., : d - c].norm(dim=-1).masked_fill_(~lay.key_valid, 0.0).amax(1, keepdim=True)
    low, high = lay.extrema(keys[..., d - c :])  # (G·nkb, c)
    low, high = (torch.cat([x, rest], 1).view(G, lay.nkb, c + 1).transpose(1, 2) for x in (low, high))
    queries = torch.bmm(lay.q.view(G, lay.n_pad, d), basis)  # (G, n_pad, d)
    queries = torch.cat([queries[..., d - c :], queries[..., : d - c].norm(dim=-1, keepdim=True)], -1)
    return queries, low.contiguous(), high.contiguous()


def _kept_blocks(lay: _Layout, tau_s: torch.Tensor, alpha: float) -> torch.Tensor:
    """Certified pruning: (G·nqb, nkb) bool, the key blocks whose exact-score bound (:func:`_bound_factors`)
    exceeds τ_S (G·nqb, B) for some query of the row group that may attend them (+inf τ_S: a query with no
    key or padding, which keeps nothing), through :func:`_reaching_blocks`.

    Slack for round-off: 64 ulps of τ_S, and (8 d ulps)·|q_i|·max_j |k_j| for the rotation and the bound's
    products and norms.
    """
    G, d = lay.G, lay.d
    queries, low, high = _bound_factors(lay)
    eps = torch.finfo(tau_s.dtype).eps
    key_norm = (lay.k[:-1].view(G, -1, d).norm(dim=-1) * lay.key_valid.view(G, -1)).amax(1)  # (G,)
    rotation = 8 * d * eps * lay.q.norm(dim=-1).view(G, -1) * key_norm[:, None]  # (G, n_pad)
    slack = 64 * eps * (1.0 + tau_s.abs().masked_fill(tau_s.isinf(), 0.0))
    limit = ((tau_s - slack) / (alpha - 1.0)).view(G, -1) - rotation  # (G, n_pad) in score units
    box = _box_bounds(queries.view(G, lay.nqb, lay.B, -1), low, high)  # (G·nqb, nkb)
    return _reaching_blocks(lay, box, queries, low, high, limit.view_as(tau_s))


def _exact_threshold(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """τ (N,) of each row of scores (N, L) (−inf masked) in (α − 1)·score units; +inf on empty rows.

    α = 1.5 and 2: the bucketed path's exact search
    (:func:`attention_kernels.bucketed.torch_path.exact_row_thresholds`). Other α: τ ≥ max − 1 (the maximum
    alone has mass 1), so only entries x = (α − 1)·z ≥ max − 1 can be in the support: the rows are packed to
    those (:func:`_compact`) and solved there.
    """
    if alpha in (1.5, 2.0):
        return exact_row_thresholds(scores, alpha)
    x = scores * (alpha - 1.0)  # (N, L)
    top = x.amax(-1, keepdim=True)
    near = x >= top.masked_fill(top.isneginf(), float("inf")) - 1.0  # empty rows keep nothing
    count = near.view(torch.uint8).sum(-1, dtype=torch.int32)
    tau, shift = entmax_threshold(_compact(x, near, count), None, alpha)
    return tau + shift


def _predicted(
    lay: _Layout,
    rows: torch.Tensor,
    flat: torch.Tensor,
    lower: torch.Tensor,
    alpha: float,
    margin: float,
    candidates: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ŝ over the key blocks ``flat`` (R, K) of row groups, from pass 1's lower bounds ``lower`` (R, B) as
    the threshold's starting point: (R, B, K·B) bool and the uncapped counts (R, B)."""
    x = lay.scores(lay.qi[rows], lay.ki, rows, flat).mul_(alpha - 1.0)  # (R, B, K·B) (α − 1) z′
    tau, _ = entmax_threshold(x, lower, alpha)  # (R, B) τ′ − max, +inf on queries with no key; x − max
    chosen = (x >= (tau - margin)[..., None]) & lay.query_live[rows][..., None]  # padding queries: none
    count = chosen.sum(-1)  # (R, B)
    over = (count > candidates).nonzero(as_tuple=True)
    if over[0].numel():  # keep the top `candidates` by z′ (rare: a sign that `candidates` is small)
        sub = x[over].masked_fill(~chosen[over], _NEG_INF)  # (rows over, K·B)
        best = sub.topk(candidates, dim=-1).indices
        chosen[over] = torch.zeros_like(sub, dtype=torch.bool).scatter_(1, best, True)
    return chosen, count


def _compact(values: torch.Tensor, keep: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The kept entries of each row of values (…, L), packed to the left of (N, max count) rows padded with
    −inf; ``count`` (…) is the number kept per row. O(kept) beyond one masked select: thresholds over Ŝ
    then cost passes over |Ŝ| entries per query rather than over its padded tile row."""
    count = count.reshape(-1)
    width = int(count.max()) if count.numel() else 0
    packed = values.new_full((count.numel(), max(width, 1)), _NEG_INF)
    kept = values.masked_select(keep)  # (M,) row-major
    row = torch.repeat_interleave(torch.arange(count.numel(), device=values.device), count)
    pos = torch.arange(kept.numel(), device=values.device) - (count.cumsum(0) - count)[row]
    packed[row, pos] = kept
    return packed


def _run_certified(lay: _Layout, *, alpha: float, margin: float, stats: dict[str, float]) -> torch.Tensor:
    """Certified mode over all row groups; returns (G·nqb, B, d_v).

    1. Exact scores over the needed key blocks (pass 1's), τ_S their exact threshold — a subset of the row,
       so τ_S ≤ τ — and entmax attention over those blocks.
    2. The bound on every key block against τ_S. Where the kept blocks all lie among the needed ones, no
       key outside has weight: τ_S = τ and step 1's output is the answer.
    3. The other row groups are recomputed over their kept blocks, from τ_S.
    """
    clock = time.perf_counter()
    with torch.no_grad():
        need, _ = _indexer_blocks(lay, alpha, margin)  # (G·nqb, nkb)
        chunks = _sorted_chunks(need, lay.B * lay.B)
    stats["indexer_s"] += time.perf_counter() - clock
    out = lay.q.new_zeros(lay.G * lay.nqb, lay.B, lay.v.shape[-1])
    tau_s = torch.full(lay.query_live.shape, float("inf"), dtype=lay.q.dtype, device=lay.q.device)
    for rows, blocks in chunks:
        clock = time.perf_counter()
        flat = lay.flat_blocks(rows, blocks)  # (R, K)
        scores = lay.scores(lay.q[rows], lay.k, rows, flat)  # (R, B, K·B) exact z
        with torch.no_grad():
            tau = _exact_threshold(scores.detach().view(-1, scores.shape[-1]), alpha).view(len(rows), -1)
        tau_s[rows] = tau
        out.index_copy_(0, rows, _weighted_values(lay, scores, flat, tau, alpha, "exact"))
        stats["sparse_s"] += time.perf_counter() - clock
    clock = time.perf_counter()
    with torch.no_grad():
        keep = _kept_blocks(lay, tau_s, alpha)  # (G·nqb, nkb)
        redo = (keep & ~need).any(1).nonzero().squeeze(1)  # weight may lie outside the needed blocks
        chunks = _sorted_chunks(keep[redo], lay.B * lay.B)
    stats["bounds_s"] += time.perf_counter() - clock
    stats["queries"] = float(lay.query_live.sum())
    # blocks whose exact scores were computed: the needed ones, and a recomputed group's others
    stats["kept_blocks"] = float(need.sum()) + float((keep[redo] & ~need[redo]).sum())
    stats["recomputed"] = float(len(redo))
    stats["predicted"] = _needed_keys(lay, need)
    for order, blocks in chunks:
        clock = time.perf_counter()
        rows = redo[order]
        flat = lay.flat_blocks(rows, blocks)
        scores = lay.scores(lay.q[rows], lay.k, rows, flat)
        out.index_copy_(0, rows, _weighted_values(lay, scores, flat, tau_s[rows], alpha, "trusted"))
        stats["sparse_s"] += time.perf_counter() - clock
    return out


def _needed_keys(lay: _Layout, need: torch.Tensor) -> float:
    """Σ over live queries of the valid keys in their row group's needed blocks need (G·nqb, nkb)."""
    per_block = lay.key_valid.view(lay.G, 1, lay.nkb, lay.B).sum(-1)  # (G, 1, nkb)
    per_group = (need.view(lay.G, lay.nqb, lay.nkb) * per_block).sum(-1)  # (G, nqb)
    return float((per_group * lay.query_live.view(lay.G, lay.nqb, lay.B).sum(-1)).sum())


def _weighted_values(
    lay: _Layout, scores: torch.Tensor, flat: torch.Tensor, tau: torch.Tensor | None, alpha: float, how: str
) -> torch.Tensor:
    """Σ_j p_ij v_j (R, B, d_v) for α-entmax p of scores (R, B, K·B) over key blocks ``flat`` (R, K), with
    the threshold ``tau`` (R, B) taken as ``how`` says (:class:`RowEntmax`)."""
    probs = RowEntmax.apply(scores, tau, alpha, how)
    vb = lay.v.index_select(0, flat.reshape(-1)).view(len(flat), -1, lay.v.shape[-1])  # (R, K·B, d_v)
    return torch.bmm(probs, vb)


def _run_approximate(
    lay: _Layout, *, alpha: float, margin: float, candidates: int, stats: dict[str, float]
) -> torch.Tensor:
    """Approximate mode over all row groups: α-entmax over the predicted sets Ŝ; returns (G·nqb, B, d_v)."""
    B = lay.B
    out = lay.q.new_zeros(lay.G * lay.nqb, B, lay.v.shape[-1])
    clock = time.perf_counter()
    with torch.no_grad():
        need, lower = _indexer_blocks(lay, alpha, margin)
        chunks = _sorted_chunks(need, B * B)
    stats["indexer_s"] += time.perf_counter() - clock
    for rows, blocks in chunks:
        clock = time.perf_counter()
        with torch.no_grad():
            flat = lay.flat_blocks(rows, blocks)  # (R, K)
            chosen, count = _predicted(lay, rows, flat, lower[rows], alpha, margin, candidates)
            stats["predicted"] += float(count.clamp_max(candidates).sum())
            stats["filled"] += float((count >= candidates).sum())
        stats["indexer_s"] += time.perf_counter() - clock
        clock = time.perf_counter()
        scores = lay.scores(lay.q[rows], lay.k, rows, flat).masked_fill_(~chosen, _NEG_INF)  # (R, B, K·B)
        out.index_copy_(0, rows, _weighted_values(lay, scores, flat, None, alpha, "guess"))
        stats["kept_blocks"] += float(chosen.view(len(rows), B, -1, B).any(-1).any(1).sum())
        stats["sparse_s"] += time.perf_counter() - clock
    stats["queries"] = float(lay.query_live.sum())
    return out


# ----------------------------------------------------------------------------------------------- entry


def _validate(
    q: object,
    k: object,
    v: object,
    q_index: object,
    k_index: object,
    alpha: object,
    causal: object,
    key_valid: object,
    scale: object,
    margin: object,
    mode: object,
    candidates: object,
    block: object,
    return_stats: object,
    order: object,
    backend: object,
) -> None:
    """Raise ValueError naming the first bad argument."""
    omitted = q_index is None and k_index is None  # certified on the scanned kernel (index_needed)
    indices = {} if omitted else {"q_index": q_index, "k_index": k_index}
    batch, heads, n, m, _ = check_qkv(q, k, v, same_value_dim=False, **indices)
    if omitted:
        if mode != "certified":
            raise ValueError(f"mode {mode!r} needs q_index and k_index; only mode 'certified' may omit them")
        assert isinstance(q, torch.Tensor)
        if not isinstance(alpha, Real) or index_needed(float(alpha), q, "certified", backend):
            raise ValueError(
                "q_index and k_index may be omitted only where the scanned CPU kernel runs certified mode "
                "(CPU tensors, alpha 1.5 or 2, backend 'auto', the C++ kernel built); pass them"
            )
    else:
        assert isinstance(q_index, torch.Tensor) and isinstance(k_index, torch.Tensor)
        r = q_index.shape[3]
        if tuple(q_index.shape) != (batch, heads, n, r) or r < 1:
            raise ValueError(
                f"q_index must be (batch, heads, n, r ≥ 1) = ({batch}, {heads}, {n}, r); got "
                f"{tuple(q_index.shape)}"
            )
        if tuple(k_index.shape) != (batch, heads, m, r):
            raise ValueError(
                f"k_index must be (batch, heads, m, r) = ({batch}, {heads}, {m}, {r}); got "
                f"{tuple(k_index.shape)}"
            )
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha <= 1:
        raise ValueError(f"alpha must be a finite number > 1 (1.5 = entmax15, 2 = sparsemax); got {alpha!r}")
    check_causal(causal, n, m)
    if key_valid is not None and (
        not isinstance(key_valid, torch.Tensor)
        or key_valid.dtype != torch.bool
        or tuple(key_valid.shape) != (batch, m)
        or key_valid.device != q.device
    ):
        raise ValueError(f"key_valid must be None or a bool tensor (batch, m) = ({batch}, {m}) on q's device")
    check_scale(scale)
    if isinstance(margin, bool) or not isinstance(margin, Real) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number ≥ 0; got {margin!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    for name, x in (("candidates", candidates), ("block", block)):
        if isinstance(x, bool) or not isinstance(x, Integral) or x < 1:
            raise ValueError(f"{name} must be an integer ≥ 1; got {x!r}")
    if not isinstance(return_stats, bool):
        raise ValueError(f"return_stats must be True or False; got {return_stats!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}; got {order!r}")


def _resolve_backend(
    backend: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, order: str
) -> str:
    """The backend that will run ("triton" or "torch"); a one-line ValueError for a bad or impossible one."""
    chosen = check_backend(backend, q)
    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if backend == "triton":
        if mode != "certified":
            raise ValueError(f"backend 'triton' runs mode 'certified' only; got mode {mode!r}")
        if order != "position":
            raise ValueError(f"backend 'triton' runs order 'position' only; got order {order!r}")
        if grads:
            raise ValueError(
                "backend 'triton' is forward-only (inference): call it under torch.no_grad() or use "
                "backend 'auto' or 'torch' when gradients are needed"
            )
    elif chosen == "triton" and (mode != "certified" or order != "position" or grads):
        chosen = "torch"
    return chosen


def index_needed(alpha: float, q: torch.Tensor, mode: str, backend: str = "auto") -> bool:
    """Whether :func:`indexed_attention` reads q_index and k_index for these arguments: everywhere but
    certified mode on the scanned CPU kernel, which scores every pair itself (CPU tensors, α 1.5 or 2,
    ``backend="auto"``, the C++ kernel built). A caller may then skip computing the index."""
    return not (mode == "certified" and backend == "auto" and scanned_kernel(alpha, q) is not None)


def indexed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_index: torch.Tensor | None,
    k_index: torch.Tensor | None,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    key_valid: torch.Tensor | None = None,
    scale: float | None = None,
    margin: float = 0.0,
    mode: str = "certified",
    candidates: int = 64,
    block: int = 32,
    return_stats: bool = False,
    backend: str = "auto",
    order: str = "position",
) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
    """Indexed α-entmax attention (module docstring); returns (batch, heads, n, d_v) in q's dtype.

    q (b, h, n, d); k (b, h, m, d); v (b, h, m, d_v); q_index (b, h, n, r), k_index (b, h, m, r): the
    indexer's projections, constants (no gradient flows to them), both None where :func:`index_needed` says
    they are not read. key_valid (b, m) bool, True on real keys.
    ``mode="certified"`` equals dense α-entmax attention for every input; ``"approximate"`` is α-entmax over
    the predicted sets Ŝ only. Differentiable in q, k and v. With ``return_stats``, also a dict:
    ``blocks_skipped`` (share of the allowed (query block, key block) pairs whose exact scores were never
    computed), ``predicted_mean`` (approximate: mean |Ŝ_i| over queries with a key; certified: mean number
    of keys in the needed blocks, the set τ_S is taken over), ``filled`` (approximate: share of those whose
    predicted set reached ``candidates``, raise it; certified: 0, nothing is capped), ``recomputed``
    (certified: share of row groups done again over their kept blocks), and seconds spent in
    ``indexer_s`` (the order's clustering included), ``bounds_s`` and ``sparse_s``. ``order``: how tokens
    are laid out in blocks, ``"position"`` or ``"clustered"`` (:func:`clustered_orders`: the support of a
    query spread over the whole prefix falls into few key blocks); the output is the same either way.
    ``backend``: "auto", "triton" or "torch" (module docstring). Where "auto" runs the scanned CPU kernel,
    ``block``, ``order`` and the indexer do not change its work, ``blocks_skipped`` counts its (48-query tile,
    128-key chunk) pairs and ``predicted_mean`` the keys it kept per query; the Triton forward (order
    "position" only) rounds ``block`` to its tile size (a power of two in [16, 128]), its output equals this
    path's to fp32 round-off.
    Bad arguments raise a one-line ValueError before any work.
    """
    _validate(
        q,
        k,
        v,
        q_index,
        k_index,
        alpha,
        causal,
        key_valid,
        scale,
        margin,
        mode,
        candidates,
        block,
        return_stats,
        order,
        backend,
    )
    if _resolve_backend(backend, q, k, v, mode, order) == "triton":
        from attention_kernels.indexed.triton_kernel import triton_indexed_attention

        return triton_indexed_attention(
            q,
            k,
            v,
            q_index,
            k_index,
            alpha=float(alpha),
            causal=causal,
            key_valid=key_valid,
            scale=scale,
            margin=float(margin),
            block=int(block),
            return_stats=return_stats,
        )
    b, h, n, d = q.shape
    scale = d**-0.5 if scale is None else float(scale)
    if backend == "auto" and scanned_kernel(float(alpha), q) is not None:
        clock = time.perf_counter()
        out, counts = scanned_attention(
            q, k, v, alpha=float(alpha), causal=causal, key_valid=key_valid, scale=scale,
            index=None if mode == "certified" else (q_index, k_index), margin=float(margin),
            candidates=int(candidates),
        )  # fmt: skip
        if not return_stats:
            return out
        return out, {
            "blocks_skipped": counts["chunks_skipped"],
            "recomputed": 0.0,
            "predicted_mean": counts["kept_mean"],
            "filled": counts["filled"],
            "indexer_s": 0.0,
            "bounds_s": 0.0,
            "sparse_s": time.perf_counter() - clock,
        }
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32  # normaliser never in half
    stats = dict.fromkeys(
        ("indexer_s", "bounds_s", "sparse_s", "predicted", "filled", "queries", "kept_blocks", "recomputed"),
        0.0,
    )
    clock = time.perf_counter()
    if mode == "approximate":
        q_index, k_index = on_grid(q_index), on_grid(k_index)
    orders = clustered_orders(q_index, k_index, block=int(block)) if order == "clustered" else None
    stats["indexer_s"] += time.perf_counter() - clock
    lay = _Layout(
        q,
        k,
        v,
        q_index.detach(),
        k_index.detach(),
        key_valid,
        block=int(block),
        causal=causal,
        scale=scale,
        compute=compute,
        orders=orders,
    )
    if mode == "certified":
        out = _run_certified(lay, alpha=float(alpha), margin=float(margin), stats=stats)
    else:
        out = _run_approximate(
            lay, alpha=float(alpha), margin=float(margin), candidates=int(candidates), stats=stats
        )
    out = out.view(lay.G, lay.n_pad, -1)[:, :n]  # (G, n, d_v) in the layout's order
    if orders is not None:  # back to positions
        out = out.gather(1, torch.argsort(orders[0], dim=1)[..., None].expand_as(out))
    out = out.reshape(b, h, n, -1).to(q.dtype)
    if not return_stats:
        return out
    allowed = float(lay.allowed.sum())
    queries = max(stats["queries"], 1.0)
    report = {
        "blocks_skipped": 1.0 - stats["kept_blocks"] / allowed if allowed else 0.0,
        "recomputed": stats["recomputed"] / (lay.G * lay.nqb),
        "predicted_mean": stats["predicted"] / queries,
        "filled": stats["filled"] / queries,
        "indexer_s": stats["indexer_s"],
        "bounds_s": stats["bounds_s"],
        "sparse_s": stats["sparse_s"],
    }
    return out, report


def predicted_sets(
    q_index: torch.Tensor,
    k_index: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    key_valid: torch.Tensor | None = None,
    scale: float,
    margin: float = 0.0,
    candidates: int = 64,
    block: int = 32,
) -> torch.Tensor:
    """The indexer's predicted sets Ŝ as a dense (b, h, n, m) bool tensor: for inspection and tests only.

    ``scale`` is the attention's (1/√d of the full head dim, not of r).
    """
    b, h, n, _ = q_index.shape
    m = k_index.shape[2]
    q_index, k_index = on_grid(q_index), on_grid(k_index)
    q = q_index.new_zeros(b, h, n, 1)
    k = k_index.new_zeros(b, h, m, 1)
    compute = torch.float64 if q_index.dtype == torch.float64 else torch.float32
    lay = _Layout(
        q, k, k, q_index, k_index, key_valid, block=block, causal=causal, scale=scale, compute=compute
    )
    need, lower = _indexer_blocks(lay, alpha, margin)
    rows = torch.arange(lay.G * lay.nqb, device=q_index.device)
    blocks = _block_lists(need, lay.nkb)  # (G·nqb, nkb)
    chosen, _ = _predicted(lay, rows, lay.flat_blocks(rows, blocks), lower, alpha, margin, candidates)
    # key position within its group; padding blocks go to one extra block of columns, dropped below
    pos = torch.where(blocks >= 0, blocks, lay.nkb)[..., None] * lay.B + torch.arange(
        lay.B, device=blocks.device
    )
    out = torch.zeros(lay.G * lay.nqb, lay.B, lay.m_pad + lay.B, dtype=torch.bool, device=q_index.device)
    out.scatter_(2, pos.view(len(rows), 1, -1).expand_as(chosen), chosen)  # real blocks never repeat
    out = out.view(lay.G, lay.n_pad, -1)
    return out[:, :n, :m].reshape(b, h, n, m)


def dense_indexed_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    key_valid: torch.Tensor | None = None,
    scale: float | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense α-entmax attention over all masked scores (tests only: O(n·m) memory).

    ``allowed`` (b, h, n, m) bool further restricts the keys (the approximate mode's Ŝ).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    n, m = q.shape[2], k.shape[2]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q.to(compute) @ k.to(compute).transpose(-1, -2)) * scale  # (b, h, n, m)
    mask = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if causal:
        mask = mask.tril()
    mask = mask.expand(*scores.shape)
    if key_valid is not None:
        mask = mask & key_valid[:, None, None, :]
    if allowed is not None:
        mask = mask & allowed
    probs = entmax_normalize(scores.masked_fill(~mask, _NEG_INF), alpha)
    return (probs @ v.to(compute)).to(q.dtype)
