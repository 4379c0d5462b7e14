"""The ``prepare`` stage's corpus from its params section: aligned sentence pairs (translation) or
fixed-length blocks of long documents (lm, mlm), built by :func:`~pipeline.data.corpus.build_corpus` or
:func:`~pipeline.data.lm_corpus.build_lm_corpus` from the source the section names, or generated recall
examples (mqar, :func:`~pipeline.data.mqar_corpus.build_mqar_corpus`)."""

from __future__ import annotations

from typing import Any

from pipeline.data.corpus import build_corpus
from pipeline.data.lm_corpus import build_lm_corpus
from pipeline.data.mqar import MqarSpec
from pipeline.data.mqar_corpus import build_mqar_corpus
from pipeline.params.prepare import Prepare


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


def prepare_corpus(params: Prepare) -> dict[str, Any]:
    """Build the corpus of ``params.task`` into ``params.out``; returns its statistics."""
    if params.task == "mqar":
        mqar = params.mqar
        spec = MqarSpec(
            vocab_size=mqar.vocab_size,
            input_seq_len=mqar.input_seq_len,
            num_kv_pairs=mqar.num_kv_pairs,
            power_a=mqar.power_a,
            random_non_queries=mqar.random_non_queries,
        )
        mixture = [(p.input_seq_len, p.num_kv_pairs, p.examples) for p in mqar.train_mixture or ()]
        return build_mqar_corpus(
            params.out, spec=spec, counts=mqar.counts(), seed=params.split_seed, mixture=mixture or None
        )
    shared = {
        "source": params.source,
        "source_options": source_options(params),
        "valid_fraction": params.valid_fraction,
        "test_fraction": params.test_fraction,
        "split_seed": params.split_seed,
        "vocab_size": params.vocab_size,
        "max_examples": params.max_examples,
    }
    if params.task == "translation":
        return build_corpus(
            params.out,
            held_out_unseen=params.held_out_unseen,
            src_lang=params.src_lang,
            tgt_lang=params.tgt_lang,
            min_length=params.min_length,
            max_length=params.max_length,
            max_length_ratio=params.max_length_ratio,
            **shared,
        )
    return build_lm_corpus(params.out, task=params.task, context=params.context, **shared)
