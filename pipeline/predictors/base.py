"""The predictor interface: from one layer's queries and keys to a predicted attention graph Ĝ ≈ G.

A predictor is one method with its knobs fixed (k-means with B = 8 centroids and top-1, distance with t = 1,
BigBird with r = 4 random keys, ...). Some are fitted on the training sentences of a graph store, which gives
them per-layer tensors (centroids, rotations) saved as safetensors (:mod:`pipeline.predictors.state`). For a
batch of one layer's heads a predictor returns a :class:`Prediction`: bucket ids (the kernel's currency, so
the prediction can run sparsely) or a boolean mask of pairs (distance, random patterns).

The window and global pattern and the valid pairs are not a predictor's business: :func:`predicted_graph`
adds them the one way the kernel computes them (:mod:`attention_kernels.attended`), so a graph scored here is
exactly the set ``attention_kernels.bucketed.bucketed_attention`` attends for the same bucket ids.

Knobs are the dataclass fields of a predictor; ``fit_knobs`` names those that change its fitted state (a
k-means predictor's centroids depend on B, not on top-k), so predictors that differ only in other knobs
share one fitted state.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from attention_kernels.attended import pattern_pairs, shared_bucket_pairs, valid_pairs
from pipeline.errors import UserError


@dataclass(frozen=True)
class HeadInputs:
    """What a predictor sees of one layer: every head of a batch of sentences, right-padded.

    ``q_proj`` / ``k_proj`` are the learned low-rank projections of the queries and keys (None when the
    predictor needs none and no projections were given). ``scaling`` is the factor the model multiplies
    q·kᵀ by (None: head_dim^−½). ``allowed`` restricts the pairs further, as a model's own mask does (a
    cached decoding step's queries sit after the cached keys); None means the valid pairs.
    """

    q: Tensor  # (b, h, n, d) teacher queries, unscaled
    k: Tensor  # (b, h, m, d) teacher keys
    q_valid: Tensor  # (b, n) bool, True on real queries
    k_valid: Tensor  # (b, m) bool, True on real keys
    causal: bool
    q_proj: Tensor | None = None  # (b, h, n, r)
    k_proj: Tensor | None = None  # (b, h, m, r)
    scaling: float | None = None
    allowed: Tensor | None = None  # (b, 1 | h, n, m) bool

    def score_scale(self) -> float:
        """The model's factor on q·kᵀ."""
        return self.q.shape[-1] ** -0.5 if self.scaling is None else self.scaling

    def pairs(self) -> Tensor:
        """(b, 1 | h, n, m) bool: the pairs a query may attend, ``allowed`` or the valid pairs."""
        if self.allowed is not None:
            return self.allowed
        return valid_pairs(self.q_valid, self.k_valid, causal=self.causal)[:, None]

    def projected(self) -> tuple[Tensor, Tensor]:
        """(q_proj, k_proj); a one-line error when the caller gave no projections."""
        if self.q_proj is None or self.k_proj is None:
            raise UserError("this predictor works on projected queries and keys; give it a projections file")
        return self.q_proj, self.k_proj


@dataclass(frozen=True)
class Prediction:
    """Bucket ids for queries and keys (int32 (b, h, n | m, T), −1 for none), or a (b, h | 1, n, m) mask."""

    q_buckets: Tensor | None = None
    k_buckets: Tensor | None = None
    mask: Tensor | None = None

    def __post_init__(self) -> None:
        has_buckets = self.q_buckets is not None and self.k_buckets is not None
        if has_buckets == (self.mask is not None) or (self.q_buckets is None) != (self.k_buckets is None):
            raise ValueError("a prediction is either q_buckets and k_buckets, or a mask")

    @property
    def is_buckets(self) -> bool:
        return self.mask is None


def learned_pairs(prediction: Prediction) -> Tensor:
    """(b, h | 1, n, m) bool: the predictor's own part of Ĝ, the pairs that share a bucket id (as
    :func:`~attention_kernels.attended.shared_bucket_pairs` defines them for the kernel) or its mask."""
    if prediction.is_buckets:
        return shared_bucket_pairs(prediction.q_buckets, prediction.k_buckets)
    return prediction.mask


def with_pattern(learned: Tensor, valid: Tensor, *, window: int, global_tokens: int) -> Tensor:
    """Boolean (b, h | 1, n, m) Ĝ = (learned ∪ window ∪ global) ∩ valid, ``valid`` (b, 1, n, m) the valid
    pairs with the causal cut (:func:`~attention_kernels.attended.valid_pairs`): the kernel's attended set
    (:func:`~attention_kernels.attended.attended_mask`) within the valid pairs."""
    n, m = valid.shape[-2:]
    pattern = pattern_pairs(n, m, window=window, global_tokens=global_tokens, device=valid.device)
    return (learned | pattern) & valid


def predicted_graph(
    prediction: Prediction, q_valid: Tensor, k_valid: Tensor, *, causal: bool, window: int, global_tokens: int
) -> Tensor:
    """Boolean (b, h | 1, n, m) Ĝ = (learned ∪ window ∪ global) ∩ causal ∩ valid, as
    :mod:`attention_kernels.attended` defines it (:func:`learned_pairs`, :func:`with_pattern`)."""
    valid = valid_pairs(q_valid, k_valid, causal=causal)[:, None]  # (b, 1, n, m)
    return with_pattern(learned_pairs(prediction), valid, window=window, global_tokens=global_tokens)


class Predictor(ABC):
    """One method with fixed knobs (the subclass's dataclass fields); see the module docstring.

    Subclasses are frozen dataclasses registered with :func:`register`; they set ``name``, ``fit_knobs``
    and, when they learn state, ``fitted = True``, :meth:`fit_layer` and :meth:`layer_state_shapes`.
    """

    name: ClassVar[str]
    fitted: ClassVar[bool] = False
    fit_knobs: ClassVar[tuple[str, ...]] = ()
    needs_projections: ClassVar[bool] = True
    # What one pair's prediction depends on: "token" (that query and that key only, so a decoder can run
    # it step by step with a cache), "sentence" (every token of the sentence, e.g. ranks) or "batch" (the
    # batch's layout too, e.g. random draws by position in the batch). "row" lies between "token" and
    # "sentence": the query and every key it may attend, which a decoder has at each step.
    scope: ClassVar[str] = "token"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_state", {})
        self.check()

    def check(self) -> None:  # noqa: B027 (a predictor without knobs has nothing to check)
        """Raise :class:`UserError` naming a bad knob (called on construction)."""

    # -- fitted state -----------------------------------------------------------------------------------
    def fit_layer(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> dict[str, Tensor]:
        """Learn ``layer``'s state from training batches; returns its tensors (stateless predictors: none)."""
        return {}

    def fit(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> None:
        """Fit ``layer`` and keep its state."""
        self._state[layer] = {k: v.contiguous() for k, v in self.fit_layer(layer, batches, seed).items()}

    def layer_state(self, layer: int) -> dict[str, Tensor]:
        """The fitted tensors of ``layer``; a one-line error when it was never fitted."""
        if self.fitted and layer not in self._state:
            fitted = sorted(self._state) or "none"
            raise UserError(
                f"predictor {self.describe()} has no fitted state for layer {layer} (fitted: {fitted})"
            )
        return self._state.get(layer, {})

    def set_layer_state(self, layer: int, tensors: dict[str, Tensor]) -> None:
        self._state[layer] = dict(tensors)

    def layer_state_shapes(
        self, heads: int | None, rank: int | None, head_dim: int | None
    ) -> dict[str, tuple[int | None, ...]]:
        """The tensors one layer's fitted state holds and their shapes, for ``heads`` heads, projections of
        rank ``rank`` and heads of size ``head_dim`` (None where the reader does not know it: not checked).
        A state file is checked against it where it is read (stateless predictors: none)."""
        return {}

    @property
    def state_layers(self) -> list[int]:
        return sorted(self._state)

    def state_key(self) -> str:
        """Name of the fitted state: the method and its fit knobs (``kmeans[buckets=8]``)."""
        return f"{self.name}[{','.join(f'{k}={getattr(self, k)}' for k in self.fit_knobs)}]"

    def knobs(self) -> dict[str, Any]:
        """Every knob, JSON-ready."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """``kmeans(buckets=8, top_k=1)``."""
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.knobs().items())})"

    def with_knobs(self, **knobs: Any) -> Predictor:
        """The same method with other knobs; it shares this one's fitted state when its fit knobs agree."""
        other = dataclasses.replace(self, **knobs)
        if other.state_key() == self.state_key():
            object.__setattr__(other, "_state", self._state)
        return other

    # -- prediction ---------------------------------------------------------------------------------------
    @abstractmethod
    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        """Bucket ids or a mask for every head of ``inputs`` (padding gets no bucket / no pair)."""


PREDICTORS: dict[str, type[Predictor]] = {}


def register(cls: type[Predictor]) -> type[Predictor]:
    """Class decorator: make ``cls`` available to :func:`make_predictor` under ``cls.name``."""
    PREDICTORS[cls.name] = cls
    return cls


def make_predictor(name: str, **knobs: Any) -> Predictor:
    """The predictor ``name`` with ``knobs``; one-line :class:`UserError` for an unknown name or knob."""
    if name not in PREDICTORS:
        raise UserError(f"unknown predictor {name!r}; allowed: {', '.join(sorted(PREDICTORS))}")
    cls = PREDICTORS[name]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise UserError(
            f"predictor {name} has no knob {', '.join(unknown)}; its knobs: {', '.join(allowed) or 'none'}"
        )
    return cls(**knobs)


def positive_int(predictor: str, knob: str, value: object, *, least: int = 1) -> None:
    """One-line error unless ``value`` is an integer ≥ ``least`` (knob checks share it)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"{predictor}.{knob} must be an integer >= {least}; got {value!r}")


def padding_to_none(ids: Tensor, valid: Tensor) -> Tensor:
    """int32 bucket ids (b, h, n, T) with every padding token's ids set to −1 (``valid`` is (b, n))."""
    return ids.to(torch.int32).masked_fill(~valid[:, None, :, None], -1)


def layer_generator(seed: int, layer: int) -> torch.Generator:
    """A CPU generator for one layer of a random predictor: a distinct, reproducible stream per (seed, layer).

    Random predictors draw from it, never from the global RNG, and on the CPU, so the same knobs give the
    same prediction on any device.
    """
    # SeedSequence mixes the pair, so nearby (seed, layer) pairs don't give overlapping streams
    state = np.random.SeedSequence([seed, layer]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def random_subset(allowed: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Bool like ``allowed`` (..., m): k positions per row drawn uniformly without replacement among its True
    positions (all of them when fewer are True).

    The k largest of i.i.d. uniform scores form a uniform k-subset; disallowed positions score below every
    draw, so they are taken only when a row has fewer than k allowed, and then dropped.
    """
    scores = torch.rand(allowed.shape, generator=generator).to(allowed.device)  # (..., m)
    scores = scores.masked_fill(~allowed, -1.0)
    top = scores.topk(min(k, allowed.shape[-1]), dim=-1).indices  # (..., min(k, m))
    return torch.zeros_like(allowed).scatter_(-1, top, True) & allowed
