"""Stage ``prepare``: corpus → cleaned, split DatasetDict + BPE tokenizer: aligned sentence pairs
(translation) or fixed-length blocks of long documents (lm, mlm)."""

from __future__ import annotations

from pipeline.atomic import staged_outputs, write_json
from pipeline.data.prepare import prepare_corpus
from pipeline.errors import exits_cleanly
from pipeline.params.prepare import Prepare
from pipeline.stage import stage_params


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("prepare", Prepare, argv)
    # the corpus and its statistics are swapped in together
    with staged_outputs(params.out, params.metrics):
        stats = prepare_corpus(params)
        write_json(params.metrics, stats)


if __name__ == "__main__":
    main()
