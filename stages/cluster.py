"""Stage ``cluster``: the fitted predictors, per layer and head in the projected space.

k-means centroids for every bucket count, the τ-indexer's low-rank maps for every rank and fitting, and the
fitted baselines: Routing Transformer's spherical centroids and Reformer's random rotations. All go to one
predictor state file. The indexer predicts the threshold of the teacher's own α (for a teacher with learned
per-head α, of the α it started from).
"""

from __future__ import annotations

from pipeline.clustering import resolve_backend
from pipeline.clustering.kmeans import MIN_POINTS_PER_CENTROID
from pipeline.errors import UserError, exits_cleanly
from pipeline.graphs import GraphStore
from pipeline.origin import Origin
from pipeline.params import Cluster
from pipeline.predictors.fitting import fit_predictors
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.predictors.kmeans import KMeansPredictor
from pipeline.predictors.reformer import ReformerPredictor
from pipeline.predictors.routing import RoutingPredictor
from pipeline.predictors.state import save_states
from pipeline.projection.model import load_projections
from pipeline.stage import stage_params
from pipeline.timings import write_metrics


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


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("cluster", argv)
    store = GraphStore(params.graphs)
    layers, extra = load_projections(params.projections, origin=Origin.of_store(store))
    split = extra["split"]
    if extra["kind"] not in store.kinds or max(split["train"] + split["valid"]) >= len(store):
        raise UserError(
            f"cluster.projections = {params.projections!r} was fitted on another graph store than "
            f"cluster.graphs = {params.graphs!r} ({extra['kind']}, {len(store)} sentences); re-run project"
        )
    check_cluster_counts(params, store, extra["kind"], split["train"])
    backend = resolve_backend(params.backend)
    predictors = [
        KMeansPredictor(
            buckets=b,
            top_k=params.top_k,
            iterations=params.iterations,
            max_points_per_centroid=params.max_points_per_centroid,
            backend=backend,
        )
        for b in params.bucket_counts
    ]
    predictors += [
        RoutingPredictor(clusters=c, iterations=params.iterations, seed=params.seed)
        for c in params.routing_clusters
    ]
    predictors += [ReformerPredictor(buckets=b, seed=params.seed) for b in params.reformer_buckets]
    alpha = store.manifest["teacher"].get("entmax_alpha") or IndexerPredictor.alpha
    predictors += [
        IndexerPredictor(
            rank=rank, alpha=alpha, fitting=fitting, epochs=params.indexer.epochs, lr=params.indexer.lr
        )
        for rank in params.indexer.ranks
        for fitting in params.indexer.fittings
    ]
    report = fit_predictors(store, extra["kind"], predictors, layers, split, seed=params.seed)
    save_states(params.out, predictors, {"graphs": store.manifest["teacher"], "kind": extra["kind"]})
    write_metrics(params.metrics, {"backend": backend, **report})


if __name__ == "__main__":
    main()
