"""The public entry ``attention_kernels.bucketed.bucketed_attention``: input checks, choice of backend."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from attention_kernels import bucketed
from attention_kernels.bucketed import torch_path
from attention_kernels.bucketed.reference import dense_bucketed_attention

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()


def inputs(n: int = 9, m: int | None = None, t: int = 2, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    m = n if m is None else m
    q = torch.randn(2, 3, n, 8, generator=gen, dtype=dtype).to(device)
    k = torch.randn(2, 3, m, 8, generator=gen, dtype=dtype).to(device)
    v = torch.randn(2, 3, m, 8, generator=gen, dtype=dtype).to(device)
    qb = torch.randint(-1, 3, (2, 3, n, t), generator=gen, dtype=torch.int32).to(device)
    kb = torch.randint(-1, 3, (2, 3, m, t), generator=gen, dtype=torch.int32).to(device)
    return q, k, v, qb, kb


def test_cpu_tensors_run_the_torch_path(monkeypatch):
    calls = []
    original = torch_path.torch_bucketed_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch_path, "torch_bucketed_attention", spy)
    q, k, v, qb, kb = inputs()
    out = bucketed.bucketed_attention(q, k, v, qb, kb, alpha=2, window=3, global_tokens=1, causal=True)
    assert calls == [dict(alpha=2.0, causal=True, radius=1, global_tokens=1, scale=None)]
    expected = original(q, k, v, qb, kb, alpha=2.0, causal=True, radius=1, global_tokens=1)
    assert torch.equal(out, expected)


def test_cpu_use_works_without_triton():
    code = (
        "import sys, torch\n"
        "sys.modules['triton'] = None  # any import of triton now fails\n"
        "from attention_kernels import bucketed\n"
        "q = torch.randn(1, 1, 5, 4); b = torch.zeros(1, 1, 5, 1, dtype=torch.int32)\n"
        "bucketed.bucketed_attention(q, q, q, b, b)\n"
        "assert 'attention_kernels.bucketed.triton_kernel' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the child's traceback, when it has one


def test_triton_route_imports_the_kernel_lazily(monkeypatch):
    calls = []
    fake = types.ModuleType("attention_kernels.bucketed.triton_kernel")
    fake.triton_bucketed_attention = lambda *args, **kwargs: calls.append(kwargs) or "triton"
    monkeypatch.setitem(sys.modules, "attention_kernels.bucketed.triton_kernel", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, qb, kb = inputs()
    assert bucketed.bucketed_attention(q, k, v, qb, kb, scale=0.5, backend="triton") == "triton"
    assert calls == [dict(alpha=1.5, causal=False, radius=-1, global_tokens=0, scale=0.5)]


@pytest.mark.skipif(CUDA, reason="with a GPU the kernels are compiled when imported, not interpreted")
def test_forced_triton_backend_on_cpu_runs_the_interpreted_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, qb, kb = inputs()
    out = bucketed.bucketed_attention(q, k, v, qb, kb, window=3, backend="triton")
    expected = bucketed.bucketed_attention(q, k, v, qb, kb, window=3, backend="torch")
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


@pytest.mark.skipif(CUDA, reason="CUDA tensors do not need the interpreter")
def test_forced_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, qb, kb = inputs()
    with pytest.raises(ValueError, match=r"backend 'triton' needs CUDA tensors .*; got tensors on cpu"):
        bucketed.bucketed_attention(q, k, v, qb, kb, backend="triton")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_tensors_run_triton_except_float64(monkeypatch):
    from attention_kernels.bucketed import triton_kernel

    calls = []
    original = triton_kernel.triton_bucketed_attention

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_kernel, "triton_bucketed_attention", spy)
    q, k, v, qb, kb = inputs(n=130, device="cuda")
    out = bucketed.bucketed_attention(q, k, v, qb, kb, window=5)
    assert calls == [torch.float32]
    # Sanity only (accuracy is the kernel tests' job): a wrong mask would be off by ~0.1 or more.
    expected = torch_path.torch_bucketed_attention(q, k, v, qb, kb, radius=2)
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-2)
    bucketed.bucketed_attention(q.double(), k.double(), v.double(), qb, kb)  # the PyTorch path on CUDA
    assert calls == [torch.float32]


def test_float64_cross_attention_computes_the_dense_reference():
    """Nine queries against fourteen keys in float64, with a window and an explicit scale: the output is the
    dense reference's to float64 round-off (the bound the kernel tests use for float64 inputs)."""
    q, k, v, qb, kb = inputs(n=9, m=14, t=3, dtype=torch.float64)
    options = dict(alpha=1, window=5, scale=0.3)
    out = bucketed.bucketed_attention(q, k, v, qb, kb, **options)
    assert out.shape == q.shape and out.dtype == torch.float64
    expected = dense_bucketed_attention(q, k, v, qb, kb, **options)
    assert expected.abs().amax(-1).min() > 0.1  # every query attends something: no row is trivially zero
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def call_with(tensors: dict, options: dict):
    """A valid call with some tensors replaced (a callable receives the valid one) and options added."""
    q, k, v, qb, kb = inputs()
    args = dict(q=q, k=k, v=v, q_buckets=qb, k_buckets=kb)
    for key, change in tensors.items():
        args[key] = change(args[key]) if callable(change) else change
    return bucketed.bucketed_attention(**args, **options)


BAD = [
    ("q not a tensor", {"q": [[1.0]]}, {}, "q must be a torch.Tensor"),
    ("q 3-d", {"q": lambda q: q[0]}, {}, r"q must be \(batch, heads, tokens, d\)"),
    ("q integer", {"q": lambda q: q.long()}, {}, "q must be float16, bfloat16, float32 or float64"),
    ("mixed dtypes", {"k": lambda k: k.half()}, {}, "q, k, v must share one dtype"),
    ("k head dim", {"k": lambda k: k[..., :4]}, {}, r"k must be \(batch, kv_heads, m, d\)"),
    ("k heads", {"k": lambda k: k[:, :2]}, {}, r"k must be \(batch, kv_heads, m, d\) = \(2, a divisor of 3"),
    ("v heads", {"v": lambda v: v[:, :1]}, {}, "v must have k's shape"),
    ("v length", {"v": lambda v: v[:, :, :5]}, {}, "v must have k's shape"),
    ("empty q", {"q": lambda q: q[:, :, :0]}, {}, "must be non-empty"),
    ("float ids", {"q_buckets": lambda b: b.float()}, {}, "q_buckets must hold integer bucket ids"),
    ("bool ids", {"k_buckets": lambda b: b > 0}, {}, "k_buckets must hold integer bucket ids"),
    ("ids not a tensor", {"q_buckets": [0]}, {}, "q_buckets must be a torch.Tensor"),
    ("ids 3-d", {"k_buckets": lambda b: b[..., 0]}, {}, r"k_buckets must be \(batch, heads, tokens, T\)"),
    ("ids T = 0", {"q_buckets": lambda b: b[..., :0]}, {}, "T ≥ 1"),
    (
        "ids length",
        {"q_buckets": lambda b: b[:, :, :4]},
        {},
        r"q_buckets must be \(batch, heads, tokens, T\)",
    ),
    ("ids below -1", {"k_buckets": lambda b: b - 5}, {}, r"k_buckets ids must be −1 \(none\)"),
    ("alpha below 1", {}, {"alpha": 0.5}, "alpha must be a finite number ≥ 1"),
    ("alpha nan", {}, {"alpha": float("nan")}, "alpha must be a finite number ≥ 1"),
    ("alpha string", {}, {"alpha": "1.5"}, "alpha must be a finite number ≥ 1"),
    ("alpha bool", {}, {"alpha": True}, "alpha must be a finite number ≥ 1"),
    ("window negative", {}, {"window": -1}, r"window must be 0 \(none\) or an odd size"),
    ("window float", {}, {"window": 3.5}, r"window must be 0 \(none\) or an odd size"),
    ("window even", {}, {"window": 4}, r"window must be 0 \(none\) or an odd size w \(\|i − j\| ≤ w // 2"),
    ("global negative", {}, {"global_tokens": -2}, "global_tokens must be an integer ≥ 0"),
    ("causal not bool", {}, {"causal": 1}, "causal must be True or False"),
    ("scale zero", {}, {"scale": 0.0}, "scale must be None"),
    ("scale inf", {}, {"scale": float("inf")}, "scale must be None"),
    (
        "unknown backend",
        {},
        {"backend": "cuda"},
        "backend must be one of 'auto', 'triton', 'torch'; got 'cuda'",
    ),
    (
        "float64 on triton",
        {name: (lambda x: x.double()) for name in "qkv"},
        {"backend": "triton"},
        "backend 'triton' takes float16, bfloat16 or float32; got torch.float64",
    ),
]


@pytest.mark.parametrize(("tensors", "options", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inputs_raise_clear_value_errors(tensors, options, message):
    with pytest.raises(ValueError, match=message):
        call_with(tensors, options)


def test_causal_needs_as_many_queries_as_keys():
    q, k, v, qb, kb = inputs(n=9, m=12)
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys; got n = 9, m = 12"):
        bucketed.bucketed_attention(q, k, v, qb, kb, causal=True)
