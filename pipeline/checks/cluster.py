"""The ``cluster`` stage's checks: its projections were fitted on its graph store, the store has training
tokens enough for every centroid count, and the indexer's ranks fit the teacher's heads."""

from __future__ import annotations

from typing import Any

from pipeline.checks import InputCheck
from pipeline.clustering.kmeans import MIN_POINTS_PER_CENTROID
from pipeline.errors import UserError
from pipeline.graphs.store import GraphStore
from pipeline.origin import Origin
from pipeline.params.cluster import Cluster
from pipeline.projection.model import HeadProjections, load_projections


def input_checks(params: Cluster) -> list[InputCheck]:
    inputs = {"cluster.graphs": params.graphs, "cluster.projections": params.projections}
    return [InputCheck(inputs, lambda: check_inputs(params))]


def check_inputs(params: Cluster) -> tuple[GraphStore, dict[int, HeadProjections], dict[str, Any]]:
    """(graph store, projections by layer, the projections' header) after every check against them."""
    store = GraphStore(params.graphs)
    layers, extra = load_projections(params.projections, origin=Origin.of_store(store))
    split = extra["split"]
    if extra["kind"] not in store.kinds or max(split["train"] + split["valid"]) >= len(store):
        raise UserError(
            f"cluster.projections = {params.projections!r} was fitted on another graph store than "
            f"cluster.graphs = {params.graphs!r} ({extra['kind']}, {len(store)} sentences); re-run project"
        )
    check_cluster_counts(params, store, extra["kind"], split["train"])
    ranks = params.indexer.ranks if params.indexer.fittings else []
    if ranks and max(ranks) > store.head_dim:
        # the indexer's maps take the teacher's own queries and keys (head dim) to a rank below it
        raise UserError(
            f"cluster.indexer.ranks = {ranks}: rank {max(ranks)} exceeds the head dim {store.head_dim} of "
            f"the teacher's queries and keys in {params.graphs}; allowed: at most {store.head_dim}"
        )
    return store, layers, extra


def check_cluster_counts(params: Cluster, store: GraphStore, kind: str, train: list[int]) -> None:
    """One-line error, before any fitting, when a centroid count leaves fewer than
    ``MIN_POINTS_PER_CENTROID`` training tokens (queries and keys of every head) per centroid."""
    q_side, k_side = store.sides_of(kind)
    points = int(store.lengths(q_side)[train].sum() + store.lengths(k_side)[train].sum())
    allowed = points // MIN_POINTS_PER_CENTROID
    for key in ("bucket_counts", "routing_clusters"):
        counts = getattr(params, key)
        if counts and max(counts) > allowed:
            raise UserError(
                f"cluster.{key} = {counts}: {max(counts)} centroids need {MIN_POINTS_PER_CENTROID} training "
                f"tokens each, {params.graphs} has {points} per head; allowed: at most {allowed}"
            )
