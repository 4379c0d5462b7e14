"""Decoding speed of a τ-indexer model with its keys' projections cached, against re-projecting every key.

    python -m benchmarks.indexer_cache [--contexts 1024,4096] [--new 16] [--ranks 8,16]
                                                     [--repeats 3] [--out PATH.json]

A random α = 1.5 Llama (2 layers, 8 heads, head dim 64) with τ-indexer heads of random rank-r maps, margin
0.1, decodes ``new`` tokens greedily after a prompt of each context length. A decoding step's time is the
time between the logits of consecutive tokens (which leaves the prompt's forward out), the median over the
``new`` steps of ``repeats`` runs.
Rows: the indexer with its projections cached (:func:`~pipeline.attention.interface.generation_cache`),
the same model with generate's own cache (every step re-projects all keys), the dense α-entmax teacher and
softmax SDPA, all with the same weights. Prints a table; ``--out`` also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

from pipeline.allocator import keep_freed_memory
from pipeline.atomic import write_json
from pipeline.attention import ENTMAX
from pipeline.attention.interface import generation_cache
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_predictor
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.timer import lap_seconds

LAYERS, HEADS, HEAD_DIM, MARGIN = 2, 8, 64, 0.1


def llama(attn_implementation: str, context: int) -> LlamaForCausalLM:
    """The benchmark's random α = 1.5 Llama (seeded: every implementation gets the same weights)."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=4 * HEADS * HEAD_DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=context + 64,
        initializer_range=0.1,
    )
    config.entmax_alpha = 1.5
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


def indexer_model(rank: int, context: int) -> LlamaForCausalLM:
    model = llama(SPARSEFINDER, context)
    predictor = IndexerPredictor(rank=rank, margin=MARGIN)
    generator = torch.Generator().manual_seed(rank)
    for layer in range(LAYERS):
        maps = {
            name: torch.randn(HEADS, rank, HEAD_DIM, generator=generator) / HEAD_DIM**0.5
            for name in ("q_map", "k_map")
        }
        predictor.set_layer_state(layer, maps)
    attach_predictor(model, predictor)
    return model


@torch.no_grad()
def step_seconds(model: LlamaForCausalLM, prompt: Tensor, new: int, repeats: int, cached: bool) -> float:
    """Median seconds of one decoding step after ``prompt`` (b, n) (see the module docstring)."""

    def generate(tokens: int, lap: Callable[[], None]) -> None:
        """Generate ``tokens`` tokens, calling ``lap`` as the logits of each come out."""

        def stamp(input_ids: Tensor, scores: Tensor) -> Tensor:
            lap()
            return scores

        cache = generation_cache(model) if cached else None
        options = {} if cache is None else {"cache": cache}
        model.generate(
            prompt,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([stamp]),
            **options,
        )

    generate(1, lambda: None)  # warm-up: first-call costs stay out of the timings
    # the seconds between the logits of consecutive tokens: one per step after the prompt's
    return statistics.median(lap_seconds(functools.partial(generate, new + 1), repeats=repeats))


def bench(context: int, ranks: list[int], new: int, repeats: int) -> list[dict]:
    prompt = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(context))
    runs = [(f"indexer r{rank} cached", indexer_model(rank, context), True) for rank in ranks]
    runs += [(f"indexer r{rank} re-projected", indexer_model(rank, context), False) for rank in ranks]
    runs += [("dense entmax", llama(ENTMAX, context), False), ("softmax sdpa", llama("sdpa", context), False)]
    rows = []
    for name, model, cached in runs:
        seconds = step_seconds(model, prompt, new, repeats, cached)
        rows.append(
            {"method": name, "context": context, "step_seconds": seconds, "tokens_per_second": 1 / seconds}
        )
    return rows


def table(rows: list[dict]) -> str:
    header = f"{'method':26} {'context':>7} {'ms/step':>8} {'tokens/s':>9}"
    body = (
        f"{r['method']:26} {r['context']:>7} {1000 * r['step_seconds']:>8.2f} {r['tokens_per_second']:>9.1f}"
        for r in rows
    )
    return "\n".join([header, *body])


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers ≥ 1 (argparse exits 2 with a one-line message otherwise)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--contexts", type=positive_ints, default=[1024, 4096], help="prompt lengths, e.g. 1024,4096"
    )
    parser.add_argument("--ranks", type=positive_ints, default=[8, 16], help="indexer ranks, e.g. 8,16")
    parser.add_argument("--new", type=positive_ints, default=[16], help="decoded tokens per timing")
    parser.add_argument("--repeats", type=positive_ints, default=[3], help="timings per row (median)")
    parser.add_argument("--out", help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    keep_freed_memory()
    (new,), (repeats,) = args.new, args.repeats
    rows = [row for context in args.contexts for row in bench(context, args.ranks, new, repeats)]
    print(f"CPU, {torch.get_num_threads()} threads; {LAYERS} layers, {HEADS} heads, head dim {HEAD_DIM}")
    print(table(rows))
    if args.out:
        write_json(args.out, {"threads": torch.get_num_threads(), "new_tokens": new, "rows": rows})


if __name__ == "__main__":
    main()
