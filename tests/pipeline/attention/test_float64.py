"""Float64 in, float64 scores: SSA, SBM and SAMSA compute in
:func:`~pipeline.attention.entmax.compute_dtype` (float32 for half and single precision, float64 for
float64), so a float64 model passes a strict gradcheck, and fp32/bf16 inputs still get float32 scores.

Each attention is called directly on a self-attention module of a tiny float64 Marian (2 heads of
dimension 4). Where the backward is by design not the derivative of the forward (SBM's straight-through
gradient to the rates, SAMSA's soft top-k proxy), the inputs make that part drop out, as each test says,
and the part is checked on its own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.attention import samsa, sbm, ssa
from pipeline.attention.samsa import SAMSA, SAMSAHead, attach_samsa, samsa_attention_forward
from pipeline.attention.sbm import SBM, SBMHead, attach_sbm, sbm_attention_forward
from pipeline.attention.ssa import SSA, attach_ssa, ssa_attention_forward
from tests.tiny import dropout_free_marian

VOCAB, HEADS, HEAD_DIM = 40, 2, 4
BOTH = ["encoder_self", "decoder_self"]
KINDS = {"encoder": "encoder_self", "decoder": "decoder_self"}
SBM_SPEC = {
    "clusters": 3,
    "kinds": BOTH,
    "density_weight": 0.01,
    "sparse_above": 64,
    "evaluation": "expected",
    "threshold": 0.3,
    "seed": 0,
}
SBM_PATHS = {"dense": 64, "fastrg": 1}  # sparse_above: every test sequence is short, or long
SAMSA_KEYS, SAMSA_SUPPORTS = 6, 2  # a pool of n + supports ≤ keys: every item picked, no competitor


def attention_module(name: str, part: str, spec: dict, dtype: torch.dtype = torch.float64) -> nn.Module:
    """Layer 0 self-attention of ``part`` of a tiny ``name`` Marian carrying its head, converted to
    ``dtype``."""
    model = dropout_free_marian(
        vocab=VOCAB,
        attn_implementation=name,
        d_model=HEADS * HEAD_DIM,
        encoder_layers=1,
        decoder_layers=1,
        encoder_heads=HEADS,
        decoder_heads=HEADS,
    )
    torch.manual_seed(1)
    {SSA: attach_ssa, SBM: attach_sbm, SAMSA: attach_samsa}[name](model, spec)
    stack = model.get_encoder() if part == "encoder" else model.get_decoder()
    return stack.layers[0].self_attn.to(dtype)


def attention_inputs(
    part: str, n: int = 5, dtype: torch.dtype = torch.float64, seed: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """query, key, value (2, HEADS, n, HEAD_DIM) of ``dtype`` needing gradients, and a boolean mask
    (2, 1, n, n): row 1 has a padding last key, the decoder's is causal."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 1, n, n, dtype=torch.bool)
    mask[1, :, :, n - 1 :] = False
    if part == "decoder":
        mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
    return *(x.to(dtype).requires_grad_(True) for x in (q, k, v)), mask


def strict_gradcheck(function, inputs) -> bool:
    """torch.autograd.gradcheck at its default, strict tolerances, spelled out."""
    return torch.autograd.gradcheck(function, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("mode, part", [("unbiased", "decoder"), ("local", "encoder")])
def test_ssa_samples_in_float64_and_passes_a_strict_gradcheck(mode, part):
    knobs = {"keys": 3} if mode == "unbiased" else {"windows": 2, "sigma": [2.0]}
    module = attention_module(SSA, part, {"mode": mode, "kinds": BOTH, **knobs}).train()
    q, k, v, mask = attention_inputs(part)

    def sampled(q, k, v):  # the draw comes from torch's global RNG: the same one at every evaluation
        torch.manual_seed(0)
        return ssa_attention_forward(module, q, k, v, mask, scaling=1.0)

    output, probs = sampled(q, k, v)
    assert probs is None  # the sampled path (the dense one returns its probabilities)
    assert output.dtype == torch.float64
    torch.manual_seed(0)
    dense, _ = ssa_attention_forward(module.eval(), q, k, v, mask, scaling=1.0)
    assert not torch.allclose(output, dense)  # some keys were left out
    module.train()
    assert strict_gradcheck(lambda q, k, v: sampled(q, k, v)[0], (q, k, v))


def sbm_module(path: str, part: str) -> tuple[nn.Module, SBMHead]:
    """A float64 module in eval mode whose heads share one block model, so that their rates spread alike
    and one threshold cuts every head's graph."""
    module = attention_module(SBM, part, {**SBM_SPEC, "sparse_above": SBM_PATHS[path]}).eval()
    with torch.no_grad():
        for parameter in module.sbm.parameters():
            parameter[1:] = parameter[0]
    return module, module.sbm


def rates(head: SBMHead, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """p = Q̂ Ŝ K̂ᵀ (b, h, n, m)."""
    return head.members(q) @ head.blocks(q.dtype) @ head.members(k).transpose(-1, -2)


def threshold_between_rates(p: torch.Tensor, allowed: torch.Tensor) -> float:
    """The middle of the widest gap between the allowed rates of the middle half, far from every rate."""
    values = p.detach()[allowed.expand_as(p)].sort().values
    quarter = len(values) // 4
    middle = values[quarter : len(values) - quarter]
    gap = int((middle[1:] - middle[:-1]).argmax())
    assert middle[gap + 1] - middle[gap] > 1e-3  # a gradcheck step (1e-6) moves no rate across it
    return float((middle[gap] + middle[gap + 1]) / 2)


@pytest.mark.parametrize("path, part", [("dense", "encoder"), ("fastrg", "decoder")])
def test_sbm_expected_evaluation_in_float64_passes_a_strict_gradcheck(path, part, monkeypatch):
    module, head = sbm_module(path, part)
    q, k, v, mask = attention_inputs(part)
    head.threshold = threshold_between_rates(rates(head, q, k), mask)
    # The straight-through backward hands the rates a gradient the hard forward has not (by design), so the
    # memberships see the inputs' values but pass them no gradient; they are checked on their own below.
    monkeypatch.setattr(head, "members", lambda x: SBMHead.members(head, x.detach()))

    def attend(q, k, v):
        return sbm_attention_forward(module, q, k, v, mask, scaling=1.0)

    head.measuring = True
    head.reset_counts()
    output, probs = attend(q, k, v)
    head.measuring = False
    real_queries = 2 * q.shape[-2] - 1  # each keeps its own key; row 1's last one is padding
    graph = (real_queries < head.attended) & (head.attended < head.valid)  # not own keys only, not dense
    assert graph.all()
    assert output.dtype == torch.float64
    assert probs is None if path == "fastrg" else probs.dtype == torch.float64
    assert strict_gradcheck(lambda q, k, v: attend(q, k, v)[0], (q, k, v))


def test_sbm_rates_are_computed_in_float64_and_pass_a_strict_gradcheck():
    _, head = sbm_module("dense", "encoder")
    q, k, _, _ = attention_inputs("encoder")
    assert head.members(q).dtype == head.blocks().dtype == rates(head, q, k).dtype == torch.float64
    assert strict_gradcheck(lambda q, k: rates(head, q, k), (q, k))


def samsa_module(part: str) -> tuple[nn.Module, SAMSAHead]:
    """A float64 module whose head picks every key and support (keys ≥ n + supports): the pick's soft-proxy
    backward, by design not the derivative of the hard top-k, then has no competitor and is exact."""
    module = attention_module(SAMSA, part, {"keys": SAMSA_KEYS, "temperature": 1.0, "kinds": BOTH}).eval()
    torch.manual_seed(2)
    head = SAMSAHead(HEADS, HEAD_DIM, SAMSA_KEYS, 1.0, 0, KINDS[part], supports=SAMSA_SUPPORTS).double()
    with torch.no_grad():  # supports that take part in the output
        head.support_keys.normal_()
        head.support_values.normal_()
    module.samsa = head
    return module, head


@pytest.mark.parametrize("part", KINDS)
def test_samsa_in_float64_passes_a_strict_gradcheck(part):
    module, _ = samsa_module(part)
    q, k, v, mask = attention_inputs(part, n=SAMSA_KEYS - SAMSA_SUPPORTS)

    def attend(q, k, v):
        return samsa_attention_forward(module, q, k, v, mask, scaling=1.0)

    output, probs = attend(q, k, v)
    assert output.dtype == torch.float64 and probs is None
    assert strict_gradcheck(lambda q, k, v: attend(q, k, v)[0], (q, k, v))


def test_samsa_importance_is_computed_in_float64_and_passes_a_strict_gradcheck():
    _, head = samsa_module("encoder")
    _, k, _, _ = attention_inputs("encoder")
    assert head.importance(k).dtype == torch.float64
    assert strict_gradcheck(head.importance, (k,))


CASES = {
    "ssa": (SSA, {"mode": "unbiased", "keys": 3, "kinds": BOTH}, True),
    "sbm-dense": (SBM, SBM_SPEC, False),
    "sbm-fastrg": (SBM, {**SBM_SPEC, "sparse_above": 1}, False),
    "samsa": (SAMSA, {"keys": 3, "temperature": 1.0, "kinds": BOTH}, False),
}
FORWARDS = {SSA: ssa_attention_forward, SBM: sbm_attention_forward, SAMSA: samsa_attention_forward}
MODULES = {SSA: ssa, SBM: sbm, SAMSA: samsa}


@pytest.mark.parametrize(
    "dtype, compute",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.float64, torch.float64)],
    ids=["float32", "bfloat16", "float64"],
)
@pytest.mark.parametrize("case", CASES)
def test_scores_are_computed_in_float32_for_single_and_half_precision_and_float64_for_float64(
    case, dtype, compute, monkeypatch
):
    name, spec, training = CASES[case]
    module = attention_module(name, "decoder", spec, dtype).train(training)
    normalized = []
    original = MODULES[name].entmax_normalize

    def normalize(scores, alpha):
        normalized.append(scores.dtype)
        return original(scores, alpha)

    monkeypatch.setattr(MODULES[name], "entmax_normalize", normalize)
    q, k, v, mask = attention_inputs("decoder", n=6, dtype=dtype)
    torch.manual_seed(0)
    output, probs = FORWARDS[name](module, q, k, v, mask, scaling=1.0)
    assert normalized and set(normalized) == {compute}  # the head's own path, in the compute dtype
    assert output.dtype == dtype
    if probs is not None:
        assert probs.dtype == compute
    output.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == dtype
