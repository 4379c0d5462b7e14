"""Stage ``extract``: run the teacher and store its queries, keys and gold attention graphs."""

from __future__ import annotations

import time

from transformers import AutoTokenizer

from pipeline.atomic import write_json
from pipeline.attention import load_model
from pipeline.checkpoint import resolve_checkpoint
from pipeline.errors import exits_cleanly
from pipeline.graphs import GraphStore
from pipeline.graphs.extract import extract_graphs, teacher_fingerprint
from pipeline.inspect_graphs import summarize
from pipeline.stage import stage_params
from pipeline.training.run import encode_with, load_corpus


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("extract", argv)
    teacher = resolve_checkpoint(params.teacher, "extract.teacher")
    data, _ = load_corpus(params.data)
    model = load_model(teacher)
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    data = encode_with(tokenizer, data, model.config.max_position_embeddings)
    started = time.perf_counter()
    extract_graphs(
        model,
        tokenizer,
        data[params.split],
        params.out,
        fingerprint=teacher_fingerprint(model, teacher),
        kinds=params.kinds,
        min_length=params.min_length,
        max_sentences=params.max_sentences,
        batch_size=params.batch_size,
        seed=params.seed,
        dtype=params.dtype,
        shard_sentences=params.shard_sentences,
    )
    seconds = time.perf_counter() - started
    summary = summarize(GraphStore(params.out))
    summary["seconds"] = round(seconds, 1)
    summary["sentences_per_second"] = round(summary["sentences"] / seconds, 1)
    write_json(params.metrics, summary)


if __name__ == "__main__":
    main()
