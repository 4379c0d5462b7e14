"""Sampling the attention graph of an SBM-Transformer head, and its straight-through gradient.

A head's stochastic block model gives every query–key pair (i, j) of a graph the rate

    p_ij = Q̂_i Ŝ K̂_jᵀ ∈ [0, 1]      (memberships Q̂ (n, k), K̂ (m, k) in (0, 1); Ŝ (k, k) sums to 1)

and both samplers below draw the edges independently with

    P(edge i → j) = 1 − exp(−p_ij)

- :func:`bernoulli_graph` (dense, O(n·m)): M_ij = [u_ij < 1 − exp(−p_ij)] on the whole matrix.
- :func:`fastrg_edges` (fastRG, sub-quadratic): a Poisson multigraph with rate p_ij per pair, duplicates
  collapsed. Pair (i, j) then carries Poisson(p_ij) copies, so it is present with probability
  1 − exp(−p_ij): the same distribution as the dense sampler (p ≤ 1 keeps both close to p itself, which the
  paper's Bernoulli(p) uses). The draw is conditioned on the query: row i draws its edge count
  N_i ~ Poisson(Σ_b w_ib) from its masses w_ib = (Q̂_i Ŝ)_b · Σ_{j < l_i} K̂_jb over the key clusters b,
  then for every edge the key cluster b ~ w_i· / Σ w_i· and the key j ~ K̂_·b restricted to j < l_i
  (the per-cluster multinomial over normalised memberships). No n × m tensor is formed: O((n + m)·k) for the
  masses, O(E·k) for the E edges. A row's keys are limited to j < l_i, so a causal row draws only from its
  prefix and its draw never depends on later keys.

Randomness is counter-based: every uniform is a hash of (key, counters) (:func:`counter_uniforms`), so a
draw depends on the pair's (or row's) own counters only, not on the shape of the call or the device; a
prefix of a sequence is drawn exactly as the whole sequence's prefix.

:func:`straight_through` puts a sampled graph M into the attention: the output uses probs ⊙ M (M = 1 on the
edges), and the backward pass gives the edge rates ∂L/∂p = hardtanh(M ⊙ ∂L/∂M), zero off the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
COUNT_STREAM, CLUSTER_STREAM, KEY_STREAM = 0, 1, 2


def _mix32(x: Tensor | int) -> Tensor | int:
    """A 32-bit integer hash (lowbias32) of x in [0, 2³²), held in int64 (or a Python int)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32  # int64 products may wrap; their low 32 bits are still exact
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def counter_uniforms(key: int, *counters: Tensor | int) -> Tensor:
    """Uniforms in (0, 1), float64, one per element of the broadcast ``counters`` (integers ≥ 0).

    A hash of ``key`` and the counters in order: equal counters give equal uniforms on every device and in
    every call shape. Counters that vary most (key positions) are best given last: only the hashes from
    there on are computed at the full broadcast size.
    """
    state: Tensor | int = _mix32((key ^ (key >> 32)) & MASK32)
    for counter in counters:
        state = _mix32(((state + GOLDEN) & MASK32) ^ (counter & MASK32))
    if not isinstance(state, Tensor):
        raise ValueError("counter_uniforms needs at least one tensor counter")
    return (state.double() + 0.5) / 2.0**32


def bernoulli_graph(p: Tensor, key: int, *counters: Tensor | int) -> Tensor:
    """The dense sampler: M = [u < 1 − exp(−p)] elementwise, u = :func:`counter_uniforms` (key, counters).

    ``counters`` broadcast to ``p``'s shape (e.g. graph (G, 1, 1), query position (n, 1), key (m,)).
    Returns a boolean tensor shaped like ``p``; no gradient.
    """
    return counter_uniforms(key, *counters) < -torch.expm1(-p.detach().double())


def poisson_inverse(rate: Tensor, uniform: Tensor) -> Tensor:
    """Poisson(rate) counts by inversion: the smallest c ≥ 0 with P(X ≤ c) ≥ uniform; int64, like ``rate``.

    P(X ≤ c) = Q(c + 1, rate), the regularised upper incomplete gamma function; the search doubles an upper
    bound, then bisects: O(log max count) passes over the rates.
    """
    rate = rate.double()

    def cdf(count: Tensor) -> Tensor:
        return torch.special.gammaincc(count + 1, rate)

    high = rate.ceil()
    while bool((short := cdf(high) < uniform).any()):
        high = torch.where(short, 2 * high + 1, high)
    low = torch.full_like(rate, -1.0)  # P(X ≤ −1) = 0 < uniform ≤ P(X ≤ high)
    while bool((high - low > 1).any()):
        middle = ((low + high) / 2).floor()
        enough = cdf(middle) >= uniform
        high = torch.where(enough, middle, high)
        low = torch.where(enough, low, middle)
    return high.long()


@torch.no_grad()
def fastrg_edges(
    q_members: Tensor,
    blocks: Tensor,
    k_members: Tensor,
    limits: Tensor,
    key: int,
    graph_ids: Tensor,
    positions: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The fastRG sampler (see the module docstring): edges (graph, row, key), duplicates collapsed.

    q_members (G, n, k) and k_members (G, m, k) in [0, 1], blocks (G | 1, k, k) ≥ 0; ``limits`` (n,): row i
    draws keys j < limits[i]; ``graph_ids`` (G,) and ``positions`` (n,) are the counters of each graph
    and row (with ``key``, they fix the draw). Returns three int64 (E,) tensors sorted by (graph, row, key).
    """
    G, n, k = q_members.shape
    m = k_members.shape[1]
    device = q_members.device
    weights = q_members.double() @ blocks.double()  # (G, n, k): Σ_a Q̂_ia Ŝ_ab, row i's weight on cluster b
    cumulative = k_members.double().transpose(1, 2).cumsum(-1)  # (G, k, m): Σ_{j' ≤ j} K̂_j'b
    last = (limits - 1).clamp(min=0).expand(G, k, n)
    prefix = cumulative.gather(-1, last) * (limits > 0)  # (G, k, n): Σ_{j < l_i} K̂_jb
    masses = weights * prefix.transpose(1, 2)  # (G, n, k): w_ib
    rates = masses.sum(-1)  # (G, n)
    graphs, rows = graph_ids[:, None].expand(G, n), positions.expand(G, n)
    counts = poisson_inverse(rates, counter_uniforms(key, COUNT_STREAM, graphs, rows)).flatten()  # (G·n,)

    row = torch.repeat_interleave(torch.arange(G * n, device=device), counts)  # (E,) flat (graph, row)
    draw = torch.arange(row.numel(), device=device) - (counts.cumsum(0) - counts)[row]  # edge t of its row
    g, i = row // n, row % n
    counters = (graph_ids[g], positions[i], draw)
    by_cluster = masses.flatten(0, 1).cumsum(-1)[row]  # (E, k)
    target = counter_uniforms(key, CLUSTER_STREAM, *counters) * by_cluster[:, -1]
    cluster = torch.searchsorted(by_cluster, target[:, None], right=True)[:, 0].clamp(max=k - 1)  # (E,)

    # every (graph, cluster) segment of the key cumsums shifted by (m + 1) · segment: one sorted sequence
    segment = g * k + cluster  # (E,)
    spacing = torch.arange(G * k, device=device, dtype=torch.float64)[:, None] * (m + 1)
    sequence = (cumulative.flatten(0, 1) + spacing).flatten()  # (G·k·m,)
    total = prefix.flatten(0, 1)[segment, i]  # (E,)
    target = spacing[segment, 0] + counter_uniforms(key, KEY_STREAM, *counters) * total
    j = torch.searchsorted(sequence, target, right=True) - segment * m
    j = torch.minimum(j, limits[i] - 1).clamp(min=0)

    unique = torch.unique((g * n + i) * m + j)  # sorted; duplicates collapsed
    return unique // (n * m), (unique // m) % n, unique % m


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, probs: Tensor, rates: Tensor, graph: Tensor) -> tuple[Tensor, Tensor]:
        edges = graph.to(probs.dtype)
        ctx.save_for_backward(probs, edges)
        ctx.rates_dtype = rates.dtype
        return probs * edges, edges.sum((0, 2, 3))

    @staticmethod
    def backward(ctx, grad_output: Tensor, grad_edges: Tensor) -> tuple[Tensor, Tensor, None]:
        probs, edges = ctx.saved_tensors
        grad_graph = grad_output * probs + grad_edges.view(1, -1, 1, 1)  # ∂L/∂M (both uses of M)
        grad_rates = torch.nn.functional.hardtanh(edges * grad_graph).to(ctx.rates_dtype)
        return grad_output * edges, grad_rates, None


def straight_through(probs: Tensor, rates: Tensor, graph: Tensor) -> tuple[Tensor, Tensor]:
    """(probs ⊙ M, edges per head Σ M) for a sampled graph M, with the straight-through gradient to the rates.

    probs, rates (b, h, n, D) float and graph (b, h, n, D) bool, laid out alike (D = m dense, or a padded
    list of each row's edges). Forward: the hard M (1 on the edges), so the outputs are probs on the graph
    and the edge count per head (h,). Backward: ∂L/∂probs = M ⊙ ∂L/∂out, and ∂L/∂p = hardtanh(M ⊙ ∂L/∂M)
    with ∂L/∂M = ∂L/∂out ⊙ probs + ∂L/∂edges, the total over both uses of M; no gradient off the graph.
    """
    return _StraightThrough.apply(probs, rates, graph)
