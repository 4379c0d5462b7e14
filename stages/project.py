"""Stage ``project``: per-head low-rank query/key projections trained with the contrastive hinge loss.

Each head's projector is linear (``project.hidden: null``) or a tanh MLP with ``project.hidden`` units.
"""

from __future__ import annotations

from pipeline.atomic import staged_outputs, write_text
from pipeline.checks.project import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.params.project import Project
from pipeline.projection.fit_store import fit_store_projections
from pipeline.projection.model import save_projections
from pipeline.stage import stage_params
from pipeline.timings import metrics_files, write_metrics


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("project", Project, argv)
    store = check_inputs(params)
    layers, report, curve = fit_store_projections(store, params)
    split = report.pop("split")
    # the projections, their metrics and their loss curve are swapped in together, never one without the rest
    with staged_outputs(params.out, *metrics_files(params.metrics), params.plot):
        save_projections(
            params.out, layers, {"kind": params.kind, "split": split, "graphs": store.manifest["teacher"]}
        )
        write_metrics(params.metrics, report)
        write_text(
            params.plot,
            "layer,step,loss\n" + "".join(f"{r['layer']},{r['step']},{r['loss']:.6f}\n" for r in curve),
        )


if __name__ == "__main__":
    main()
