"""Stage ``cluster``: k-means centroids per layer and head in the projected space, for every bucket count."""

from __future__ import annotations

from pipeline.atomic import write_json
from pipeline.clustering_store import fit_store_centroids, save_centroids
from pipeline.errors import exits_cleanly
from pipeline.graphs import GraphStore
from pipeline.projection.model import load_projections
from pipeline.stage import stage_params


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("cluster", argv)
    store = GraphStore(params.graphs)
    layers, extra = load_projections(params.projections)
    centroids, report = fit_store_centroids(store, layers, extra, params)
    save_centroids(params.out, centroids, {"kind": report["kind"], "bucket_counts": params.bucket_counts})
    write_json(params.metrics, report)


if __name__ == "__main__":
    main()
