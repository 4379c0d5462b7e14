"""Stage ``teacher``: fine-tune a checkpoint with α-entmax in every attention module."""

from __future__ import annotations

from transformers import AutoTokenizer

from pipeline.attention import ENTMAX, attach_learned_alpha
from pipeline.checkpoint import describe_parent, loading, resolve_checkpoint
from pipeline.errors import exits_cleanly
from pipeline.models.marian import load_seq2seq
from pipeline.stage import stage_params
from pipeline.training.run import check_generation_fits, encode_with, load_corpus, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("teacher", argv)
    init = resolve_checkpoint(params.init, "teacher.init")
    data, _ = load_corpus(params.data, "teacher.data")
    with loading(init, "teacher.init"):
        model = load_seq2seq(init, attn_implementation=ENTMAX, entmax_alpha=params.alpha)
        tokenizer = AutoTokenizer.from_pretrained(init)
    check_generation_fits("teacher", params, model)
    if params.learn_alpha:
        attach_learned_alpha(model)
    data = encode_with(tokenizer, data, model.config.max_position_embeddings)
    train_and_evaluate("teacher", params, model, tokenizer, data, describe_parent(init))


if __name__ == "__main__":
    main()
