"""Stage ``prepare``: corpus → cleaned, split DatasetDict + BPE tokenizer: aligned sentence pairs
(translation) or fixed-length blocks of long documents (lm, mlm)."""

from __future__ import annotations

from pipeline.atomic import staged_outputs, write_json
from pipeline.data import build_corpus
from pipeline.data.lm_corpus import build_lm_corpus
from pipeline.errors import exits_cleanly
from pipeline.params import Prepare
from pipeline.stage import stage_params


def source_options(params: Prepare) -> dict:
    """Keyword arguments of the chosen source's reader."""
    if params.source == "sword":
        sword = params.sword
        if params.task != "translation":
            return {"sword_path": sword.path, "modules": sword.modules, "books": sword.books}
        return {
            "sword_path": sword.path,
            "source_module": sword.source_module,
            "target_module": sword.target_module,
        }
    if params.task != "translation":
        hf = params.hf
        return {"name": hf.name, "config": hf.config, "text_column": hf.text_column, "lines": hf.lines}
    options = getattr(params, params.source).model_dump()
    if params.source == "hf":
        for key in ("text_column", "lines"):
            options.pop(key)
    return options


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("prepare", argv)
    shared = {
        "source": params.source,
        "source_options": source_options(params),
        "valid_fraction": params.valid_fraction,
        "test_fraction": params.test_fraction,
        "split_seed": params.split_seed,
        "vocab_size": params.vocab_size,
        "max_examples": params.max_examples,
    }
    # the corpus and its statistics are swapped in together
    with staged_outputs(params.out, params.metrics):
        stats = build(params, shared)
        write_json(params.metrics, stats)


def build(params: Prepare, shared: dict) -> dict:
    """Build the corpus of ``params.task`` into ``params.out``; returns its statistics."""
    if params.task == "translation":
        return build_corpus(
            params.out,
            src_lang=params.src_lang,
            tgt_lang=params.tgt_lang,
            min_length=params.min_length,
            max_length=params.max_length,
            max_length_ratio=params.max_length_ratio,
            **shared,
        )
    return build_lm_corpus(params.out, task=params.task, context=params.context, **shared)


if __name__ == "__main__":
    main()
