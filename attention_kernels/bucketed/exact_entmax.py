"""α-entmax, exactly, for α = 1.5 and α = 2, and softmax (α = 1), over rows of scores that each belong to one
query, in C++.

A query's keys may be spread over rows of several parts (tensors (…, W), one query per row, as
:mod:`attention_kernels.bucketed.torch_path` lays out the attended pairs). With m a query's largest score,

    α-entmax(s)_j = ((α − 1)(s_j − m) − τ)₊^{1/(α−1)},   Σ_j α-entmax(s)_j = 1,

τ the sort-based value. ``attention_kernels/native/exact_entmax.cpp`` finds τ one query at a time, its entries
read from memory once and searched in the first-level cache, and writes the probabilities over the scores
while they are still there; :func:`attention_kernels.bucketed.torch_path._support_threshold` is the PyTorch
reference it must match.
Softmax, p_j = e^{s_j − m} / Σ_k e^{s_k − m}, takes the same way through the rows (its reference:
:func:`attention_kernels.bucketed.torch_path._normalise`), with an exponential of its own (Cephes' expf,
relative error about 1e-7 in float32; the C library's in float64).
"""

from __future__ import annotations

import ctypes

import torch

from attention_kernels.bucketed.planning import BlockMask
from attention_kernels.native import library

_FUNCTIONS = {torch.float32: "exact_entmax_float", torch.float64: "exact_entmax_double"}
_BETA = {1.0: 0, 1.5: 2, 2.0: 1}
"""The kernel's β = 1/(α − 1) for each α it takes, 0 standing for softmax."""


class _PartMask(ctypes.Structure):
    """The C++ kernel's ``PartMask``: a part's :class:`~attention_kernels.bucketed.planning.BlockMask`."""

    _fields_ = [
        ("key_pos", ctypes.c_void_p),
        ("limit", ctypes.c_void_p),
        ("low", ctypes.c_void_p),
        ("q_tags", ctypes.c_void_p),
        ("k_tags", ctypes.c_void_p),
        ("q_tag_count", ctypes.c_int64),
        ("k_tag_count", ctypes.c_int64),
        ("blocks", ctypes.c_int64),
        ("block_rows", ctypes.c_int64),
    ]


def _addresses(tensors: list[torch.Tensor | None]) -> ctypes.Array:
    """A C array of the tensors' data pointers (null for None)."""
    return (ctypes.c_void_p * len(tensors))(*(_address(t) for t in tensors))


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


def check_mask(part_shape: tuple[int, ...], mask: BlockMask) -> None:
    """One line naming what is wrong when ``mask`` does not fit a part of blocks of ``part_shape`` (blocks, L,
    W): the kernels read its tensors unchecked."""
    if len(part_shape) != 3:
        raise ValueError(f"a mask needs a part of blocks (blocks, L, W); got {tuple(part_shape)}")
    blocks, rows, width = part_shape
    expected = {
        "key_pos": ((blocks, width), torch.float32),
        "limit": ((blocks, rows), torch.float32),
        "low": ((blocks, rows), torch.float32),
        "q_tags": ((blocks, rows), torch.int32),
        "k_tags": ((blocks, width), torch.int32),
    }
    if (mask.q_tags is None) != (mask.k_tags is None):
        raise ValueError("a mask's q_tags and k_tags go together: give both or neither")
    for name, (shape, dtype) in expected.items():
        x = getattr(mask, name)
        if x is None:
            continue
        got = tuple(x.shape[1:]) if name.endswith("tags") else tuple(x.shape)
        if got != shape or x.dtype != dtype or (name.endswith("tags") and x.dim() != 3):
            lead = "(S, " if name.endswith("tags") else "("
            want = f"{lead}{', '.join(map(str, shape))}) {dtype}"
            raise ValueError(
                f"a mask's {name} must be {want} for scores {tuple(part_shape)}; got "
                f"{tuple(x.shape)} {x.dtype}"
            )


def _part_masks(parts: list[torch.Tensor], masks: list[BlockMask | None]) -> tuple[ctypes.Array, list]:
    """The C array of the parts' masks, and the contiguous tensors it points into (to keep alive)."""
    out, alive = (_PartMask * len(parts))(), []
    for c, (scores, mask) in enumerate(zip(parts, masks, strict=True)):
        if mask is None:
            continue
        fields = [mask.key_pos, mask.limit, mask.low, mask.q_tags, mask.k_tags]
        fields = [None if x is None else x.contiguous() for x in fields]
        alive += fields
        q_count, k_count = (0, 0) if mask.q_tags is None else (len(mask.q_tags), len(mask.k_tags))
        blocks, rows = scores.shape[:2]
        out[c] = _PartMask(*map(_address, fields), q_count, k_count, blocks, rows)
    return out, alive


def exact_entmax(
    parts: list[torch.Tensor],
    owners: list[torch.Tensor],
    num_queries: int,
    alpha: float,
    *,
    write: bool,
    masks: list[BlockMask | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per query (num_queries,) the shift m and the threshold τ over the rows of ``parts`` (each (…, W),
    contiguous, CPU, float32 or float64, one dtype) whose owners (…) are queries in [0, num_queries); entries
    off the mask −inf or below −max float / 2. ``masks`` may give a part of blocks (blocks, L, W) the rule
    that says which of its entries are keys (:class:`~attention_kernels.bucketed.planning.BlockMask`:
    positions and limits for a causal cut, a window band or padding, tags for pairs another block holds),
    applied as the entries are read, with no mask written into the scores. With ``write``, the probabilities
    replace the scores (0 off the keys). A query without rows gets m = 0 and τ = −1, one without keys m = 0.
    For softmax (α = 1), τ is log Σ_j e^{s_j − m} (−inf without keys). None where the C++ kernel cannot run
    (no compiler, see :mod:`attention_kernels.native`; GPU tensors), and then nothing is written."""
    if alpha not in _BETA:
        raise ValueError(f"exact α-entmax takes α = 1 (softmax), 1.5 or 2; got {alpha}")
    masks = [None] * len(parts) if masks is None else masks
    for scores, owner, mask in zip(parts, owners, masks, strict=True):
        if scores.shape[:-1] != owner.shape:
            shapes = f"{tuple(scores.shape)}, {tuple(owner.shape)}"
            raise ValueError(f"a part (…, W) needs owners (…) of the same leading shape; got {shapes}")
        if not scores.is_contiguous():
            raise ValueError("each part of scores must be contiguous (the kernel writes through its rows)")
        low, high = (int(x) for x in owner.aminmax()) if owner.numel() else (0, 0)
        if low < 0 or high >= num_queries:
            raise ValueError(f"owners must be queries in [0, {num_queries}); got [{low}, {high}]")
        if mask is not None:
            check_mask(tuple(scores.shape), mask)
    dtype = parts[0].dtype if parts else torch.float32
    kernel = library("exact_entmax")
    if kernel is None or dtype not in _FUNCTIONS or any(p.device.type != "cpu" for p in parts):
        return None
    if any(p.dtype != dtype for p in parts):
        raise ValueError(f"all parts must share one dtype; got {sorted({str(p.dtype) for p in parts})}")
    rows = [o.reshape(-1).to(torch.int64).contiguous() for o in owners]  # kept alive for the call
    part_masks, _pointed_to = _part_masks(parts, masks)  # the tensors stay alive for the call
    shift, tau = torch.zeros(num_queries, dtype=dtype), torch.zeros(num_queries, dtype=dtype)
    status = getattr(kernel, _FUNCTIONS[dtype])(
        ctypes.c_int(len(parts)),
        _addresses(parts),
        _int64s([r.numel() for r in rows]),
        _int64s([p.shape[-1] for p in parts]),
        _addresses(rows),
        part_masks,
        ctypes.c_int64(num_queries),
        ctypes.c_int(_BETA[alpha]),
        ctypes.c_int(int(write)),
        ctypes.c_void_p(shift.data_ptr()),
        ctypes.c_void_p(tau.data_ptr()),
        ctypes.c_int(torch.get_num_threads()),
    )
    if status != 0:
        raise MemoryError(f"exact α-entmax ran out of memory for {sum(r.numel() for r in rows)} rows")
    return shift, tau
