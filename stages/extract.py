"""Stage ``extract``: run the teacher and store its queries, keys and gold attention graphs.

One run writes every store of ``extract.stores`` (a training store to fit predictors on, a held-out one to
score them on), each from its own corpus split. The stores and the metrics are swapped in together once
all are written, so a failure on the last (a full disk) leaves every earlier output as it was.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.atomic import current_path, staged_outputs
from pipeline.attention import ENTMAX, load_model
from pipeline.checkpoint import loading
from pipeline.checks.extract import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.graphs import GraphStore
from pipeline.graphs.extract import extract_graphs, teacher_fingerprint
from pipeline.graphs.summary import summarize
from pipeline.params.extract import Extract
from pipeline.stage import stage_params
from pipeline.timings import metrics_files, write_metrics


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    """Check every store's split first, then extract the stores in order; one summary per store."""
    params = stage_params("extract", Extract, argv)
    inputs = check_inputs(params)
    teacher, data, tokenizer = inputs.teacher, inputs.data, inputs.skeleton[1]
    with loading(teacher, "extract.teacher"):
        model = load_model(teacher, attn_implementation=ENTMAX)  # the α-entmax graphs, whatever it ran
    fingerprint = teacher_fingerprint(model, teacher)
    summaries = {}
    # the stores and their metrics are swapped in together: a failure on the last store (a full disk)
    # leaves the earlier stores and the metrics describing them as they were
    outputs = [store.out for store in params.stores.values()]
    with staged_outputs(*outputs, *metrics_files(params.metrics)):
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
