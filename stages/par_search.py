"""Stage ``par_search``: PAR's architecture search on the teacher (:mod:`pipeline.par.search`).

The teacher becomes a supernet whose every self-attention and feed-forward position mixes {self-attention,
feed-forward, identity}, distilled from the teacher; the most probable choice per position gives the
searched patterns, and the teacher rearranged to them is saved as ``out``, for ``student@par`` to start
from. ``mixing`` keeps the mixing weights per position, ``plot`` draws them.
"""

from __future__ import annotations

import shutil

from pipeline.atomic import staged_outputs, write_json
from pipeline.attention import ENTMAX, load_model
from pipeline.checkpoint import loading, save_checkpoint
from pipeline.checks.par_search import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.par.search import search_architecture
from pipeline.params.par_search import ParSearch
from pipeline.plots.par import plot_mixing_weights
from pipeline.stage import stage_params
from pipeline.timings import metrics_files, write_metrics


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("par_search", ParSearch, argv)
    inputs = check_inputs(params)
    teacher_folder, tokenizer, teachers = inputs.teacher, inputs.tokenizer, inputs.layers
    corpus = inputs.corpus
    with loading(teacher_folder, "par_search.teacher"):
        teacher = load_model(teacher_folder, attn_implementation=ENTMAX)
    searched = search_architecture(params, teacher, teacher_folder, tokenizer, corpus)
    if searched is None:  # not the main process, which alone writes
        return
    # the searched model, its mixing weights, their plot and the metrics are swapped in together, so a
    # failure on the last never leaves the new model beside another search's patterns
    outputs = (params.out, params.mixing, params.plot, *metrics_files(params.metrics))
    with staged_outputs(*outputs):
        save_checkpoint(
            params.out,
            searched.model,
            tokenizer,
            {"stage": "par_search", "params": params.model_dump(), "parent": searched.parent},
        )
        write_json(params.mixing, searched.mixing(teachers))
        plot_mixing_weights(searched.mixing_weights, searched.patterns, params.plot)
        write_metrics(params.metrics, searched.metrics(teachers))
    shutil.rmtree(params.run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
