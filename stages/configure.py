"""Stage ``configure``: the teacher with a learned predictor's graph in its attention, as a model folder
(what ``sparsefinder configure`` writes), for the ``sparsefinder`` student to start from."""

from __future__ import annotations

from pipeline.attention.configure import configure_sparsefinder
from pipeline.checks.configure import check_params
from pipeline.errors import exits_cleanly
from pipeline.stage import stage_params


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("configure", argv)
    check_params(params)
    configure_sparsefinder(
        params.teacher,
        params.out,
        method=params.method,
        knobs=params.knobs,
        window=params.window,
        global_tokens=params.global_tokens,
        projections=params.projections,
        state=params.state,
    )


if __name__ == "__main__":
    main()
