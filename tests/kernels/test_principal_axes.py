"""The keys' principal axes (``attention_kernels.indexed.principal_axes``): orthonormal eigenvectors of the
keys' Gram matrices, leading axes last, in the input's dtype and on its device (on a GPU, CUDA tensors too:
their matrices are solved on the CPU)."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.indexed.principal_axes import principal_axes

DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
def test_axes_diagonalise_the_gram_matrix_leading_axes_last(device: str):
    for dtype in (torch.float32, torch.float64):
        _check_axes(dtype, device)


def _check_axes(dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([8.0, 4.0, 1.0, 0.5, 0.1, 0.1])  # keys close to low-rank, as trained ones are
    keys = (torch.randn(3, 200, 6, generator=gen) * scales).to(device, dtype)  # (G, m, d)
    gram = keys.mT @ keys
    axes = principal_axes(gram)
    assert axes.dtype == dtype and axes.device == gram.device and axes.shape == (3, 6, 6)
    eye = torch.eye(6, dtype=dtype, device=device).expand(3, -1, -1)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(axes.mT @ axes, eye, rtol=0, atol=tol)
    spectrum = axes.mT @ gram @ axes  # diagonal, ascending
    values = torch.diagonal(spectrum, dim1=-2, dim2=-1)
    off = spectrum - torch.diag_embed(values)
    assert off.abs().max() <= 1e-4 * values.abs().max()
    assert (values[:, 1:] >= values[:, :-1]).all()
    # the last axis carries the keys' largest direction: the first coordinate here
    assert (axes[:, 0, -1].abs() > 0.99).all()
    torch.testing.assert_close(axes.cpu(), torch.linalg.eigh(gram.cpu()).eigenvectors, rtol=0, atol=0)
