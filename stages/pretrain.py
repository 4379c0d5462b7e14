"""Stage ``pretrain``: a softmax model trained from scratch — a Marian for translation, a Llama decoder
(lm) or a RoBERTa encoder (mlm) for the block corpora — or fine-tuned from a named checkpoint."""

from __future__ import annotations

from pipeline.checkpoint import (
    describe_parent,
    load_auto_tokenizer,
    load_config,
    loading,
    resolve_outside_checkpoint,
)
from pipeline.corpus_card import TASKS, read_corpus_card
from pipeline.errors import UserError, exits_cleanly
from pipeline.models.language_model import build_language_model
from pipeline.models.marian import build_marian
from pipeline.models.pretrained import load_pretrained
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
    init = None if params.init is None else resolve_outside_checkpoint(params.init, "pretrain.init")
    data, tokenizer = load_corpus(params.data, "pretrain.data", tasks=TASKS)
    card = read_corpus_card(params.data, "pretrain.data")
    if card.task != "translation" and init is not None:
        # blocks are cut by the corpus's own tokenizer; a checkpoint's tokenizer would cut other blocks
        raise UserError(
            f"pretrain.init = {params.init!r}: a {card.task} corpus holds blocks of its own tokenizer; "
            "allowed: null (a model from scratch)"
        )
    if init is None:
        longest = longest_sequence(data) if card.task == "translation" else card.context
        if longest > params.model.max_positions:
            raise UserError(
                f"pretrain.model.max_positions = {params.model.max_positions}: {params.data} holds sequences "
                f"of up to {longest} tokens; allowed: at least {longest} (or a shorter prepare.max_length "
                "or prepare.context)"
            )
        ids = {"pad_id": tokenizer.pad_token_id, "eos_id": tokenizer.eos_token_id}
        if card.task == "translation":
            model = build_marian(params.model, len(tokenizer), **ids, seed=params.train.seed)
        else:
            model = build_language_model(
                card.task, params.model, len(tokenizer), **ids, seed=params.train.seed
            )
        parent = None
    else:
        with loading(init, "pretrain.init"):
            check_generation_fits("pretrain", params, load_config(init))
            tokenizer = load_auto_tokenizer(init)
            model = load_pretrained(init, attn_implementation="sdpa")
        table = getattr(model.config, "max_position_embeddings", params.model.max_positions)
        data = encode_with(tokenizer, data, min(params.model.max_positions, table))
        parent = describe_parent(init)
    train_and_evaluate("pretrain", params, model, tokenizer, data, parent)


if __name__ == "__main__":
    main()
