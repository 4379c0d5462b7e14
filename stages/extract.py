"""Stage ``extract``: run the teacher and store its queries, keys and gold attention graphs.

One run writes every store of ``extract.stores`` (a training store to fit predictors on, a held-out one to
score them on), each from its own corpus split. The stores and the metrics are swapped in together once
all are written, so a failure on the last (a full disk) leaves every earlier output as it was.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from pipeline.atomic import current_path, staged_outputs
from pipeline.attention import load_model, model_skeleton
from pipeline.attention.recording import Layout, model_layout
from pipeline.checkpoint import load_auto_tokenizer, loading, resolve_checkpoint
from pipeline.corpus_card import TASKS, read_corpus_card
from pipeline.errors import UserError, exits_cleanly
from pipeline.graphs import GraphStore, attention_kind
from pipeline.graphs.extract import extract_graphs, kind_shapes, query_lengths, teacher_fingerprint
from pipeline.graphs.summary import summarize
from pipeline.params import Extract
from pipeline.stage import stage_params
from pipeline.timings import timings_path, write_metrics
from pipeline.training.run import data_for_model, load_corpus


def check_kinds(params: Extract, model: PreTrainedModel) -> None:
    """Raise :class:`UserError` unless the teacher has every kind asked for, all of one shape (layers,
    heads and head size)."""
    try:
        shapes = kind_shapes(model, [attention_kind(k) for k in params.kinds])
    except ValueError as err:
        raise UserError(f"extract.kinds = {params.kinds}: {err}") from None
    if len(set(shapes.values())) > 1:
        described = ", ".join(f"{k} {s[0]} layers × {s[1]} heads × {s[2]} dims" for k, s in shapes.items())
        raise UserError(
            f"extract.kinds = {params.kinds}: the teacher's kinds differ in shape ({described}); "
            "allowed: kinds of one shape"
        )


def check_lengths(params: Extract, name: str, dataset: Any, layout: Layout) -> None:
    """Raise :class:`UserError` unless some sentence of store ``name``'s split is ``min_length`` long."""
    store = params.stores[name]
    key = f"extract.stores.{name}"
    if len(dataset) == 0:
        raise UserError(f"{key}.split = {store.split!r}: that split of {params.data} is empty")
    kinds = [attention_kind(k) for k in params.kinds]
    lengths = query_lengths(dataset, kinds, layout)
    if lengths.max() < store.min_length:
        sides = " and ".join(sorted({k.query_side for k in kinds}))
        raise UserError(
            f"{key}.min_length = {store.min_length}: no sentence of the {store.split} split has "
            f"{store.min_length} {sides} tokens; the longest has {lengths.max()}"
        )


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    """Check every store's split first, then extract the stores in order; one summary per store."""
    params = stage_params("extract", argv)
    teacher = resolve_checkpoint(params.teacher, "extract.teacher", writer="teacher")
    data, corpus_tokenizer = load_corpus(params.data, "extract.data", tasks=TASKS)
    with loading(teacher, "extract.teacher"):
        skeleton = model_skeleton(teacher)  # the checks need no weights: they come after
        tokenizer = load_auto_tokenizer(teacher)
    check_kinds(params, skeleton)
    task = read_corpus_card(params.data, "extract.data").task
    key = f"extract.teacher = {params.teacher!r}"
    data = data_for_model(data, corpus_tokenizer, tokenizer, skeleton, task=task, key=key)
    for name, store in params.stores.items():
        check_lengths(params, name, data[store.split], model_layout(skeleton))
    with loading(teacher, "extract.teacher"):
        model = load_model(teacher)
    fingerprint = teacher_fingerprint(model, teacher)
    summaries = {}
    # the stores and their metrics are swapped in together: a failure on the last store (a full disk)
    # leaves the earlier stores and the metrics describing them as they were
    outputs = [store.out for store in params.stores.values()]
    with staged_outputs(*outputs, params.metrics, timings_path(params.metrics)):
        for name, store in params.stores.items():
            started = time.perf_counter()
            extract_graphs(
                model,
                tokenizer,
                data[store.split],
                store.out,
                fingerprint=fingerprint,
                split=store.split,
                kinds=params.kinds,
                min_length=store.min_length,
                max_sentences=store.max_sentences,
                batch_size=params.batch_size,
                seed=params.seed,
                dtype=params.dtype,
                shard_sentences=params.shard_sentences,
                desc=f"extract {name}",
            )
            seconds = time.perf_counter() - started
            # read back where the new store waits to be swapped in, reported under its own name
            summary = summarize(GraphStore(current_path(store.out))) | {"folder": str(Path(store.out))}
            summary["seconds"] = round(seconds, 1)
            summary["sentences_per_second"] = round(summary["sentences"] / seconds, 1)
            summaries[name] = summary
        write_metrics(params.metrics, summaries)


if __name__ == "__main__":
    main()
