"""SBM-Transformer: attention on a graph drawn from a learned stochastic block model (Cho et al., 2022).

Every head h of a configured self-attention layer has a 2-layer MLP (d → d, ReLU, d → d) and k cluster
embeddings C (k × d). For queries Q (n × d) and keys K (m × d):

    Ŝ = softmax over all k² entries of C Cᵀ,   Q̂ = σ(MLP(Q) Cᵀ),   K̂ = σ(MLP(K) Cᵀ),   p_ij = Q̂_i Ŝ K̂_jᵀ

A graph M of pairs is drawn from p (edge i → j with probability 1 − exp(−p_ij), see
:mod:`pipeline.attention.sbm_sampling`), and the head attends on its edges only:

    P_i = α-entmax(scaling · q_i K_{M_i}ᵀ + B_{i, M_i}, masked by −inf),   out_i = Σ_{j ∈ M_i} M_ij P_ij v_j

with the model's own normalizer (α from :func:`~pipeline.attention.entmax.attention_alpha`; α = 1 is
softmax), mask and position bias. M enters the output as the factor M_ij = 1 on the edges, so ∂L/∂M_ij =
P_ij (v_j · ∂L/∂out_i) is defined there; the straight-through backward gives ∂L/∂p_ij = hardtanh(M_ij ·
∂L/∂M_ij), nothing to unsampled pairs (:func:`~pipeline.attention.sbm_sampling.straight_through`).

- Every query keeps its own key (the diagonal of self-attention), counted once; causal kinds get edges for
  j ≤ i only, exactly. M is always within the pairs the model's mask allows; rows with none give zeros.
- Sequences of at most ``sparse_above`` keys use the dense layout: p, M and the scores are (n × m), M drawn
  by the Bernoulli sampler. Longer ones use fastRG and attend in a padded (rows, max degree) list of each
  row's edges, reading keys, values, mask and bias at the edges only: memory O(edges), no n × m tensor.
- Training: a fresh draw per call, its key drawn from torch's global CPU RNG (the Trainer seeds it); the
  uniforms are counter-based (a hash of the key, batch row and head, query position and key position or
  edge number), so a row's draw never depends on later positions.
- Regulariser: the density of a head, edges / valid pairs (pairs the mask allows to real queries), is kept
  from the last training call; the registered loss penalty adds density_weight · its mean over heads.
- Evaluation (module not training) is deterministic: ``expected`` keeps the edges with p_ij ≥ threshold,
  ``sampled`` draws M_ij = [u_ij < 1 − exp(−p_ij)] with u_ij a hash of (seed, kind, layer, head, query
  position, key position), positions counted from the row's first real token: the same for every batch
  row, whatever its padding. Both evaluate p on every allowed pair (O(n·m)
  time; on the sparse path query chunks bound the memory).

A cached decoding step (queries at positions m − n … m − 1 over m keys) is the last rows of a length-m
sequence: it gets exactly the uncached pass's graph in evaluation.

The configuration lives in ``config.sbm`` (see :func:`attach_sbm`); every self-attention module of the
configured kinds carries an :class:`SBMHead`. Cross-attention and modules without a head compute plain
α-entmax. Importing this module registers ``attn_implementation="sbm"``, its state attacher (so
:func:`pipeline.attention.load_model` rebuilds the heads from the config) and its loss penalty.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from attention_kernels.entmax.dense import entmax_normalize
from pipeline.attention.counting import PairCounter
from pipeline.attention.entmax import attention_alpha, compute_dtype
from pipeline.attention.heads import (
    SELF_KINDS,
    attach_heads,
    check_integer,
    check_kinds,
    check_setting_names,
    head_attention,
    head_shape,
    heads_of_type,
    is_finite_number,
    state_attacher,
)
from pipeline.attention.interface import (
    mask_scores,
    register_attention,
    register_loss_penalty,
    register_state_attacher,
)
from pipeline.attention.sbm_sampling import bernoulli_graph, fastrg_edges, straight_through
from pipeline.attention_kinds import attention_kind
from pipeline.errors import UserError

SBM = "sbm"
EVALUATIONS = ("expected", "sampled")
SPEC_KEYS = ("clusters", "kinds", "density_weight", "sparse_above", "evaluation", "threshold", "seed")
CHUNK_PAIRS = 1 << 22  # evaluation on the sparse path: query rows per chunk × keys × graphs at most this


class SBMHead(PairCounter):
    """The block models of one attention module's heads, batched over heads, and how it samples.

    Parameters: the MLP ``hidden_weight``, ``output_weight`` (h, d, d), ``hidden_bias``, ``output_bias``
    (h, d) and the ``clusters`` (h, k, d), drawn from torch's global RNG. ``density`` holds the per-head
    density (h,) of the last training call, with its straight-through gradient, until it is taken.
    """

    def __init__(
        self,
        heads: int,
        head_dim: int,
        clusters: int,
        layer: int,
        kind: str,
        *,
        density_weight: float,
        sparse_above: int,
        evaluation: str,
        threshold: float,
        seed: int,
    ) -> None:
        super().__init__()
        bound = head_dim**-0.5  # nn.Linear's default initialisation
        self.hidden_weight = nn.Parameter(torch.empty(heads, head_dim, head_dim).uniform_(-bound, bound))
        self.hidden_bias = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.output_weight = nn.Parameter(torch.empty(heads, head_dim, head_dim).uniform_(-bound, bound))
        self.output_bias = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.clusters = nn.Parameter(torch.randn(heads, clusters, head_dim) * bound)
        self.layer, self.kind, self.causal = layer, kind, attention_kind(kind).causal
        self.density_weight, self.sparse_above = density_weight, sparse_above
        self.evaluation, self.threshold, self.seed = evaluation, threshold, seed
        self.density: Tensor | None = None

    def extra_repr(self) -> str:
        heads, clusters, head_dim = self.clusters.shape
        return (
            f"heads={heads}, head_dim={head_dim}, clusters={clusters}, {self.kind}, layer={self.layer}, "
            f"sparse_above={self.sparse_above}, evaluation={self.evaluation}, threshold={self.threshold}, "
            f"seed={self.seed}"
        )

    def members(self, x: Tensor) -> Tensor:
        """Cluster memberships σ(MLP(x) Cᵀ) (b, h, n, k) of queries or keys x (b, h, n, d), computed in
        :func:`~pipeline.attention.entmax.compute_dtype` of x (float32, or float64 for float64 x)."""
        compute = compute_dtype(x.dtype)
        hidden_weight, hidden_bias = self.hidden_weight.to(compute), self.hidden_bias.to(compute)
        output_weight, output_bias = self.output_weight.to(compute), self.output_bias.to(compute)
        hidden = torch.einsum("bhnd,hde->bhne", x.to(compute), hidden_weight) + hidden_bias[:, None]
        hidden = torch.relu(hidden)
        out = torch.einsum("bhnd,hde->bhne", hidden, output_weight) + output_bias[:, None]
        return torch.sigmoid(torch.einsum("bhnd,hkd->bhnk", out, self.clusters.to(compute)))

    def blocks(self, dtype: torch.dtype | None = None) -> Tensor:
        """The block matrices Ŝ (h, k, k): a softmax over all k² entries of C Cᵀ, in ``dtype`` (that of the
        memberships they meet; by default float32, or float64 for a float64 head)."""
        clusters = self.clusters.to(compute_dtype(self.clusters.dtype) if dtype is None else dtype)
        affinity = clusters @ clusters.transpose(-1, -2)  # (h, k, k)
        return torch.softmax(affinity.flatten(1), dim=-1).view_as(affinity)

    def __deepcopy__(self, memo: dict[int, Any]) -> SBMHead:
        """A copy without the pending density: a tensor inside an autograd graph cannot be deep-copied, and
        the copy has made no training call of its own."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            copied.__dict__[name] = None if name == "density" else copy.deepcopy(value, memo)
        return copied

    def take_density(self) -> Tensor | None:
        """The last training call's density per head (h,), forgotten once taken (None: no call since)."""
        density, self.density = self.density, None
        return density


def _mask_allows(attention_mask: Tensor, m: int) -> Tensor:
    """(b | 1, 1 | h, n, m) bool: the pairs the model's (boolean or additive) mask allows."""
    mask = attention_mask[..., :m]
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min


def _real_queries(allows: Tensor, n: int) -> Tensor:
    """(b | 1, n) bool: the queries that are real tokens, of a self-attention mask ``allows`` (b | 1, 1 | h,
    n, m) whose queries are the last n keys; a key no query may see is padding, and so is its query."""
    return allows.any(dim=-2).any(dim=1)[:, -n:]


def _allowed(
    attention_mask: Tensor | None, b: int, n: int, m: int, *, causal: bool, device: torch.device
) -> Tensor:
    """(b, 1 | h, n, m) bool: the pairs the model's mask allows to real queries (a padding query attends
    nothing, as in :mod:`pipeline.attention.counting`), j ≤ i as well for causal kinds."""
    if attention_mask is None:
        allowed = torch.ones(1, 1, n, m, dtype=torch.bool, device=device)
    else:
        allowed = _mask_allows(attention_mask, m)
        allowed = allowed & _real_queries(allowed, n)[:, None, :, None]
    if causal:
        rows = torch.arange(m - n, m, device=device)[:, None]
        allowed = allowed & (torch.arange(m, device=device) <= rows)
    return allowed.expand(b, -1, n, m)


def _valid_pairs(
    attention_mask: Tensor | None, b: int, n: int, m: int, *, causal: bool, device: torch.device
) -> Tensor:
    """The number of allowed pairs, the same for every head: a 0-d float tensor (counted, not built, when
    the model gives no mask)."""
    if attention_mask is None:
        per_row = n * m - (n * (n - 1) // 2 if causal else 0)  # causal: Σ_i (m − n + i + 1)
        return torch.tensor(float(b * per_row), device=device)
    return _allowed(attention_mask, b, n, m, causal=causal, device=device).sum().float()


def _own_keys(n: int, m: int, device: torch.device) -> Tensor:
    """(n, m) bool: each query's own key (position m − n + i)."""
    return torch.arange(m, device=device) == torch.arange(m - n, m, device=device)[:, None]


def _rates(q_members: Tensor, blocks: Tensor, k_members: Tensor) -> Tensor:
    """p = Q̂ Ŝ K̂ᵀ: (b, h, n, m) from memberships (b, h, n | m, k) and blocks (h, k, k)."""
    return (q_members @ blocks) @ k_members.transpose(-1, -2)


def _left_padding(
    head: SBMHead, training: bool, attention_mask: Tensor | None, m: int, device: torch.device
) -> Tensor | None:
    """(b | 1,) int64: how many keys of each batch row come before its first real one (left padding: keys
    no query may see), zeros without a mask; None where no graph hashes positions (training, ``expected``)."""
    if training or head.evaluation != "sampled":
        return None
    if attention_mask is None:
        return torch.zeros(1, dtype=torch.long, device=device)
    real_keys = _mask_allows(attention_mask, m).any(dim=-2).any(dim=1)  # (b | 1, m)
    return real_keys.long().argmax(dim=-1)  # the first True; 0 for a row with none


def _eval_graph(head: SBMHead, rates: Tensor, rows: Tensor, m: int, padding: Tensor | None) -> Tensor:
    """The deterministic evaluation graph (b, h, r, m) of rates (b, h, r, m) for query positions ``rows``
    (r,), ``padding`` (b | 1,) each row's left padding (:func:`_left_padding`).

    ``sampled`` hashes each pair's token positions, counted from the row's first real token, so a row's
    graph is the same whatever the padding on either side (a longer row in the batch shifts nothing)."""
    if head.evaluation == "expected":
        return rates >= head.threshold
    heads = torch.arange(rates.shape[1], device=rates.device)[:, None, None]
    salt = SELF_KINDS.index(head.kind)
    assert padding is not None  # _left_padding gives it for every sampled evaluation
    padding = padding.view(-1, 1, 1, 1)
    queries = (rows[:, None] - padding).clamp(min=0)  # (b | 1, 1, r, 1)
    keys = (torch.arange(m, device=rates.device) - padding).clamp(min=0)  # (b | 1, 1, 1, m); pads masked
    return bernoulli_graph(rates, head.seed, salt, head.layer, heads, queries, keys)


def _dense(
    head: SBMHead,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    q_members: Tensor,
    k_members: Tensor,
    allowed: Tensor,
    *,
    scaling: float,
    dropout: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(output (b, h, n, d), probs ⊙ M (b, h, n, m), edges per head (h,)) on the n × m layout, ``allowed``
    (b, 1 | h, n, m) the pairs the mask allows (:func:`_allowed`)."""
    b, h, n, _ = query.shape
    m = key.shape[-2]
    rates = _rates(q_members, head.blocks(q_members.dtype), k_members)  # (b, h, n, m)
    rows = torch.arange(m - n, m, device=query.device)
    if module.training:
        draw = int(torch.randint(1 << 31, ()))
        graphs = torch.arange(b * h, device=query.device).view(b, h, 1, 1)
        cols = torch.arange(m, device=query.device)
        graph = bernoulli_graph(rates, draw, graphs, rows[:, None], cols)
    else:
        padding = _left_padding(head, module.training, attention_mask, m, query.device)
        graph = _eval_graph(head, rates.detach(), rows, m, padding)
    graph = (graph | _own_keys(n, m, query.device)) & allowed

    compute = compute_dtype(query.dtype)
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-1, -2)) * scaling  # (b, h, n, m)
    if position_bias is not None:
        scores = scores + position_bias.to(compute)
    scores = mask_scores(scores, attention_mask).masked_fill(~graph, float("-inf"))
    probs = entmax_normalize(scores, attention_alpha(module))
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    probs, edges = straight_through(probs, rates, graph)
    return torch.matmul(probs.to(value.dtype), value), probs, edges


def _sparse_edges(
    head: SBMHead, training: bool, q_members: Tensor, k_members: Tensor, m: int, padding: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The graph as edges (flat batch·head graph, query row, key), before the own keys and the mask;
    ``padding`` (b | 1,): each row's left padding, for the evaluation graph."""
    b, h, n, _ = q_members.shape
    device = q_members.device
    rows = torch.arange(m - n, m, device=device)
    blocks = head.blocks(q_members.dtype).detach()
    if training:
        limits = rows + 1 if head.causal else torch.full_like(rows, m)
        return fastrg_edges(
            q_members.detach().flatten(0, 1),
            blocks.repeat(b, 1, 1),
            k_members.detach().flatten(0, 1),
            limits,
            int(torch.randint(1 << 31, ())),
            torch.arange(b * h, device=device),
            rows,
        )
    chunk = max(1, CHUNK_PAIRS // (b * h * m))
    found = []
    for start in range(0, n, chunk):
        rates = _rates(q_members[:, :, start : start + chunk].detach(), blocks, k_members.detach())
        graph = _eval_graph(head, rates, rows[start : start + chunk], m, padding)
        batch, heads, i, j = graph.nonzero(as_tuple=True)
        found.append((batch * h + heads, i + start, j))
    return tuple(torch.cat(parts) for parts in zip(*found, strict=True))


def _at(tensor: Tensor, g: Tensor, i: Tensor, j: Tensor, heads: int) -> Tensor:
    """``tensor`` (b | 1, h | 1, n, ≥ m) at the pairs (flat graph g = batch·h + head, row i, key j)."""
    batch = g // heads if tensor.shape[0] > 1 else torch.zeros_like(g)
    head = g % heads if tensor.shape[1] > 1 else torch.zeros_like(g)
    return tensor[batch, head, i, j]


def _gather_pairs(tensor: Tensor, cols: Tensor) -> Tensor:
    """``tensor`` (b | 1, h | 1, n, ≥ m) read at keys ``cols`` (b, h, n, D) of each row, no copy of it."""
    return torch.gather(tensor.expand(*cols.shape[:3], -1), -1, cols)


def _sparse(
    head: SBMHead,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    q_members: Tensor,
    k_members: Tensor,
    *,
    scaling: float,
    dropout: float,
) -> tuple[Tensor, Tensor]:
    """(output (b, h, n, d), edges per head (h,)) attending in a padded (rows, max degree) edge layout."""
    b, h, n, d = query.shape
    m = key.shape[-2]
    device = query.device
    padding = _left_padding(head, module.training, attention_mask, m, device)
    g, i, j = _sparse_edges(head, module.training, q_members, k_members, m, padding)
    own = torch.arange(n, device=device)
    g = torch.cat([g, torch.arange(b * h, device=device).repeat_interleave(n)])
    i = torch.cat([i, own.repeat(b * h)])
    j = torch.cat([j, (own + m - n).repeat(b * h)])
    keep = j <= i + (m - n) if head.causal else torch.ones_like(j, dtype=torch.bool)
    if attention_mask is not None:
        allows = _mask_allows(attention_mask, m)
        real = _real_queries(allows, n)  # (b | 1, n)
        keep &= _at(allows, g, i, j, h) & real[g // h if real.shape[0] > 1 else 0, i]
    pairs = torch.unique(((g * n + i) * m + j)[keep])  # sorted by (graph, row, key), duplicates collapsed
    row, col = pairs // m, pairs % m

    # pack every row's edges left-aligned into (rows, max degree), −1 for an empty slot
    degree = torch.bincount(row, minlength=b * h * n)
    width = max(int(degree.max()), 1)
    slot = torch.arange(row.numel(), device=device) - (degree.cumsum(0) - degree)[row]
    cols = torch.full((b * h * n, width), -1, device=device)
    cols[row, slot] = col
    cols = cols.view(b, h, n, width)
    graph = cols >= 0
    cols = cols.clamp(min=0)

    flat = cols.view(b, h, n * width, 1)
    k_edges = torch.gather(key, 2, flat.expand(-1, -1, -1, d)).view(b, h, n, width, d)
    v_edges = torch.gather(value, 2, flat.expand(-1, -1, -1, value.shape[-1])).view(b, h, n, width, -1)
    compute = compute_dtype(query.dtype)
    scores = torch.matmul(query.to(compute)[..., None, :], k_edges.to(compute).transpose(-1, -2))
    scores = scores[..., 0, :] * scaling  # (b, h, n, D)
    if position_bias is not None:
        scores = scores + _gather_pairs(position_bias, cols).to(compute)
    if attention_mask is not None:
        scores = mask_scores(scores, _gather_pairs(attention_mask, cols))
    scores = scores.masked_fill(~graph, float("-inf"))  # (b, h, n, D)
    probs = entmax_normalize(scores, attention_alpha(module))
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)

    weights = q_members @ head.blocks(q_members.dtype)  # (b, h, n, k): Q̂ Ŝ
    k_edge_members = torch.gather(k_members, 2, flat.expand(-1, -1, -1, k_members.shape[-1]))
    rates = torch.matmul(weights[..., None, :], k_edge_members.view(b, h, n, width, -1).transpose(-1, -2))
    probs, edges = straight_through(probs, rates[..., 0, :], graph)  # (b, h, n, D), (h,)
    output = torch.matmul(probs.to(value.dtype)[..., None, :], v_edges)[..., 0, :]  # (b, h, n, d)
    return output, edges


@head_attention(SBM)
def sbm_attention_forward(
    head: SBMHead,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    *,
    scaling: float,
    dropout: float,
) -> tuple[Tensor, Tensor | None]:
    """SBM attention (see the module docstring) in the ``transformers.AttentionInterface`` signature.

    Shapes as :func:`~pipeline.attention.entmax.entmax_attention_forward`. Returns the output (b, n, h, d)
    and the probabilities (b, h, n, m) on the graph when dense; None for them on the sparse path.
    """
    b, _, n, _ = query.shape
    m = key.shape[-2]
    inputs = (head, module, query, key, value, attention_mask, position_bias)
    members = (head.members(query), head.members(key))
    if m > head.sparse_above:
        output, edges = _sparse(*inputs, *members, scaling=scaling, dropout=dropout)
        probs = None
        valid = _valid_pairs(attention_mask, b, n, m, causal=head.causal, device=query.device)
    else:
        allowed = _allowed(attention_mask, b, n, m, causal=head.causal, device=query.device)
        output, probs, edges = _dense(*inputs, *members, allowed, scaling=scaling, dropout=dropout)
        valid = allowed.sum().float()
    if module.training:
        head.density = edges / valid.clamp(min=1)
    if head.measuring:
        head.record_counts(edges.detach(), valid.expand_as(edges))
    return output.transpose(1, 2).contiguous(), probs


# -- configuration ---------------------------------------------------------------------------------------


def sbm_heads(model: nn.Module) -> list[SBMHead]:
    """Every :class:`SBMHead` of ``model``, in module order (encoder layers, then decoder layers)."""
    return heads_of_type(model, SBMHead)


def check_spec(spec: Any, layers: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``spec`` checked field by field (one-line :class:`UserError`), as the JSON-ready dict to record.

    ``layers`` gives the number of layers of each kind; a configured kind the model lacks is refused.
    """
    spec = check_setting_names(SBM, spec, SPEC_KEYS, required=True)
    kinds = check_kinds(SBM, spec["kinds"], layers)
    weight = spec["density_weight"]
    if not is_finite_number(weight) or weight < 0:
        raise UserError(f"sbm density_weight must be a finite number >= 0; got {weight!r}")
    evaluation = spec["evaluation"]
    if evaluation not in EVALUATIONS:
        raise UserError(f"sbm evaluation {evaluation!r} is unknown; allowed: {', '.join(EVALUATIONS)}")
    threshold = spec["threshold"]
    if not is_finite_number(threshold) or not 0 < threshold <= 1:
        raise UserError(f"sbm threshold must be a number in (0, 1]; got {threshold!r}")
    return {
        "clusters": check_integer(SBM, "clusters", spec["clusters"]),
        "kinds": kinds,
        "density_weight": float(weight),
        "sparse_above": check_integer(SBM, "sparse_above", spec["sparse_above"]),
        "evaluation": evaluation,
        "threshold": float(threshold),
        "seed": check_integer(SBM, "seed", spec["seed"], least=0),
    }


def attach_sbm(model: PreTrainedModel, spec: Mapping[str, Any]) -> list[SBMHead]:
    """Give every attention module of ``spec["kinds"]`` its :class:`SBMHead` and record ``config.sbm``.

    ``spec``: ``{"clusters": k, "kinds": ["encoder_self", "decoder_self"] (a non-empty subset),
    "density_weight": λ, "sparse_above": longest sequence on the dense layout, "evaluation": "expected" |
    "sampled", "threshold": t (expected), "seed": s (sampled)}``. The model must run
    ``attn_implementation="sbm"``, or the heads would never be consulted. New parameters come from torch's
    global RNG. Returns the heads attached.
    """
    return attach_heads(model, SBM, spec, check_spec, _make_head)


def _make_head(checked: dict[str, Any], kind: str, layer: int, module: nn.Module) -> SBMHead:
    """The :class:`SBMHead` of ``module``, ``layer`` of ``kind``, under the checked settings."""
    return SBMHead(
        *head_shape(module),
        checked["clusters"],
        layer,
        kind,
        density_weight=checked["density_weight"],
        sparse_above=checked["sparse_above"],
        evaluation=checked["evaluation"],
        threshold=checked["threshold"],
        seed=checked["seed"],
    )


def density_penalty(model: nn.Module) -> Tensor | None:
    """density_weight · the mean over every head of every layer of its last training call's density, with
    the straight-through gradient; forgotten once taken. None when no SBM head trained since."""
    heads = sbm_heads(model)
    densities = [density for head in heads if (density := head.take_density()) is not None]
    if not densities:
        return None
    return heads[0].density_weight * torch.cat(densities).mean()


def register_sbm() -> None:
    """Make ``attn_implementation="sbm"`` available to every model using the attention interface, with
    its state attacher and its density penalty."""
    register_attention(SBM, sbm_attention_forward)
    register_state_attacher(SBM, state_attacher(SBM, sbm_heads, attach_sbm))
    register_loss_penalty(SBM, density_penalty)


register_sbm()
