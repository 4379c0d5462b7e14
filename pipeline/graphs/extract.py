"""Run an encoder–decoder teacher with teacher forcing and store its queries, keys and attention graphs.

Queries and keys are captured by forward hooks on every attention module's ``q_proj`` / ``k_proj``, so they
are exactly what the attention function received: after the projection, before the module's ``scaling``
(which goes into the manifest). The gold graphs are the probabilities the attention implementation returns
with ``output_attentions=True``; with α-entmax they are exactly sparse, so the graph is {(i, j) : p_ij > 0}.
Padding is stripped per sentence before storing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.marian.modeling_marian import shift_tokens_right

from pipeline.fingerprint import cached_file_sha256
from pipeline.graphs.kinds import AttentionKind, attention_kind
from pipeline.graphs.store import AttentionGraph, GraphStore, GraphStoreWriter

# attention implementations whose attention function returns the probabilities it used
_NO_PROBABILITIES = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# model output field holding each kind's per-layer (batch, heads, n, m) probabilities
_OUTPUT_FIELD = {
    "decoder_self": "decoder_attentions",
    "encoder_self": "encoder_attentions",
    "cross": "cross_attentions",
}


def teacher_fingerprint(model: PreTrainedModel, checkpoint: str | os.PathLike) -> dict[str, Any]:
    """What identifies the teacher: checkpoint path, sha256 of its model.safetensors, attention settings."""
    weights = Path(checkpoint) / "model.safetensors"
    config = model.config
    return {
        "checkpoint": str(checkpoint),
        "model_sha256": cached_file_sha256(weights) if weights.is_file() else None,
        "attn_implementation": config._attn_implementation,
        "entmax_alpha": getattr(config, "entmax_alpha", None),
        "entmax_learn_alpha": bool(getattr(config, "entmax_learn_alpha", False)),
    }


def attention_layers(model: PreTrainedModel, kind: AttentionKind) -> list[nn.Module]:
    """The attention module of every layer for ``kind`` (Marian/BART layout: ``layers[i].self_attn`` ...)."""
    if kind.name == "encoder_self":
        return [layer.self_attn for layer in model.get_encoder().layers]
    if kind.name == "decoder_self":
        return [layer.self_attn for layer in model.get_decoder().layers]
    return [layer.encoder_attn for layer in model.get_decoder().layers]


def kind_shapes(
    model: PreTrainedModel, kinds: Sequence[AttentionKind]
) -> dict[str, tuple[int, int, int, float]]:
    """(layers, heads, head_dim, scaling) of every kind's attention modules; a store needs them all equal."""
    shapes = {}
    for kind in kinds:
        modules = attention_layers(model, kind)
        first = modules[0]
        shapes[kind.name] = (len(modules), first.num_heads, first.head_dim, float(first.scaling))
    return shapes


def query_lengths(dataset: Any, kinds: Sequence[AttentionKind]) -> np.ndarray:
    """(rows,) int64: each row's fewest queries over ``kinds``, the length ``min_length`` is compared with."""
    columns = {"source": "input_ids", "target": "labels"}
    sides = sorted({k.query_side for k in kinds})
    return np.minimum.reduce([np.array([len(ids) for ids in dataset[columns[s]]], np.int64) for s in sides])


def select_rows(
    dataset: Any,
    kinds: Sequence[AttentionKind],
    *,
    min_length: int,
    max_sentences: int | None,
    seed: int | None,
) -> list[int]:
    """Rows whose every requested kind has at least ``min_length`` queries, ascending.

    At most ``max_sentences`` of them: a seeded uniform sample when ``seed`` is given (so a corpus stored
    in reading order is not cut to its first chapters), else the first ones.
    """
    rows = np.flatnonzero(query_lengths(dataset, kinds) >= min_length)
    if max_sentences is not None and len(rows) > max_sentences:
        if seed is None:
            rows = rows[:max_sentences]
        else:
            rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_sentences, replace=False))
    return rows.tolist()


@contextmanager
def capture_projections(
    modules: Mapping[tuple[str, int], nn.Module],
) -> Iterator[dict[tuple[str, int, str], torch.Tensor]]:
    """Record the q_proj/k_proj outputs of attention modules keyed (kind, layer) while the block runs.

    Yields a dict filled on every forward: (kind, layer, "q" | "k") → (batch, heads, length, head_dim).
    """
    captured: dict[tuple[str, int, str], torch.Tensor] = {}

    def hook(key: tuple[str, int, str], heads: int):
        def record(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            b, t, _ = output.shape
            captured[key] = output.detach().view(b, t, heads, -1).transpose(1, 2)

        return record

    handles = []
    for (kind, layer), module in modules.items():
        for name in ("q", "k"):
            projection = getattr(module, f"{name}_proj")
            handles.append(projection.register_forward_hook(hook((kind, layer, name), module.num_heads)))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids and their (B, T) bool mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    mask = torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return ids, mask


def extract_graphs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Any,
    out_folder: str | os.PathLike,
    *,
    fingerprint: Mapping[str, Any],
    split: str,
    kinds: Sequence[str] = ("decoder_self",),
    min_length: int = 1,
    max_sentences: int | None = None,
    batch_size: int = 16,
    seed: int | None = 0,
    dtype: str = "float16",
    shard_sentences: int = 512,
    desc: str = "extract",
) -> dict[str, Any]:
    """Write the graph store of ``model`` over ``dataset`` to ``out_folder``; returns its manifest.

    ``dataset`` has unpadded ``input_ids`` (source) and ``labels`` (target) columns and supports
    ``dataset[column]`` and ``dataset[row]`` (a ``datasets.Dataset``). The decoder reads
    shift_tokens_right(labels), so decoder position i is the prefix ending with label i − 1; its tokens are
    what the store shows on the target side. ``fingerprint`` identifies the teacher
    (:func:`teacher_fingerprint`); ``split`` names the corpus split ``dataset`` is, for the manifest.
    See :func:`select_rows` for ``min_length``, ``max_sentences``, ``seed``; ``desc`` labels the progress bar.
    """
    specs = [attention_kind(k) for k in kinds]
    config = model.config
    if config._attn_implementation in _NO_PROBABILITIES:
        raise ValueError(
            f"attention implementation {config._attn_implementation!r} returns no attention probabilities; "
            "load the teacher with attn_implementation='entmax' (or 'eager')"
        )
    per_kind = {k.name: attention_layers(model, k) for k in specs}
    shapes = set(kind_shapes(model, specs).values())
    if len(shapes) != 1:
        raise ValueError(
            f"kinds {list(kinds)} differ in (layers, heads, head_dim, scaling): {sorted(shapes)}"
        )
    layers, heads, head_dim, scaling = shapes.pop()
    modules = {(name, i): m for name, ms in per_kind.items() for i, m in enumerate(ms)}

    rows = select_rows(dataset, specs, min_length=min_length, max_sentences=max_sentences, seed=seed)
    if not rows:
        raise ValueError(f"no dataset row has every requested kind at least {min_length} tokens long")

    device = next(model.parameters()).device
    pad_id, start_id = config.pad_token_id, config.decoder_start_token_id
    writer = GraphStoreWriter(
        out_folder,
        teacher_fingerprint=fingerprint,
        split=split,
        attention_kinds=[k.name for k in specs],
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        scaling=scaling,
        dtype=dtype,
        shard_sentences=shard_sentences,
    )
    was_training = model.training
    model.eval()
    try:
        with writer, capture_projections(modules) as captured, torch.inference_mode():
            progress = tqdm(total=len(rows), unit="sentence", desc=desc)
            for begin in range(0, len(rows), batch_size):
                batch_rows = rows[begin : begin + batch_size]
                examples = [dataset[row] for row in batch_rows]
                source, source_mask = _pad([list(e["input_ids"]) for e in examples], pad_id)
                labels, target_mask = _pad([list(e["labels"]) for e in examples], pad_id)
                decoder_input = shift_tokens_right(labels, pad_id, start_id)
                outputs = model(
                    input_ids=source.to(device),
                    attention_mask=source_mask.to(device),
                    decoder_input_ids=decoder_input.to(device),
                    decoder_attention_mask=target_mask.to(device),
                    output_attentions=True,
                    use_cache=False,
                )
                batch_graphs = {k.name: _batch_graph(k, layers, captured, outputs) for k in specs}
                for b, row in enumerate(batch_rows):
                    lengths = {"source": int(source_mask[b].sum()), "target": int(target_mask[b].sum())}
                    tokens = {
                        "source": tokenizer.convert_ids_to_tokens(source[b, : lengths["source"]].tolist()),
                        "target": tokenizer.convert_ids_to_tokens(
                            decoder_input[b, : lengths["target"]].tolist()
                        ),
                    }
                    graphs = {
                        k.name: _sentence(batch_graphs[k.name], b, lengths[k.query_side], lengths[k.key_side])
                        for k in specs
                    }
                    writer.add(row, tokens, graphs)
                progress.update(len(batch_rows))
            progress.close()
    finally:
        model.train(was_training)
    return GraphStore(out_folder).manifest


def _batch_graph(
    kind: AttentionKind,
    layers: int,
    captured: Mapping[tuple[str, int, str], torch.Tensor],
    outputs: Any,
) -> AttentionGraph:
    """One kind's batch as float32 numpy arrays, padding included, copied off the device in one go.

    Shapes: q (B, L, H, n, d), k (B, L, H, m, d), probs (B, L, H, n, m).
    """
    probabilities = getattr(outputs, _OUTPUT_FIELD[kind.name])
    if probabilities is None or any(p is None for p in probabilities):
        raise RuntimeError(f"the teacher returned no {kind.name} attention probabilities")

    def stack(tensors: Sequence[torch.Tensor]) -> np.ndarray:
        return torch.stack(list(tensors), dim=1).float().cpu().numpy()

    return AttentionGraph(
        q=stack([captured[kind.name, i, "q"] for i in range(layers)]),
        k=stack([captured[kind.name, i, "k"] for i in range(layers)]),
        probs=stack(probabilities),
    )


def _sentence(batch: AttentionGraph, b: int, n: int, m: int) -> AttentionGraph:
    """Sentence ``b`` of a batch, padding stripped: q (L, H, n, d), k (L, H, m, d), probs (L, H, n, m)."""
    return AttentionGraph(batch.q[b, :, :, :n], batch.k[b, :, :, :m], batch.probs[b, :, :, :n, :m])
