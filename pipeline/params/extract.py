"""The ``extract`` section: the teacher's attention graphs, one store per corpus split."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.params.base import AttentionKindName, BatchSize, Examples, Section, Seed, Tokens

# a store name is a key in dvc.yaml interpolations (${extract.stores.NAME.out}) and in the metrics JSON
STORE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExtractStore(Section):
    """One graph store: which split it reads, which of its sentences, and where it goes."""

    split: Literal["train", "valid", "test"]
    min_length: Tokens = 21
    max_sentences: Examples | None = 10000
    out: str


class Extract(Section):
    """Settings shared by every store, then the stores, extracted in order by one stage run.

    Each split feeds one store at most, so a held-out store never shares a sentence with a training one.
    """

    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    kinds: Annotated[list[AttentionKindName], Field(min_length=1)] = ["decoder_self"]
    batch_size: BatchSize = 32
    dtype: Literal["float16", "float32"] = "float16"
    shard_sentences: BatchSize = 512
    seed: Seed = 0
    stores: Annotated[dict[str, ExtractStore], Field(min_length=1)] = {
        "train": ExtractStore(split="train", out="artifacts/graphs/train"),
        "test": ExtractStore(split="test", max_sentences=1000, out="artifacts/graphs/test"),
    }
    metrics: str = "artifacts/metrics/extract.json"

    @model_validator(mode="after")
    def _unique_kinds(self) -> Extract:
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds {self.kinds} lists a kind twice")
        return self

    @model_validator(mode="after")
    def _separate_stores(self) -> Extract:
        for name in self.stores:
            if not STORE_NAME.fullmatch(name):
                raise ValueError(
                    f"store name {name!r} is not a simple identifier (allowed: letters, digits and _, "
                    "not starting with a digit)"
                )
        readers: dict[str, str] = {}
        for name, store in self.stores.items():
            if store.split in readers:
                raise ValueError(
                    f"stores {readers[store.split]!r} and {name!r} both read the {store.split} split; "
                    "allowed: one store per split, so no sentence lands in two stores"
                )
            readers[store.split] = name
        outs = {name: PurePosixPath(os.path.normpath(store.out)) for name, store in self.stores.items()}
        for (a, out_a), (b, out_b) in itertools.combinations(outs.items(), 2):
            if out_a == out_b or out_a in out_b.parents or out_b in out_a.parents:
                raise ValueError(
                    f"stores {a!r} and {b!r} write overlapping folders ({out_a} and {out_b}); "
                    "allowed: distinct folders, neither inside the other"
                )
        return self
