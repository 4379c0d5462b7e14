"""Stage ``prepare``: corpus → cleaned, aligned, split DatasetDict + joint BPE tokenizer."""

from __future__ import annotations

from pipeline.atomic import write_json
from pipeline.data import build_corpus
from pipeline.errors import exits_cleanly
from pipeline.params import Prepare
from pipeline.stage import stage_params


def source_options(params: Prepare) -> dict:
    """Keyword arguments of the chosen source's reader."""
    if params.source == "sword":
        sword = params.sword
        return {
            "sword_path": sword.path,
            "source_module": sword.source_module,
            "target_module": sword.target_module,
        }
    return getattr(params, params.source).model_dump()


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("prepare", argv)
    stats = build_corpus(
        params.out,
        source=params.source,
        source_options=source_options(params),
        src_lang=params.src_lang,
        tgt_lang=params.tgt_lang,
        valid_fraction=params.valid_fraction,
        test_fraction=params.test_fraction,
        split_seed=params.split_seed,
        vocab_size=params.vocab_size,
        min_length=params.min_length,
        max_length=params.max_length,
        max_length_ratio=params.max_length_ratio,
        max_examples=params.max_examples,
    )
    write_json(params.metrics, stats)


if __name__ == "__main__":
    main()
