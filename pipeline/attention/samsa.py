"""SAMSA: SAMpling-Self-Attention (Lenhat et al., 2024): each head attends the k keys it rates highest.

Every head of a configured self-attention layer rates each key j of the sequence with a learned importance
score and owns 2k learned support keys and values with learned scores; the supports join the candidate pool,
so it always holds at least 2k entries (and a sequence shorter than k still fills the k slots). The head
picks the top k of its pool by differentiable top-k without replacement (:mod:`pipeline.attention.topk`):
the forward takes exactly the picked keys and values, the backward is that of the soft proxy over the top k
and the next k (their competitors) with p_ij = σ((z_i − z_j)/τ). Every query then attends its picks:

    P_i = α-entmax(scaling · q_i K_{S_i}ᵀ + B_{i, S_i}, masked by −inf),   out_i = P_i V_{S_i}

with the model's own normalizer (α from :func:`~pipeline.attention.entmax.attention_alpha`; α = 1 is
softmax), its mask and position bias read at the picked token columns only (supports get neither).

- Importance from the keys: the paper scores the layer input x as Linear(d_model → h)(x + RMSNorm(MLP(x))).
  The attention interface sees only the projected queries, keys and values, and a decoding cache keeps
  only keys and values, so each head scores its own key vectors instead: z_j = w·(k_j + RMSNorm(MLP(k_j)))
  + b, MLP = Linear–GELU–Linear on d, batched over heads. A key is a linear function of x, so the score
  still depends on the token alone (and a cached step rates its keys exactly like the uncached pass).
  Padding keys (no query may see them) score −inf. While training, Gumbel(0, 1) noise is added to every
  token and support score (a fresh draw from torch's global RNG per call); in evaluation the ranking is
  deterministic, and there is no dropout.
- Each head ranks its own pool: the heads pick different subsets ("mixture of attention experts").
- Bidirectional kinds: one ranking per head and batch row, shared by every query: O(n·k) scores.
- Causal kinds (exact; the paper has none): query i's pool is the keys j ≤ i plus the supports, and it
  attends the top k of that pool. Queries go in chunks of C = ``CHUNK``; a running top-2k of the keys
  before the chunk is kept, so each chunk ranks only the running top, its own keys j ≤ i and the supports
  (2k + C + 2k candidates per query), which hold every query's top 2k exactly. O(n·(C + 4k)) scores, no
  n × n tensor. A cached decoding step (queries at positions m − n … m − 1 over m keys) starts from the
  top 2k of the keys before it, hence gets exactly the uncached pass's picks.
- Support initialisation, to disturb the teacher a head starts from as little as reasonable: values 0 (a
  picked support adds nothing to the output but takes some probability mass), keys near 0 (a score near 0,
  below the entmax threshold of the teacher's peaked rows), scores near ``SUPPORT_SCORE`` below the tokens',
  so supports are picked mostly where a sequence has fewer than k keys (or a query fewer than k earlier
  keys).
- Counting (:class:`~pipeline.attention.counting.PairCounter`): the picked token pairs a real query may see
  against all the pairs it may see; supports are no pairs of the sequence and are not counted.

The configuration lives in ``config.samsa`` (see :func:`attach_samsa`); every self-attention module of the
configured kinds carries a :class:`SAMSAHead`. Cross-attention and modules without a head compute plain
α-entmax. Importing this module registers ``attn_implementation="samsa"`` and its state attacher (so
:func:`pipeline.attention.load_model` rebuilds the heads from the config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from attention_kernels.entmax.dense import entmax_normalize
from pipeline.attention.counting import PairCounter
from pipeline.attention.entmax import attention_alpha, compute_dtype
from pipeline.attention.heads import (
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
from pipeline.attention.interface import mask_scores, register_attention, register_state_attacher
from pipeline.attention.topk import gather_items, straight_through_pick, top_k_split
from pipeline.attention_kinds import attention_kind
from pipeline.errors import UserError

SAMSA = "samsa"
SPEC_KEYS = ("keys", "temperature", "kinds")
CHUNK = 128  # query rows attended (and, causal, ranked) at a time
SUPPORT_SCORE = -4.0  # initial importance of the supports, below the tokens' (see the module docstring)
SUPPORT_SPREAD = 0.02  # initial scale of the support keys and spread of their scores (distinct, no ties)
NORM_EPS = 1e-6


class SAMSAHead(PairCounter):
    """The importance scorers and supports of one attention module's heads, batched over heads.

    Parameters, drawn from torch's global RNG: the scorer's MLP ``hidden_weight``, ``output_weight``
    (h, d, d), ``hidden_bias``, ``output_bias`` (h, d), its RMSNorm gain ``norm_weight`` (h, d) and read-out
    ``score_weight`` (h, d), ``score_bias`` (h,); the ``support_keys``, ``support_values`` (h, s, d) and
    ``support_scores`` (h, s). ``supports`` s defaults to 2k, as in the paper.
    """

    def __init__(
        self,
        heads: int,
        head_dim: int,
        keys: int,
        temperature: float,
        layer: int,
        kind: str,
        *,
        supports: int | None = None,
    ) -> None:
        super().__init__()
        supports = 2 * keys if supports is None else supports
        bound = head_dim**-0.5  # nn.Linear's default initialisation
        self.hidden_weight = nn.Parameter(torch.empty(heads, head_dim, head_dim).uniform_(-bound, bound))
        self.hidden_bias = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.output_weight = nn.Parameter(torch.empty(heads, head_dim, head_dim).uniform_(-bound, bound))
        self.output_bias = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.norm_weight = nn.Parameter(torch.ones(heads, head_dim))
        self.score_weight = nn.Parameter(torch.empty(heads, head_dim).uniform_(-bound, bound))
        self.score_bias = nn.Parameter(torch.zeros(heads))
        self.support_keys = nn.Parameter(torch.randn(heads, supports, head_dim) * SUPPORT_SPREAD)
        self.support_values = nn.Parameter(torch.zeros(heads, supports, head_dim))
        self.support_scores = nn.Parameter(SUPPORT_SCORE + SUPPORT_SPREAD * torch.randn(heads, supports))
        self.keys, self.temperature = keys, temperature
        self.layer, self.kind, self.causal = layer, kind, attention_kind(kind).causal

    def extra_repr(self) -> str:
        heads, supports, head_dim = self.support_keys.shape
        return (
            f"heads={heads}, head_dim={head_dim}, keys={self.keys}, supports={supports}, "
            f"temperature={self.temperature}, {self.kind}, layer={self.layer}"
        )

    def importance(self, keys: Tensor) -> Tensor:
        """Importance scores w·(k + RMSNorm(MLP(k))) + b (b, h, m) of keys (b, h, m, d), computed in
        :func:`~pipeline.attention.entmax.compute_dtype` of the keys (float32, or float64 for float64)."""
        compute = compute_dtype(keys.dtype)
        hidden_weight, hidden_bias = self.hidden_weight.to(compute), self.hidden_bias.to(compute)
        output_weight, output_bias = self.output_weight.to(compute), self.output_bias.to(compute)
        norm_weight = self.norm_weight.to(compute)
        score_weight, score_bias = self.score_weight.to(compute), self.score_bias.to(compute)
        x = keys.to(compute)
        hidden = torch.einsum("bhmd,hde->bhme", x, hidden_weight) + hidden_bias[:, None]
        hidden = nn.functional.gelu(hidden)
        out = torch.einsum("bhmd,hde->bhme", hidden, output_weight) + output_bias[:, None]
        normed = nn.functional.rms_norm(out, out.shape[-1:], eps=NORM_EPS) * norm_weight[:, None]
        return torch.einsum("bhmd,hd->bhm", x + normed, score_weight) + score_bias[:, None]


def _allows(mask: Tensor) -> Tensor:
    """The pairs a boolean or additive mask allows, as bool of the same shape."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min


def _valid_pairs(
    allows: Tensor | None, q_valid: Tensor, n: int, m: int, heads: int, *, causal: bool
) -> Tensor:
    """(h,) the pairs the model allows to real queries ``q_valid`` (b, n), j ≤ i as well when causal;
    counted, not built, when the model gives no mask."""
    if allows is None:
        per_row = n * m - (n * (n - 1) // 2 if causal else 0)  # causal: Σ_i (m − n + i + 1)
        return torch.full((heads,), float(q_valid.shape[0] * per_row))
    allowed = allows & q_valid[:, None, :, None]
    if causal:
        positions = torch.arange(m, device=allows.device)
        allowed = allowed & (positions <= positions[m - n :, None])
    return allowed.sum((0, 2, 3)).expand(heads)


def _at_picks(tensor: Tensor, rows: slice, cols: Tensor, m: int) -> Tensor:
    """A mask or bias (b | 1, 1 | h, n, ≥ m) read at query ``rows`` and the picked token columns ``cols``
    (b, h, R | 1, k): (b, h, R, k). Only the rows' slice is expanded, never n × m."""
    b, h, _, k = cols.shape
    part = tensor[..., rows, :m]
    part = part.expand(b, h, part.shape[-2], m)
    return part.gather(-1, cols.expand(b, h, part.shape[-2], k))


def _attend(
    module: nn.Module,
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    picks: Tensor,
    rows: slice,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    q_valid: Tensor,
    *,
    m: int,
    scaling: float,
    dropout: float,
) -> tuple[Tensor, Tensor]:
    """Queries q (b, h, R, d), the ``rows`` of the call's queries, attend their picked keys and values
    (b, h, R | 1, k, d), all in the compute dtype (:func:`~pipeline.attention.entmax.compute_dtype`).

    ``picks`` (b, h, R | 1, k) holds pool indices (≥ m: a support; −1: nothing to attend). Returns the
    output (b, h, R, d) in that dtype, and the token pairs of real queries attended per head (h,).
    """
    scores = torch.matmul(q[..., None, :], keys.transpose(-1, -2))[..., 0, :] * scaling  # (b, h, R, k)
    support, absent = picks >= m, picks < 0
    cols = picks.clamp(0, m - 1)
    attended = ~support & ~absent
    if position_bias is not None:
        scores = scores + _at_picks(position_bias, rows, cols, m).to(q.dtype).masked_fill(support, 0.0)
    if attention_mask is not None:
        mask = _at_picks(attention_mask, rows, cols, m)
        attended = attended & _allows(mask)
        mask = mask | support if mask.dtype == torch.bool else mask.masked_fill(support, 0.0)
        scores = mask_scores(scores, mask)
    scores = scores.masked_fill(absent, float("-inf"))
    probs = entmax_normalize(scores, attention_alpha(module))
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs[..., None, :], values)[..., 0, :]  # (b, h, R, d)
    return output, (attended & q_valid[:, None, rows, None]).sum((0, 2, 3))


def _bidirectional_picks(
    head: SAMSAHead, pool_z: Tensor, pool_k: Tensor, pool_v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One ranking of the pool per head and row: picked keys, values (b, h, 1, k, d) and their pool
    indices (b, h, 1, k), −1 where the pick is padding."""
    scores = pool_z[:, :, None]  # (b, h, 1, P)
    selected, competing = top_k_split(scores, head.keys)  # (b, h, 1, k), (b, h, 1, c)
    keys = straight_through_pick(pool_k, scores, selected, competing, head.temperature)
    values = straight_through_pick(pool_v, scores, selected, competing, head.temperature)
    return keys, values, selected.masked_fill(scores.gather(-1, selected).isneginf(), -1)


def _causal_picks(
    head: SAMSAHead, pool_z: Tensor, pool_k: Tensor, pool_v: Tensor, tokens: Tensor, own: Tensor, m: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Each query of a chunk at positions ``own`` (C,) ranks the token keys ``tokens`` (b, h, R + C): the
    top 2k of the keys before the chunk, then the chunk's own keys, those up to itself only, and the
    supports. Returns the picked keys, values (b, h, C, k, d) and their pool indices (b, h, C, k), −1 where
    the pick is nothing the query may attend."""
    b, h, total = pool_z.shape
    supports = torch.arange(m, total, device=own.device).expand(b, h, -1)  # (b, h, s)
    candidates = torch.cat([tokens, supports], dim=-1)  # (b, h, Pc) pool indices
    later = torch.zeros(len(own), candidates.shape[-1], dtype=torch.bool, device=own.device)
    later[:, tokens.shape[-1] - len(own) : tokens.shape[-1]] = own[None, :] > own[:, None]  # key j > query i
    scores = pool_z.gather(-1, candidates)[:, :, None].masked_fill(later, float("-inf"))  # (b, h, C, Pc)
    selected, competing = top_k_split(scores, head.keys)  # (b, h, C, k), (b, h, C, c)
    items = candidates[:, :, None]  # (b, h, 1, Pc)
    keys, values = (
        straight_through_pick(
            gather_items(pool, items)[:, :, 0], scores, selected, competing, head.temperature
        )
        for pool in (pool_k, pool_v)
    )
    picks = candidates[:, :, None].expand_as(scores).gather(-1, selected)  # (b, h, C, k)
    return keys, values, picks.masked_fill(scores.gather(-1, selected).isneginf(), -1)


@head_attention(SAMSA)
def samsa_attention_forward(
    head: SAMSAHead,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    *,
    scaling: float,
    dropout: float,
) -> tuple[Tensor, None]:
    """SAMSA (see the module docstring) in the ``transformers.AttentionInterface`` signature.

    Shapes as :func:`~pipeline.attention.entmax.entmax_attention_forward`. Returns the output (b, n, h, d)
    and None for the probabilities (they cover only the picks; spreading them out to n × m would cost what
    SAMSA saves).
    """
    b, h, n, _ = query.shape
    m, device = key.shape[-2], query.device
    allows = None if attention_mask is None else _allows(attention_mask[..., :m])  # (b | 1, 1 | h, n, m)
    if allows is None:
        k_valid = torch.ones(b, m, dtype=torch.bool, device=device)
    else:
        k_valid = allows.any(dim=-2).any(dim=1).expand(b, m)  # a key no query may see is padding
    q_valid = k_valid[:, m - n :]

    compute = compute_dtype(query.dtype)
    z = head.importance(key).masked_fill(~k_valid[:, None], float("-inf"))  # (b, h, m)
    pool_z = torch.cat([z, head.support_scores.to(compute).expand(b, h, -1)], dim=-1)  # (b, h, P), P = m + s
    if module.training:  # Gumbel(0, 1) noise = −log(Exp(1))
        pool_z = pool_z - torch.empty_like(pool_z).exponential_().log()
    support_keys, support_values = head.support_keys.to(compute), head.support_values.to(compute)
    pool_k = torch.cat([key.to(compute), support_keys.expand(b, -1, -1, -1)], dim=-2)  # (b, h, P, d)
    pool_v = torch.cat([value.to(compute), support_values.expand(b, -1, -1, -1)], dim=-2)
    context = (attention_mask, position_bias, q_valid)
    options = dict(m=m, scaling=scaling, dropout=dropout)

    outputs, attended = [], torch.zeros(h, device=device)
    if not head.causal:  # one ranking for every query
        keys, values, picks = _bidirectional_picks(head, pool_z, pool_k, pool_v)
    else:  # the keys before query 0 (cached ones) enter as their top 2k
        first = m - n
        earlier = pool_z[..., :first].topk(min(2 * head.keys, first), dim=-1).indices  # (b, h, R)
    for start, q in zip(range(0, n, CHUNK), query.to(compute).split(CHUNK, dim=2), strict=True):
        rows = slice(start, start + q.shape[2])
        if head.causal:
            own = torch.arange(first + rows.start, first + rows.stop, device=device)  # (C,)
            tokens = torch.cat([earlier, own.expand(b, h, -1)], dim=-1)  # (b, h, R + C)
            keys, values, picks = _causal_picks(head, pool_z, pool_k, pool_v, tokens, own, m)
            top = pool_z.gather(-1, tokens).topk(min(2 * head.keys, tokens.shape[-1]), dim=-1).indices
            earlier = tokens.gather(-1, top)
        output, count = _attend(module, q, keys, values, picks, rows, *context, **options)
        outputs.append(output)
        attended = attended + count
    if head.measuring:
        head.record_counts(attended, _valid_pairs(allows, q_valid, n, m, h, causal=head.causal))
    return torch.cat(outputs, dim=2).to(value.dtype).transpose(1, 2).contiguous(), None


# -- configuration ---------------------------------------------------------------------------------------


def samsa_heads(model: nn.Module) -> list[SAMSAHead]:
    """Every :class:`SAMSAHead` of ``model``, in module order (encoder layers, then decoder layers)."""
    return heads_of_type(model, SAMSAHead)


def check_spec(spec: Any, layers: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``spec`` checked field by field (one-line :class:`UserError`), as the JSON-ready dict to record.

    ``layers`` gives the number of layers of each kind; a configured kind the model lacks is refused.
    """
    spec = check_setting_names(SAMSA, spec, SPEC_KEYS, required=True)
    keys = check_integer(SAMSA, "keys", spec["keys"])
    temperature = spec["temperature"]
    if not is_finite_number(temperature) or temperature <= 0:
        raise UserError(f"samsa temperature must be a finite number > 0; got {temperature!r}")
    kinds = check_kinds(SAMSA, spec["kinds"], layers)
    return {"keys": keys, "temperature": float(temperature), "kinds": kinds}


def attach_samsa(model: PreTrainedModel, spec: Mapping[str, Any]) -> list[SAMSAHead]:
    """Give every attention module of ``spec["kinds"]`` its :class:`SAMSAHead` and record ``config.samsa``.

    ``spec``: ``{"keys": k, "temperature": τ, "kinds": ["encoder_self", "decoder_self"] (a non-empty
    subset)}``. The model must run ``attn_implementation="samsa"``, or the heads would never be consulted.
    New parameters come from torch's global RNG. Returns the heads attached.
    """
    return attach_heads(model, SAMSA, spec, check_spec, _make_head)


def _make_head(checked: dict[str, Any], kind: str, layer: int, module: nn.Module) -> SAMSAHead:
    """The :class:`SAMSAHead` of ``module``, ``layer`` of ``kind``, under the checked settings."""
    return SAMSAHead(*head_shape(module), checked["keys"], checked["temperature"], layer, kind)


def register_samsa() -> None:
    """Make ``attn_implementation="samsa"`` available to every model using the attention interface."""
    register_attention(SAMSA, samsa_attention_forward)
    register_state_attacher(SAMSA, state_attacher(SAMSA, samsa_heads, attach_samsa))


register_samsa()
