"""Stage ``configure``: the teacher with a learned predictor's graph in its attention, as a model folder
(what ``sparsefinder configure`` writes), for the ``sparsefinder`` student to start from."""

from __future__ import annotations

from pipeline.attention import load_model
from pipeline.attention.configure import write_configured
from pipeline.attention.sparsefinder import SPARSEFINDER
from pipeline.checkpoint import folder_tokenizer, loading
from pipeline.checks.configure import check_inputs, check_params
from pipeline.errors import exits_cleanly
from pipeline.params.configure import Configure
from pipeline.stage import stage_params


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("configure", Configure, argv)
    check_params(params)
    inputs = check_inputs(params)
    predictor, layers = inputs.fitted
    with loading(inputs.teacher, "configure.teacher"):
        model = load_model(inputs.teacher, attn_implementation=SPARSEFINDER)
        tokenizer = folder_tokenizer(inputs.teacher)
    write_configured(
        inputs.teacher,
        params.out,
        model,
        tokenizer,
        predictor,
        kind=inputs.kind,
        layers=layers,
        window=params.window,
        global_tokens=params.global_tokens,
    )


if __name__ == "__main__":
    main()
