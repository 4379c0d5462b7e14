"""Every attention implementation of this project, registered with ``transformers`` by one import.

    import pipeline.attention.implementations

makes each name of :data:`IMPLEMENTATIONS` a valid ``attn_implementation`` for any model that dispatches
through ``AttentionInterface``, and lets :func:`~pipeline.attention.loading.load_model` (re-exported here)
rebuild every folder the project writes: α (fixed or learned), predictor heads, SSA, SBM and SAMSA heads.
It also hands out the calls that attach each implementation's state to a user's own model, and
``make_predictor``, which names a predictor for :func:`attach_predictor`.

The pipeline's own stages import only the implementations they run (``import pipeline.attention`` registers
α-entmax alone), so that a change to one implementation, or to the kernels behind it, re-runs only the
stages that compute with it; this module is the library's entry point, not theirs.
"""

from __future__ import annotations

from pipeline.attention.entmax import ENTMAX, attach_learned_alpha, set_entmax_alpha
from pipeline.attention.loading import load_model
from pipeline.attention.samsa import SAMSA, attach_samsa
from pipeline.attention.sbm import SBM, attach_sbm
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_predictor, attach_sparsefinder
from pipeline.attention.ssa import SSA, attach_ssa
from pipeline.predictors.base import make_predictor

IMPLEMENTATIONS = (ENTMAX, SPARSEFINDER, SSA, SBM, SAMSA)
"""The ``attn_implementation`` names this import registers."""

__all__ = [
    "IMPLEMENTATIONS",
    "attach_learned_alpha",
    "attach_predictor",
    "attach_samsa",
    "attach_sbm",
    "attach_sparsefinder",
    "attach_ssa",
    "load_model",
    "make_predictor",
    "set_entmax_alpha",
]
