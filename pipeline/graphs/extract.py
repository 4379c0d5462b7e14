"""Run a teacher on a dataset and store its queries, keys and attention graphs.

What is stored is recorded inside the registered attention function itself
(:func:`~pipeline.attention.recording.capture_attention`): the queries and keys the scores were really
computed from — after rotary embeddings in a Llama, after GPT-2's fused ``c_attn``, before the module's
``scaling`` (which goes into the manifest) — and the probabilities the function returned. With α-entmax
they are exactly sparse, so the graph is {(i, j) : p_ij > 0}, and it is reproduced exactly by the stored q
and k. Grouped keys are repeated to the query heads. Padding is stripped per sentence before storing.

A teacher whose attention scores are not finite (NaN or infinite weights) stops extraction at its first
batch with one line naming the checkpoint, the layer and the kind (checked inside the entmax attention
function, :func:`~pipeline.attention.entmax.require_finite_scores`), and no store is written.

The model's layout (:func:`~pipeline.attention.recording.model_layout`) decides its kinds and the dataset
column each side is read from (:data:`SIDE_COLUMNS`): an encoder–decoder reads ``input_ids`` (source) and
``labels`` (target), whose decoder sees shift_tokens_right(labels); a decoder-only model reads
``input_ids`` as its target side, an encoder-only model as its source side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.marian.modeling_marian import shift_tokens_right

from pipeline.atomic import current_path
from pipeline.attention.entmax import label_attention_modules
from pipeline.attention.interface import module_head_dim, module_heads, module_scaling
from pipeline.attention.recording import Captured, Layout, attention_layers, capture_attention, model_layout
from pipeline.attention_kinds import AttentionKind, attention_kind
from pipeline.errors import UserError
from pipeline.fingerprint import cached_file_sha256
from pipeline.graphs.store import AttentionGraph, GraphStore, GraphStoreWriter

# per layout, the dataset column each side of a row is read from
SIDE_COLUMNS: dict[Layout, dict[str, str]] = {
    "encoder_decoder": {"source": "input_ids", "target": "labels"},
    "decoder_only": {"target": "input_ids"},
    "encoder_only": {"source": "input_ids"},
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


def kind_shapes(
    model: PreTrainedModel, kinds: Sequence[AttentionKind]
) -> dict[str, tuple[int, int, int, float]]:
    """(layers, heads, head_dim, scaling) of every kind's attention modules; a store needs them all equal."""
    shapes = {}
    for kind in kinds:
        modules = attention_layers(model, kind)
        first = modules[0]
        shapes[kind.name] = (len(modules), module_heads(first), module_head_dim(first), module_scaling(first))
    return shapes


def query_lengths(dataset: Any, kinds: Sequence[AttentionKind], layout: Layout) -> np.ndarray:
    """(rows,) int64: each row's fewest queries over ``kinds``, the length ``min_length`` is compared with."""
    columns = SIDE_COLUMNS[layout]
    sides = sorted({k.query_side for k in kinds})
    return np.minimum.reduce([np.array([len(ids) for ids in dataset[columns[s]]], np.int64) for s in sides])


def select_rows(
    dataset: Any,
    kinds: Sequence[AttentionKind],
    *,
    layout: Layout,
    min_length: int,
    max_sentences: int | None,
    seed: int | None,
) -> list[int]:
    """Rows whose every requested kind has at least ``min_length`` queries, ascending.

    At most ``max_sentences`` of them: a seeded uniform sample when ``seed`` is given (so a corpus stored
    in reading order is not cut to its first chapters), else the first ones.
    """
    rows = np.flatnonzero(query_lengths(dataset, kinds, layout) >= min_length)
    if max_sentences is not None and len(rows) > max_sentences:
        if seed is None:
            rows = rows[:max_sentences]
        else:
            rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_sentences, replace=False))
    return rows.tolist()


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

    ``dataset`` has the unpadded columns of the model's layout (:data:`SIDE_COLUMNS`) and supports
    ``dataset[column]`` and ``dataset[row]`` (a ``datasets.Dataset``). An encoder–decoder's decoder reads
    shift_tokens_right(labels), so decoder position i is the prefix ending with label i − 1; its tokens are
    what the store shows on the target side. ``fingerprint`` identifies the teacher
    (:func:`teacher_fingerprint`); ``split`` names the corpus split ``dataset`` is, for the manifest.
    See :func:`select_rows` for ``min_length``, ``max_sentences``, ``seed``; ``desc`` labels the progress bar.
    """
    specs = [attention_kind(k) for k in kinds]
    layout = model_layout(model)
    per_kind = {k.name: attention_layers(model, k) for k in specs}
    shapes = set(kind_shapes(model, specs).values())
    if len(shapes) != 1:
        raise ValueError(
            f"kinds {list(kinds)} differ in (layers, heads, head_dim, scaling): {sorted(shapes)}"
        )
    layers, heads, head_dim, scaling = shapes.pop()
    modules = {(name, i): m for name, ms in per_kind.items() for i, m in enumerate(ms)}
    label_attention_modules(model)  # so a non-finite score names its layer, however the model was built

    rows = select_rows(
        dataset, specs, layout=layout, min_length=min_length, max_sentences=max_sentences, seed=seed
    )
    if not rows:
        raise ValueError(f"no dataset row has every requested kind at least {min_length} tokens long")

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
    columns = SIDE_COLUMNS[layout]
    # padding is masked, so its id only matters to models that have one (GPT-2 has none)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model, modules) as captured, writer, torch.inference_mode():
            progress = tqdm(total=len(rows), unit="sentence", desc=desc)
            for begin in range(0, len(rows), batch_size):
                batch_rows = rows[begin : begin + batch_size]
                examples = [dataset[row] for row in batch_rows]
                sides = {
                    side: _pad([list(e[column]) for e in examples], pad_id)
                    for side, column in columns.items()
                }
                try:
                    shown = _forward(model, layout, sides)
                except UserError as err:  # raised inside the teacher, e.g. scores that are not finite
                    raise UserError(f"teacher {fingerprint.get('checkpoint')}: {err}") from None
                batch_graphs = {k.name: _batch_graph(k, layers, captured) for k in specs}
                for b, row in enumerate(batch_rows):
                    lengths = {side: int(mask[b].sum()) for side, (_, mask) in sides.items()}
                    tokens = {
                        side: tokenizer.convert_ids_to_tokens(ids[b, : lengths[side]].tolist())
                        for side, ids in shown.items()
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
    return GraphStore(current_path(out_folder)).manifest  # read back where it was written


def _forward(
    model: PreTrainedModel, layout: Layout, sides: Mapping[str, tuple[Tensor, Tensor]]
) -> dict[str, Tensor]:
    """Run ``model`` on one batch of padded (ids, mask) per side; returns the ids each side's positions
    read, (B, T) per side."""
    device = next(model.parameters()).device
    if layout != "encoder_decoder":
        ((side, (ids, mask)),) = sides.items()
        model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
        return {side: ids}
    (source, source_mask), (labels, target_mask) = sides["source"], sides["target"]
    config = model.config
    decoder_input = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
    model(
        input_ids=source.to(device),
        attention_mask=source_mask.to(device),
        decoder_input_ids=decoder_input.to(device),
        decoder_attention_mask=target_mask.to(device),
        use_cache=False,
    )
    return {"source": source, "target": decoder_input}


def _batch_graph(kind: AttentionKind, layers: int, captured: Captured) -> AttentionGraph:
    """One kind's batch as float32 numpy arrays, padding included, copied off the device in one go.

    Shapes: q (B, L, H, n, d), k (B, L, H, m, d), probs (B, L, H, n, m).
    """
    missing = [layer for layer in range(layers) if (kind.name, layer) not in captured]
    if missing:
        raise RuntimeError(f"the teacher's {kind.name} attention of layers {missing} never ran")

    def stack(part: int) -> np.ndarray:
        tensors = [captured[kind.name, layer][part] for layer in range(layers)]
        return torch.stack(tensors, dim=1).float().cpu().numpy()

    return AttentionGraph(q=stack(0), k=stack(1), probs=stack(2))


def _sentence(batch: AttentionGraph, b: int, n: int, m: int) -> AttentionGraph:
    """Sentence ``b`` of a batch, padding stripped: q (L, H, n, d), k (L, H, m, d), probs (L, H, n, m)."""
    return AttentionGraph(batch.q[b, :, :, :n], batch.k[b, :, :, :m], batch.probs[b, :, :, :n, :m])
