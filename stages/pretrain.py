"""Stage ``pretrain``: a softmax Marian trained from scratch, or fine-tuned from a named checkpoint."""

from __future__ import annotations

from transformers import AutoTokenizer

from pipeline.checkpoint import describe_parent
from pipeline.errors import exits_cleanly
from pipeline.models.marian import build_marian, load_seq2seq
from pipeline.stage import stage_params
from pipeline.training.run import encode_with, load_corpus, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("pretrain", argv)
    data, tokenizer = load_corpus(params.data)
    if params.init is None:
        model = build_marian(params.model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        parent = None
    else:
        tokenizer = AutoTokenizer.from_pretrained(params.init)
        data = encode_with(tokenizer, data, params.model.max_positions)
        model = load_seq2seq(params.init, attn_implementation="sdpa")
        parent = describe_parent(params.init)
    train_and_evaluate("pretrain", params, model, tokenizer, data, parent)


if __name__ == "__main__":
    main()
