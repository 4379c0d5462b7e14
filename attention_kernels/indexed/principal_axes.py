"""The keys' principal axes, in which the certified bounds are tight.

``principal_axes(gram)``: the eigenvectors U of a batch of symmetric d × d matrices Σ_j k_j k_jᵀ, eigenvalues
ascending (the leading axes are the last columns). q·k = (Uᵀq)·(Uᵀk) for any orthonormal U, so a bound
computed in that basis holds; in it the per-channel ranges of a block of keys are narrow on all but a few
channels, since keys are close to low-rank.

A matrix of CUDA tensors is solved on the CPU: d is a head dimension (≤ 256), where LAPACK takes
microseconds per matrix, while cuSOLVER's batched eigh takes milliseconds (on an H200 with torch
2.11+cu130 the certified forward's bounds phase took 11.5 ms of 21 at n = 16384; that torch's eigh on CUDA
is 30-130× slower than 2.5's, pytorch/pytorch#183806). The copy is d² numbers per matrix.
"""

from __future__ import annotations

import torch


def principal_axes(gram: torch.Tensor) -> torch.Tensor:
    """(…, d, d) orthonormal eigenvectors of the symmetric ``gram`` (…, d, d), eigenvalues ascending, in
    ``gram``'s dtype and on its device."""
    if gram.device.type == "cpu":
        return torch.linalg.eigh(gram).eigenvectors
    return torch.linalg.eigh(gram.cpu()).eigenvectors.to(gram.device)
