"""Routing Transformer baseline: spherical k-means centroids, each picking its top ⌈L/c⌉ tokens.

Per layer and head, c unit centroids μ_1 … μ_c are fitted offline by spherical k-means on the L2-normalised
projected queries and keys of the training split (padding excluded; :mod:`pipeline.clustering.kmeans`; the
paper updates them online, which a frozen teacher does not need). For a sentence with L real tokens, each
centroid routes the ⌈L/c⌉ tokens of largest cosine similarity to it, separately among queries and keys:

    Q_b = top-⌈L/c⌉_i  q̂′_i · μ_b,   K_b = top-⌈L/c⌉_j  k̂′_j · μ_b,      Ĝ = ⋃_b Q_b × K_b.

The direction is the reverse of k-means (where each token picks its nearest centroid): a token picked by
several centroids keeps all of them, and a token picked by none gets no bucket, so some queries attend no
predicted key. Bucket b sits in slot b of T = c slots (−1 where b did not pick the token). Equal
similarities go to the earlier position; padding is never picked. The reference code takes L//c + 1 tokens,
keeps only a token's first centroid and lets padding fill slots; none of that is copied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.predictors.base import HeadInputs, Prediction, Predictor, positive_int, register
from pipeline.predictors.kmeans import fit_head_centroids


def routed_buckets(x: torch.Tensor, centroids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int32 (batch, heads, n, c): slot b holds b where centroid b picked the token, else −1.

    ``x`` is (batch, heads, n, r), ``centroids`` (heads, c, r), ``valid`` (batch, n).
    """
    clusters = centroids.shape[-2]
    # a column's ranking over tokens ignores the centroid's norm, so only the tokens need normalising
    sims = F.normalize(x, dim=-1) @ centroids.to(x).transpose(-1, -2)  # (b, h, n, c)
    sims = sims.masked_fill(~valid[:, None, :, None], float("-inf"))  # padding ranks last
    ranks = sims.argsort(dim=-2, descending=True, stable=True).argsort(dim=-2)  # (b, h, n, c)
    per_centroid = (valid.sum(-1) + clusters - 1).div(clusters, rounding_mode="floor")  # (b,) ⌈L/c⌉
    picked = ranks < per_centroid[:, None, None, None]  # (b, h, n, c); ⌈L/c⌉ ≤ L keeps padding out
    slots = torch.arange(clusters, device=x.device)
    return torch.where(picked, slots, -1).to(torch.int32)


@register
@dataclass(frozen=True)
class RoutingPredictor(Predictor):
    """``clusters`` spherical centroids each routing its top ⌈L/c⌉ tokens (paper grid c = 2 … 10)."""

    name = "routing"
    scope = "sentence"
    fitted = True
    fit_knobs = ("clusters", "iterations", "seed")
    clusters: int = 4
    iterations: int = 25
    seed: int = 0

    def check(self) -> None:
        positive_int(self.name, "clusters", self.clusters, least=2)
        positive_int(self.name, "iterations", self.iterations)
        positive_int(self.name, "seed", self.seed, least=0)

    def fit_layer(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> dict[str, torch.Tensor]:
        # the seed knob (part of the state key) seeds k-means, not the fitting run's seed
        centroids = fit_head_centroids(
            batches,
            self.clusters,
            knob=f"{self.name}.clusters",
            layer=layer,
            seed=self.seed,
            n_iter=self.iterations,
            spherical=True,
        )
        return {"centroids": centroids}  # (h, c, r), unit rows

    def layer_state_shapes(
        self, heads: int | None, rank: int | None, head_dim: int | None
    ) -> dict[str, tuple[int | None, ...]]:
        return {"centroids": (heads, self.clusters, rank)}

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        centroids = self.layer_state(layer)["centroids"]
        q_proj, k_proj = inputs.projected()
        return Prediction(
            q_buckets=routed_buckets(q_proj, centroids, inputs.q_valid),
            k_buckets=routed_buckets(k_proj, centroids, inputs.k_valid),
        )
