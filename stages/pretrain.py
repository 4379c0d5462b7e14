"""Stage ``pretrain``: a softmax Marian trained from scratch, or fine-tuned from a named checkpoint."""

from __future__ import annotations

from transformers import AutoTokenizer

from pipeline.checkpoint import describe_parent, loading, resolve_checkpoint
from pipeline.errors import UserError, exits_cleanly
from pipeline.models.marian import build_marian, load_seq2seq
from pipeline.stage import stage_params
from pipeline.training.run import (
    check_generation_fits,
    encode_with,
    load_corpus,
    longest_sequence,
    train_and_evaluate,
)


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("pretrain", argv)
    init = None if params.init is None else resolve_checkpoint(params.init, "pretrain.init")
    data, tokenizer = load_corpus(params.data, "pretrain.data")
    if init is None:
        longest = longest_sequence(data)
        if longest > params.model.max_positions:
            raise UserError(
                f"pretrain.model.max_positions = {params.model.max_positions}: {params.data} holds sequences "
                f"of up to {longest} tokens; allowed: at least {longest} (or a lower prepare.max_length)"
            )
        model = build_marian(
            params.model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, params.train.seed
        )
        parent = None
    else:
        with loading(init, "pretrain.init"):
            tokenizer = AutoTokenizer.from_pretrained(init)
            model = load_seq2seq(init, attn_implementation="sdpa")
        check_generation_fits("pretrain", params, model)
        table = getattr(model.config, "max_position_embeddings", params.model.max_positions)
        data = encode_with(tokenizer, data, min(params.model.max_positions, table))
        parent = describe_parent(init)
    train_and_evaluate("pretrain", params, model, tokenizer, data, parent)


if __name__ == "__main__":
    main()
