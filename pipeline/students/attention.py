"""Every attention a student may run, registered with ``transformers`` on import, and how each one is put
into a model loaded from the student's starting folder.

- ``sparsefinder`` and ``entmax`` need nothing attached: the starting folder already holds the predictor
  (the ``configure`` stage's) or is the teacher itself.
- ``ssa``, ``sbm`` and ``samsa`` attach heads to the model's self-attention modules from the settings of the
  student's spec (the fields their ``check_spec`` reads), and record those settings in the model's config,
  so that the saved student loads back from its folder alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from pipeline.attention import ENTMAX, samsa, sbm, ssa
from pipeline.attention.sparsefinder import SPARSEFINDER

Attacher = Callable[[PreTrainedModel, dict[str, Any]], Any]

# attention name → (the function that attaches its heads, the spec fields it reads)
ATTACHED: dict[str, tuple[Attacher, tuple[str, ...]]] = {
    ssa.SSA: (ssa.attach_ssa, ssa.SPEC_KEYS),
    sbm.SBM: (sbm.attach_sbm, sbm.SPEC_KEYS),
    samsa.SAMSA: (samsa.attach_samsa, samsa.SPEC_KEYS),
}
STUDENT_ATTENTIONS = (SPARSEFINDER, ENTMAX, *ATTACHED)


class AttentionSpec(Protocol):
    """What this module reads of a student's spec (a :data:`~pipeline.params.student.StudentSpec`): the
    attention's name, and the fields its ``SPEC_KEYS`` name. A protocol rather than the schema, so that
    reading a student folder (the evaluate stage) does not import the student section's schema."""

    attention: str


def attach_student_attention(model: PreTrainedModel, spec: AttentionSpec, *, seed: int) -> None:
    """Put ``spec``'s attention heads into ``model`` (loaded with ``attn_implementation=spec.attention``).

    Heads with parameters (SBM, SAMSA) draw their initial values from a generator seeded with ``seed``,
    inside a forked RNG, so a student starts from the same weights on every run and the global RNG the
    Trainer seeds later is left as it was.
    """
    attached = ATTACHED.get(spec.attention)
    if attached is None:
        return
    attach, keys = attached
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attach(model, {key: getattr(spec, key) for key in keys})
