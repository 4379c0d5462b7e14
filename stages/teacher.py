"""Stage ``teacher``: fine-tune a checkpoint with α-entmax in every attention module."""

from __future__ import annotations

from pipeline.attention import ENTMAX, attach_learned_alpha
from pipeline.checkpoint import describe_parent, load_auto_tokenizer, load_config, loading, resolve_checkpoint
from pipeline.corpus_card import TASKS, read_corpus_card
from pipeline.errors import exits_cleanly
from pipeline.models.pretrained import load_pretrained
from pipeline.stage import stage_params
from pipeline.training.run import check_generation_fits, data_for_model, load_corpus, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("teacher", argv)
    init = resolve_checkpoint(params.init, "teacher.init", writer="pretrain")
    data, corpus_tokenizer = load_corpus(params.data, "teacher.data", tasks=TASKS)
    task = read_corpus_card(params.data, "teacher.data").task
    with loading(init, "teacher.init"):
        if task == "translation":
            check_generation_fits("teacher", params, load_config(init))
        model = load_pretrained(init, task, attn_implementation=ENTMAX, entmax_alpha=params.alpha)
        tokenizer = load_auto_tokenizer(init)
    if params.learn_alpha:
        attach_learned_alpha(model)
    data = data_for_model(
        data, corpus_tokenizer, tokenizer, model, task=task, key=f"teacher.init = {params.init!r}"
    )
    train_and_evaluate("teacher", params, model, tokenizer, data, describe_parent(init))


if __name__ == "__main__":
    main()
