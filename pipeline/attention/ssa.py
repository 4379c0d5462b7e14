"""SSA: Stochastically Subsampled self-Attention (Hussain, Zaki & Subramanian, KDD 2023).

While training, every target (query) i of a self-attention layer attends only a random subset S_i of the
sources (keys and values), drawn afresh at every call and shared by all heads of the layer and all rows of
the batch:

    P_i = α-entmax(scaling · q_i K_{S_i}ᵀ + B_{i, S_i}, masked by −inf),   out_i = P_i V_{S_i}

with the model's own normalizer (α from :func:`~pipeline.attention.entmax.attention_alpha`; α = 1 is
softmax) and its mask and position bias taken at the same columns.

- Unbiased (Algorithm 1): S_i = S = randperm(m)[:k] for every target: O(n·k) scores instead of O(n·m);
  k ≥ m keeps every key.
- Locally biased (Algorithm 2): P = argsort(j + ε_j), ε_j ~ N(0, σ²) with the layer's σ; the targets (in
  their order) and the reindexed sources P are cut into w windows of L = ⌈n/w⌉, and target window c attends
  source window c: scores (w, L, L), O(n²/w). Small σ keeps sources near their targets; σ → ∞ is unbiased.
- Causal kinds: a target never attends a later source (j ≤ i exactly) and always keeps its own key, added
  as an extra column when it was not drawn (a pair never counts twice). Causal local windows follow the
  paper's "permutation resampled for each window, constrained to 0 … the end of the window": window c of
  targets [s, e) draws ε for sources 0 … e − 1, sorts j + ε_j and takes the last e − s ranks.

A cached decoding step (queries at positions m − n … m − 1 over m keys) is treated as the last targets of a
length-m sequence: unbiased draws k of the keys 0 … t and keeps t itself; local takes t's window (L = ⌈m/w⌉)
by the causal rule. Rows with no allowed key give zeros. Draws come from torch's global CPU RNG while
training (the Trainer seeds and restores it) or from the generator of :func:`sampling`; they are made on the
CPU, so a seed gives the same subsets on every device.

Sampling happens only while the module trains and its head's ``sampling`` flag is on (:func:`set_sampling`
turns it off for dense fine-tuning, "+FT"), or inside :func:`sampling`. Otherwise the attention is exactly the
dense :func:`~pipeline.attention.entmax.entmax_attention_forward`: the normalizer renormalizes over all keys
by itself ("attention-based renormalization"), so no rescaling is needed.

The configuration lives in ``config.ssa`` (see :func:`attach_ssa`); every self-attention module of the
configured kinds carries an :class:`SSAHead` (no parameters). Cross-attention and modules without a head
compute plain α-entmax. Importing this module registers ``attn_implementation="ssa"``;
:func:`pipeline.attention.load_model` rebuilds the heads from the config.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from attention_kernels.entmax.dense import entmax_normalize
from pipeline.attention.entmax import attention_alpha, compute_dtype
from pipeline.attention.heads import (
    attach_heads,
    check_integer,
    check_kinds,
    check_setting_names,
    head_attention,
    heads_of_type,
    is_finite_number,
    state_attacher,
)
from pipeline.attention.interface import mask_scores, register_attention, register_state_attacher
from pipeline.attention_kinds import attention_kind
from pipeline.errors import UserError

SSA = "ssa"
MODES = ("unbiased", "local")
SPEC_KEYS = ("mode", "keys", "windows", "sigma", "kinds")


class SSAHead(nn.Module):
    """How one self-attention module subsamples its sources: mode, k or (w, σ of its layer), causality.

    No parameters. ``sampling`` (default True) lets it sample while training; ``generator`` (set by
    :func:`sampling`) makes it sample even in eval mode, drawing from that generator; ``replicas`` (ditto)
    splits every batch into that many equal contiguous chunks, each with its own draw.
    """

    def __init__(
        self,
        mode: str,
        layer: int,
        *,
        causal: bool,
        keys: int | None = None,
        windows: int | None = None,
        sigma: float | None = None,
    ) -> None:
        super().__init__()
        self.mode, self.layer, self.causal = mode, layer, causal
        self.keys, self.windows, self.sigma = keys, windows, sigma
        self.sampling = True
        self.generator: torch.Generator | None = None
        self.replicas = 1

    def extra_repr(self) -> str:
        knobs = (
            f"keys={self.keys}" if self.mode == "unbiased" else f"windows={self.windows}, sigma={self.sigma}"
        )
        return f"{self.mode}, layer={self.layer}, {knobs}, causal={self.causal}"

    def active(self, training: bool) -> bool:
        """Whether this call samples: inside :func:`sampling`, or while training with sampling on."""
        return self.generator is not None or (training and self.sampling)

    def draw(self, n: int, m: int) -> tuple[Tensor, Tensor]:
        """One draw for n queries (the last n of m positions) over m keys, on the CPU.

        Returns ``positions`` (G, R): the absolute position of each target slot, G groups of R targets that
        share sources (slots at positions ≥ m or before the queries are padding), and ``sources`` (G, C): the
        key each source slot holds, m for an empty slot.
        """
        if self.mode == "unbiased":
            return self._draw_unbiased(n, m)
        return self._draw_local(n, m)

    def _draw_unbiased(self, n: int, m: int) -> tuple[Tensor, Tensor]:
        positions = torch.arange(m - n, m)[None]  # (1, n)
        if self.keys >= m:
            return positions, torch.arange(m)[None]  # (1, m)
        return positions, torch.randperm(m, generator=self.generator)[None, : self.keys]  # (1, k)

    def _draw_local(self, n: int, m: int) -> tuple[Tensor, Tensor]:
        width = -(-m // self.windows)  # L = ⌈m/w⌉
        first, last = (m - n) // width, (m - 1) // width  # the windows holding the queries
        starts = torch.arange(first, last + 1) * width  # (G,)
        positions = starts[:, None] + torch.arange(width)  # (G, L)
        if not self.causal:
            noisy = torch.arange(m) + self.sigma * torch.randn(m, generator=self.generator)  # (m,)
            empty = torch.full((self.windows * width - m,), m)  # the last window may be short
            windows = torch.cat([noisy.argsort(), empty]).view(self.windows, width)  # (w, L)
            return positions, windows[first : last + 1]
        # causal: each window ranks only the sources up to its end and keeps the last (e − s) ranks
        ends = (starts + width).clamp(max=m)  # (G,)
        noisy = torch.arange(m) + self.sigma * torch.randn(len(starts), m, generator=self.generator)  # (G, m)
        noisy = noisy.masked_fill(torch.arange(m) >= ends[:, None], float("-inf"))  # later sources rank first
        ranked = noisy.argsort(dim=-1)[:, m - width :]  # (G, L), L ≤ m
        unused = torch.arange(width) < (width - (ends - starts))[:, None]  # (G, L): short last window
        return positions, ranked.masked_fill(unused, m)


def _batch_slice(tensor: Tensor | None, rows: slice, batch: int) -> Tensor | None:
    """Rows ``rows`` of a mask or bias whose first dimension is the batch (or 1, shared by every row)."""
    if tensor is None or tensor.shape[0] != batch:
        return tensor
    return tensor[rows]


def _attend(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    positions: Tensor,
    sources: Tensor,
    *,
    causal: bool,
    scaling: float,
    dropout: float,
) -> Tensor:
    """Attention of query (b, h, n, d) over the drawn sources of key and value (b, h, m, d); (b, h, n, d).

    ``positions`` (G, R) and ``sources`` (G, C) as :meth:`SSAHead.draw` returns them, on the CPU (reading
    the layout then costs no device sync). The model's mask and bias (·, ·, n, m) are read only at the
    (G, R, C) drawn pairs, so no n × m score tensor is ever formed. Scores and the normalizer are computed
    in :func:`~pipeline.attention.entmax.compute_dtype` (float32, or float64 for float64 inputs).
    """
    n, m = query.shape[-2], key.shape[-2]
    first = (m - n) - int(positions[0, 0])  # slot of query 0 in the flattened (G·R) layout
    positions, sources = positions.to(query.device), sources.to(query.device)
    rows = positions - (m - n)  # (G, R) query row of each target slot
    row_ok = (rows >= 0) & (positions < m)
    rows = rows.clamp(0, n - 1)
    col_ok = sources < m
    cols = sources.clamp(max=m - 1)  # (G, C)
    pair_rows, pair_cols = rows[:, :, None], cols[:, None, :]  # broadcast to (G, R, C)
    allowed = row_ok[:, :, None] & col_ok[:, None, :]  # (G, R, C)
    if causal:
        allowed &= pair_cols <= positions[:, :, None]

    compute = compute_dtype(query.dtype)
    q = query[:, :, rows].to(compute)  # (b, h, G, R, d)
    k_drawn, v_drawn = key[:, :, cols], value[:, :, cols]  # (b, h, G, C, d)
    scores = torch.matmul(q, k_drawn.to(compute).transpose(-1, -2)) * scaling  # (b, h, G, R, C)
    if position_bias is not None:
        scores = scores + position_bias[..., pair_rows, pair_cols].to(compute)
    if attention_mask is not None:
        scores = mask_scores(scores, attention_mask[..., pair_rows, pair_cols])
    scores = scores.masked_fill(~allowed, float("-inf"))

    if causal:  # every target keeps its own key: one more column wherever the draw missed it
        own = positions.clamp(max=m - 1)  # (G, R)
        v_own = value[:, :, own]  # (b, h, G, R, d)
        own_scores = (q * key[:, :, own].to(compute)).sum(-1, keepdim=True) * scaling  # (b, h, G, R, 1)
        if position_bias is not None:
            own_scores = own_scores + position_bias[..., rows, own, None].to(compute)
        if attention_mask is not None:
            own_scores = mask_scores(own_scores, attention_mask[..., rows, own, None])
        drawn = ((pair_cols == positions[:, :, None]) & col_ok[:, None, :]).any(-1)  # (G, R)
        own_scores = own_scores.masked_fill(~(row_ok & ~drawn)[..., None], float("-inf"))
        scores = torch.cat([scores, own_scores], dim=-1)  # (b, h, G, R, C + 1)

    groups, slots = positions.shape
    probs = entmax_normalize(scores.flatten(2, 3), attention_alpha(module))  # (b, h, G·R, C [+ 1])
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    probs = probs.unflatten(2, (groups, slots)).to(value.dtype)  # (b, h, G, R, C [+ 1])
    width = sources.shape[1]
    output = torch.matmul(probs[..., :width], v_drawn)  # (b, h, G, R, d)
    if causal:
        output = output + probs[..., width:] * v_own
    return output.flatten(2, 3)[:, :, first : first + n]  # (b, h, n, d)


@head_attention(SSA, SSAHead.active)
def ssa_attention_forward(
    head: SSAHead,
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
    """SSA (see the module docstring) in the ``transformers.AttentionInterface`` signature.

    Shapes as :func:`~pipeline.attention.entmax.entmax_attention_forward`. Returns the output (b, n, h, d)
    and, when dense, the probabilities (b, h, n, m); None for them when sampled (they cover only the drawn
    keys, and spreading them out to n × m would cost what SSA saves).
    """
    b, _, n, _ = query.shape
    m = key.shape[-2]
    if attention_mask is not None:  # (b | 1, 1 | h, n, m), rows spelled out so pairs can be gathered
        attention_mask = attention_mask[..., :m].expand(*attention_mask.shape[:2], n, m)
    if position_bias is not None:
        position_bias = position_bias.expand(*position_bias.shape[:2], n, m)
    if b % head.replicas:
        raise ValueError(f"a batch of {b} rows does not split into {head.replicas} equal replicas")
    chunk = b // head.replicas
    outputs = []
    for replica in range(head.replicas):  # replica 0 draws first, so one replica equals a plain draw
        positions, sources = head.draw(n, m)
        rows = slice(replica * chunk, (replica + 1) * chunk)
        outputs.append(
            _attend(
                module,
                query[rows],
                key[rows],
                value[rows],
                _batch_slice(attention_mask, rows, b),
                _batch_slice(position_bias, rows, b),
                positions,
                sources,
                causal=head.causal,
                scaling=scaling,
                dropout=dropout,
            )
        )
    output = torch.cat(outputs) if len(outputs) > 1 else outputs[0]  # (b, h, n, d)
    return output.transpose(1, 2).contiguous(), None


# -- configuration ---------------------------------------------------------------------------------------


def ssa_heads(model: nn.Module) -> list[SSAHead]:
    """Every :class:`SSAHead` of ``model``, in module order (encoder layers, then decoder layers)."""
    return heads_of_type(model, SSAHead)


def check_spec(spec: Any, layers: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``spec`` checked field by field (one-line :class:`UserError`), as the JSON-ready dict to record.

    ``layers`` gives the number of layers of each kind, which the σ list must match; without it the
    length is not checked.
    """
    spec = check_setting_names(SSA, spec, SPEC_KEYS, required=False)
    mode = spec.get("mode")
    if mode not in MODES:
        raise UserError(f"ssa mode {mode!r} is unknown; allowed: {', '.join(MODES)}")
    kinds = check_kinds(SSA, spec.get("kinds"))
    checked: dict[str, Any] = {"mode": mode, "keys": None, "windows": None, "sigma": None, "kinds": kinds}
    if mode == "unbiased":
        checked["keys"] = check_integer(SSA, "keys", spec.get("keys"))
        return checked
    checked["windows"] = check_integer(SSA, "windows", spec.get("windows"))
    sigma = spec.get("sigma")
    if (
        not isinstance(sigma, list | tuple)
        or not sigma
        or any(not is_finite_number(s) or s <= 0 for s in sigma)
    ):
        raise UserError(f"ssa sigma must be a list of finite numbers > 0, one per layer; got {sigma!r}")
    for kind in kinds:
        if layers is not None and len(sigma) not in (1, layers[kind]):
            raise UserError(
                f"ssa sigma has {len(sigma)} values but {kind} has {layers[kind]} layers; "
                "allowed: one sigma per layer, or a single one for every layer"
            )
    checked["sigma"] = [float(s) for s in sigma]
    return checked


def attach_ssa(model: PreTrainedModel, spec: Mapping[str, Any]) -> list[SSAHead]:
    """Give every attention module of ``spec["kinds"]`` its :class:`SSAHead` and record ``config.ssa``.

    ``spec``: ``{"mode": "unbiased" | "local", "keys": k (unbiased), "windows": w (local), "sigma": [σ per
    layer] or [one σ for every layer] (local), "kinds": ["encoder_self", "decoder_self"] (a non-empty
    subset)}``. The model must run
    ``attn_implementation="ssa"``, or the heads would never be consulted. Returns the heads attached.
    """
    return attach_heads(model, SSA, spec, check_spec, _make_head)


def _make_head(checked: dict[str, Any], kind: str, layer: int, module: nn.Module) -> SSAHead:
    """The :class:`SSAHead` of ``layer`` of ``kind`` under the checked settings (its own σ, or the one)."""
    sigma = checked["sigma"][layer % len(checked["sigma"])] if checked["sigma"] else None
    return SSAHead(
        checked["mode"],
        layer,
        causal=attention_kind(kind).causal,
        keys=checked["keys"],
        windows=checked["windows"],
        sigma=sigma,
    )


def _heads_of(model: nn.Module) -> list[SSAHead]:
    heads = ssa_heads(model)
    if not heads:
        raise UserError(f"{type(model).__name__} has no SSA heads; give it some with attach_ssa first")
    return heads


def set_sampling(model: nn.Module, enabled: bool) -> None:
    """Turn training-time sampling of every SSA head on or off (off: dense fine-tuning, "+FT")."""
    for head in _heads_of(model):
        head.sampling = enabled


@contextmanager
def sampling(model: nn.Module, seed: int, *, replicas: int = 1) -> Iterator[None]:
    """Within the block every SSA head samples, in eval mode too, from one generator seeded with ``seed``.

    So the block's calls run one sampled sub-model per call, reproducibly. With ``replicas`` = S every batch
    is read as S equal contiguous chunks (replica outermost) and each chunk gets its own draw, replica 0
    first: S = 1 is the plain sampled pass. The heads' previous settings come back on exit.
    """
    heads = _heads_of(model)
    generator = torch.Generator().manual_seed(seed)
    saved = [(head.generator, head.replicas) for head in heads]
    for head in heads:
        head.generator, head.replicas = generator, replicas
    try:
        yield
    finally:
        for head, (previous, count) in zip(heads, saved, strict=True):
            head.generator, head.replicas = previous, count


def register_ssa() -> None:
    """Make ``attn_implementation="ssa"`` available to every model using the attention interface."""
    register_attention(SSA, ssa_attention_forward)
    register_state_attacher(SSA, state_attacher(SSA, ssa_heads, attach_ssa))


register_ssa()
