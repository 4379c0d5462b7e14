"""Stage ``teacher``: fine-tune a checkpoint with α-entmax in every attention module."""

from __future__ import annotations

from pipeline.attention import ENTMAX, attach_learned_alpha
from pipeline.checkpoint import describe_parent, loading
from pipeline.checks.teacher import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.models.pretrained import load_pretrained
from pipeline.params.teacher import Teacher
from pipeline.stage import stage_params
from pipeline.training.run import data_for_model, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("teacher", Teacher, argv)
    inputs = check_inputs(params)
    init, tokenizer = inputs.init, inputs.tokenizer
    data, corpus_tokenizer, task = inputs.corpus
    with loading(init, "teacher.init"):
        model = load_pretrained(init, task, attn_implementation=ENTMAX, entmax_alpha=params.alpha)
    if params.learn_alpha:
        attach_learned_alpha(model)
    data = data_for_model(
        data, corpus_tokenizer, tokenizer, model, task=task, key=f"teacher.init = {params.init!r}"
    )
    train_and_evaluate("teacher", params, model, tokenizer, data, describe_parent(init))


if __name__ == "__main__":
    main()
