"""Stage ``pretrain``: a softmax model trained from scratch — a Marian for translation, a Llama decoder
(lm) or a ModernBERT encoder (mlm) for the block corpora — or fine-tuned from a named checkpoint."""

from __future__ import annotations

from pipeline.checkpoint import describe_parent, load_auto_tokenizer, loading
from pipeline.checks.pretrain import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.models.language_model import build_language_model
from pipeline.models.marian import build_marian
from pipeline.models.pretrained import load_pretrained
from pipeline.params.pretrain import Pretrain
from pipeline.stage import stage_params
from pipeline.training.run import encode_with, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("pretrain", Pretrain, argv)
    inputs = check_inputs(params)
    data, tokenizer, card = inputs.corpus
    init = inputs.init
    if init is None:
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
            tokenizer = load_auto_tokenizer(init)
            model = load_pretrained(init, attn_implementation="sdpa")
        table = getattr(model.config, "max_position_embeddings", params.model.max_positions)
        data = encode_with(tokenizer, data, min(params.model.max_positions, table))
        parent = describe_parent(init)
    train_and_evaluate("pretrain", params, model, tokenizer, data, parent)


if __name__ == "__main__":
    main()
