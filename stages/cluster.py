"""Stage ``cluster``: the fitted predictors, per layer and head in the projected space.

k-means centroids for every bucket count, the τ-indexer's low-rank maps for every rank and fitting, and the
fitted baselines: Routing Transformer's spherical centroids and Reformer's random rotations. All go to one
predictor state file. The indexer predicts the threshold of the teacher's own α (for a teacher with learned
per-head α, of the α it started from).
"""

from __future__ import annotations

from pipeline.atomic import staged_outputs
from pipeline.checks.cluster import check_inputs
from pipeline.clustering import resolve_backend
from pipeline.errors import exits_cleanly
from pipeline.params.cluster import Cluster
from pipeline.predictors.fitting import fit_predictors
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.predictors.kmeans import KMeansPredictor
from pipeline.predictors.reformer import ReformerPredictor
from pipeline.predictors.routing import RoutingPredictor
from pipeline.predictors.state import save_states
from pipeline.stage import stage_params
from pipeline.timings import metrics_files, write_metrics


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("cluster", Cluster, argv)
    store, layers, extra = check_inputs(params)
    split = extra["split"]
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
    # the state file and the metrics describing it are swapped in together
    with staged_outputs(params.out, *metrics_files(params.metrics)):
        save_states(params.out, predictors, {"graphs": store.manifest["teacher"], "kind": extra["kind"]})
        write_metrics(params.metrics, {"backend": backend, **report})


if __name__ == "__main__":
    main()
