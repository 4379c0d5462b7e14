"""Hugging Face datasets as a corpus source, through local fixtures in the hub datasets' own layouts."""

from __future__ import annotations

import datasets
import pytest

from pipeline.data.hf_source import read_hf
from pipeline.errors import UserError

SPLIT_SIZES = {"train": 6, "validation": 2, "test": 3}


@pytest.fixture
def iwslt_like(tmp_path):
    """A DatasetDict shaped like IWSLT17 en-de: one ``translation`` column of {"en": ..., "de": ...}."""
    corpus = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "translation": [
                        {"de": f"Satz {index} aus {split}.", "en": f"Sentence {index} from  {split}."}
                        for index in range(size)
                    ]
                }
            )
            for split, size in SPLIT_SIZES.items()
        }
    )
    path = tmp_path / "iwslt2017-en-de"
    corpus.save_to_disk(path)
    return path


@pytest.fixture
def flat_parquet(tmp_path):
    """A folder of parquet files with flat text columns and an id column."""
    folder = tmp_path / "flat"
    folder.mkdir()
    for split, size in (("train", 4), ("test", 2)):
        datasets.Dataset.from_dict(
            {
                "uid": [f"{split}:{index}" for index in range(size)],
                "english": [f"one {index}" for index in range(size)],
                "spanish": [f"uno {index}" if index else "" for index in range(size)],
            }
        ).to_parquet(folder / f"{split}.parquet")
    return folder


def test_translation_dict_layout(iwslt_like):
    read = read_hf(str(iwslt_like), src_lang="en", tgt_lang="de")
    assert read.counts() == {"total": 11, "kept": 11, "dropped_missing": 0, "dropped_empty": 0}
    by_id = {pair.id: pair for pair in read.pairs}
    assert by_id["train-0"].src == "Sentence 0 from train."
    assert by_id["train-0"].tgt == "Satz 0 aus train."
    assert {pair.split for pair in read.pairs} == {"train", "valid", "test"}
    assert sum(pair.split == "valid" for pair in read.pairs) == SPLIT_SIZES["validation"]


def test_dataset_splits_can_be_ignored(iwslt_like):
    read = read_hf(str(iwslt_like), src_lang="en", tgt_lang="de", use_dataset_splits=False)
    assert {pair.split for pair in read.pairs} == {None}


def test_one_split_only(iwslt_like):
    read = read_hf(str(iwslt_like), split="test", src_lang="en", tgt_lang="de")
    assert [pair.id for pair in read.pairs] == ["test-0", "test-1", "test-2"]


def test_flat_columns_with_ids(flat_parquet):
    read = read_hf(str(flat_parquet), source_column="english", target_column="spanish", id_column="uid")
    assert read.counts() == {"total": 6, "kept": 4, "dropped_missing": 0, "dropped_empty": 2}
    assert {pair.id for pair in read.pairs} == {"train:1", "train:2", "train:3", "test:1"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"translation_column": "pairs"}, "no column 'pairs'"),
        ({"tgt_lang": "fr"}, "no language 'fr'"),
        ({"id_column": "uid"}, "no column 'uid'"),
        ({"split": "dev"}, "no split 'dev'"),
        ({"source_column": "en"}, "source_column and target_column go together"),
    ],
)
def test_layout_errors_are_user_errors(iwslt_like, kwargs, match):
    options = {"src_lang": "en", "tgt_lang": "de", **kwargs}
    with pytest.raises(UserError, match=match):
        read_hf(str(iwslt_like), **options)


def test_unloadable_dataset_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="could not load dataset"):
        read_hf(str(tmp_path / "nowhere"))
