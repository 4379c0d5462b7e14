"""The ``project`` stage's checks: its graph store holds the kind and enough sentences, its rank fits."""

from __future__ import annotations

from pipeline.checks import InputCheck
from pipeline.errors import UserError
from pipeline.graphs.store import GraphStore
from pipeline.params.project import Project


def input_checks(params: Project) -> list[InputCheck]:
    return [InputCheck({"project.graphs": params.graphs}, lambda: check_inputs(params))]


def check_inputs(params: Project) -> GraphStore:
    """The graph store ``project.graphs``, after checking that projections of ``project.rank`` dims for
    ``project.kind`` can be fitted on it.

    The projections map the teacher's head-dim queries and keys to ``rank`` dims; a rank above the head
    dim adds nothing a linear map could use and only multiplies the memory.
    """
    store = GraphStore(params.graphs)
    if params.kind not in store.kinds:
        holds = ", ".join(store.kinds)
        raise UserError(f"project.kind = {params.kind!r}: {params.graphs} holds only {holds}")
    if len(store) < 2:
        raise UserError(
            f"project.graphs = {params.graphs!r} holds {len(store)} sentence; holding some out needs at "
            "least 2"
        )
    if params.rank > store.head_dim:
        raise UserError(
            f"project.rank = {params.rank}: the teacher's heads in {params.graphs} have {store.head_dim} "
            f"dims, which the projections map to rank dims; allowed: at most {store.head_dim}"
        )
    return store
