"""Sentence pairs from a Hugging Face dataset: a hub id (loaded with ``datasets.load_dataset``) or a local
path (a ``save_to_disk`` folder, or a folder of parquet/json/csv files that ``load_dataset`` understands).

Two layouts are read:

- a translation column holding a dict per row keyed by language, as IWSLT17 and the OPUS sets do
  (``translation: {"en": ..., "de": ...}``);
- two flat text columns (``source_column``/``target_column``).

With ``use_dataset_splits`` the dataset's own splits are reported on each pair (train, valid, test) and the
corpus builder keeps them; otherwise every pair is placed by hashing its id.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import datasets

from pipeline.data.pair import SourceRead
from pipeline.errors import UserError

# Hub split names and the corpus split each one feeds; other names are placed by hashing the pair id.
SPLIT_NAMES = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}


def load_splits(name: str, config: str | None, split: str | None) -> dict[str, datasets.Dataset]:
    """Load ``name`` as a mapping from split name to dataset."""
    path = Path(name)
    try:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            if split is not None and isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise UserError(f"dataset {name} has no split {split!r}; it has {sorted(loaded)}")
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as err:
        # Hub unreachable, unknown id, unknown config or split: one line, no traceback.
        reason = " ".join(str(err).split())
        raise UserError(
            f"could not load dataset {name!r} (config {config!r}, split {split!r}): {reason}"
        ) from None
    if isinstance(loaded, datasets.Dataset):
        # A sliced split ("train[:1000]") still feeds the corpus split it was sliced from.
        return {(split or str(loaded.split or "train")).split("[")[0]: loaded}
    return dict(loaded)


def require_columns(name: str, dataset: datasets.Dataset, columns: Sequence[str | None]) -> None:
    for column in columns:
        if column is not None and column not in dataset.column_names:
            raise UserError(
                f"dataset {name} has no column {column!r}; its columns are {dataset.column_names}"
            )


def _text(value: object) -> str | None:
    return None if value is None else " ".join(str(value).split())


def read_hf(
    name: str,
    *,
    config: str | None = None,
    split: str | None = None,
    src_lang: str = "en",
    tgt_lang: str = "es",
    translation_column: str | None = "translation",
    source_column: str | None = None,
    target_column: str | None = None,
    id_column: str | None = None,
    use_dataset_splits: bool = True,
) -> SourceRead:
    """Read every split of ``name`` (or only ``split``) into pairs.

    With ``source_column``/``target_column`` set, those flat columns are read; otherwise
    ``translation_column`` holds ``{src_lang: ..., tgt_lang: ...}`` dicts. Ids come from ``id_column`` when
    given, else "<split>-<row index>". ``use_dataset_splits`` tags each pair with the dataset's own split.
    Raises :class:`UserError` for a missing column or language key.
    """
    flat = source_column is not None or target_column is not None
    if flat and (source_column is None or target_column is None):
        raise UserError(
            f"dataset {name}: source_column and target_column go together "
            f"(got {source_column!r}, {target_column!r})"
        )
    if not flat and translation_column is None:
        raise UserError(f"dataset {name}: set translation_column, or source_column and target_column")
    read = SourceRead()
    for split_name, dataset in load_splits(name, config, split).items():
        require_columns(name, dataset, [source_column, target_column] if flat else [translation_column])
        require_columns(name, dataset, [id_column])
        if flat:
            sources, targets = list(dataset[source_column]), list(dataset[target_column])
        else:
            rows = list(dataset[translation_column])
            for lang in (src_lang, tgt_lang):
                if rows and lang not in rows[0]:
                    raise UserError(
                        f"dataset {name} column {translation_column!r} has no language {lang!r}; "
                        f"it has {sorted(rows[0])}"
                    )
            sources = [row.get(src_lang) for row in rows]
            targets = [row.get(tgt_lang) for row in rows]
        ids = (
            list(dataset[id_column])
            if id_column
            else [f"{split_name}-{index}" for index in range(len(dataset))]
        )
        corpus_split = SPLIT_NAMES.get(split_name) if use_dataset_splits else None
        for pair_id, src, tgt in zip(ids, sources, targets, strict=True):
            read.add(str(pair_id), _text(src), _text(tgt), corpus_split)
    return read
