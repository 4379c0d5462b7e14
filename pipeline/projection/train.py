"""Training and held-out evaluation of one layer's :class:`HeadProjections`.

Batch format (a mapping of tensors, one layer's data for a few sentences):

- ``q``: (B, H, n, d) float queries and ``k``: (B, H, m, d) float keys of the teacher;
- ``gold``: (B, H, n, m) bool, the gold attention graph (p_ij > 0);
- ``valid``: (B, n) bool, ``True`` on real tokens, for self-attention where queries and keys coincide; or
  ``q_valid``: (B, n) and ``k_valid``: (B, m) separately (cross-attention).

A ``BatchesFn`` is called once per epoch as ``batches_fn(batch_size, generator)`` and returns that epoch's
batches; it shuffles with ``generator`` (a seeded CPU generator) so training is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from tqdm.auto import tqdm

from pipeline.finite import require_finite
from pipeline.projection.hinge import hinge_loss, hinge_losses
from pipeline.projection.model import HeadProjections

Batch = Mapping[str, torch.Tensor]
BatchesFn = Callable[[int, torch.Generator], Iterable[Batch]]


def batch_masks(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_valid (B, n), k_valid (B, m)) of a batch given either ``valid`` or ``q_valid`` + ``k_valid``."""
    if "valid" in batch:
        return batch["valid"], batch["valid"]
    return batch["q_valid"], batch["k_valid"]


def in_memory_batches(data: Batch) -> BatchesFn:
    """A ``BatchesFn`` over tensors holding every sentence (same keys as a batch), shuffled each epoch."""
    n_sentences = data["q"].shape[0]

    def batches(batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        order = torch.randperm(n_sentences, generator=generator)
        for start in range(0, n_sentences, batch_size):
            idx = order[start : start + batch_size]
            yield {name: t[idx] for name, t in data.items()}

    return batches


def _to(batch: Batch, device: torch.device | str) -> dict[str, torch.Tensor]:
    return {name: t.to(device) for name, t in batch.items()}


def train_layer_projections(
    batches_fn: BatchesFn,
    *,
    n_heads: int,
    head_dim: int,
    causal: bool,
    rank: int = 4,
    shared: bool = False,
    hidden: int | None = None,
    epochs: int = 1,
    lr: float = 1e-3,
    batch_size: int = 16,
    grad_clip: float = 1.0,
    seed: int = 0,
    omega: float = 1.0,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> tuple[HeadProjections, list[float]]:
    """Fit one layer's projections with Adam on the hinge loss; returns (module, loss of every step).

    ``rank``, ``shared`` and ``hidden`` (None: linear, else the tanh MLP's hidden size) shape the
    :class:`HeadProjections`.

    Initialisation, batch order and negative sampling each draw from their own generator seeded by
    ``seed``, so the same inputs and seed give identical weights. Gradients are clipped to norm
    ``grad_clip`` before every step.
    """
    init_gen = torch.Generator().manual_seed(seed)
    shuffle_gen = torch.Generator().manual_seed(seed + 1)
    negatives_gen = torch.Generator(device=device).manual_seed(seed + 2)
    module = HeadProjections(n_heads, head_dim, rank, shared=shared, hidden=hidden, generator=init_gen)
    module = module.to(device)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    losses: list[float] = []
    module.train()
    for epoch in range(epochs):
        bar = tqdm(
            batches_fn(batch_size, shuffle_gen),
            desc=f"projections epoch {epoch + 1}/{epochs}",
            disable=not progress,
            leave=False,
        )
        for raw in bar:
            batch = _to(raw, device)
            q_valid, k_valid = batch_masks(batch)
            q_proj, k_proj = module(batch["q"], batch["k"])
            loss = hinge_loss(
                q_proj,
                k_proj,
                batch["gold"],
                q_valid,
                k_valid,
                causal=causal,
                generator=negatives_gen,
                omega=omega,
            )
            # stop before the bad step reaches the weights
            losses.append(require_finite(loss.item(), "project: the hinge loss", len(losses)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
            optimizer.step()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    module.eval()
    return module, losses


@torch.no_grad()
def held_out_loss(
    module: HeadProjections,
    batches: Iterable[Batch],
    *,
    causal: bool,
    omega: float = 1.0,
    seed: int = 0,
) -> float:
    """Mean hinge loss of ``module`` over every (sentence, head) cell of held-out batches.

    Negatives are drawn from a generator seeded by ``seed``, so the figure is reproducible.
    """
    device = next(module.parameters()).device
    negatives_gen = torch.Generator(device=device).manual_seed(seed)
    loss_sum, n_cells = 0.0, 0
    for raw in batches:
        batch = _to(raw, device)
        q_valid, k_valid = batch_masks(batch)
        q_proj, k_proj = module(batch["q"], batch["k"])
        per_cell, counted = hinge_losses(
            q_proj,
            k_proj,
            batch["gold"],
            q_valid,
            k_valid,
            causal=causal,
            generator=negatives_gen,
            omega=omega,
        )
        loss_sum += (per_cell * counted).sum().item()
        n_cells += int(counted.sum())
    return loss_sum / max(n_cells, 1)
