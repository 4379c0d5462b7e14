"""End-to-end corpus building from each kind of source."""

from __future__ import annotations

import datasets
import pytest

from pipeline.data.corpus import build_corpus
from pipeline.data.tokenizer import load_tokenizer
from pipeline.errors import UserError

# the sword corpus of these tests: 300 verses, a small vocabulary, a tenth each for valid and test
SWORD = {
    "max_examples": 300,
    "vocab_size": 500,
    "valid_fraction": 0.1,
    "test_fraction": 0.1,
    "max_length": 96,
}


@pytest.fixture(scope="module")
def sword_corpus(tmp_path_factory, sword_installed):
    out = tmp_path_factory.mktemp("prepare") / "corpus"
    stats = build_corpus(out, source="sword", **SWORD)
    return out, stats


def test_sword_corpus_is_a_loadable_dataset_dict(sword_corpus):
    out, stats = sword_corpus
    corpus = datasets.load_from_disk(str(out))
    assert set(corpus) == {"train", "valid", "test"}
    assert corpus["train"].column_names == ["id", "src", "tgt", "input_ids", "labels"]
    dropped = stats["dropped"]
    assert sum(len(split) for split in corpus.values()) + dropped["too_long"] + dropped["seen_source"] == 300
    # no held-out source is also a training source (the Bible repeats some verses word for word)
    assert dropped["seen_source"] > 0
    assert not set(corpus["test"]["src"]) & set(corpus["train"]["src"])
    assert all(stats["splits"][name]["examples"] == len(corpus[name]) for name in corpus)
    assert len(corpus["valid"]) > 10 and len(corpus["test"]) > 10
    assert not [path for path in out.parent.iterdir() if path.name != "corpus"]


def test_sword_corpus_tokens_match_its_tokenizer(sword_corpus):
    out, stats = sword_corpus
    corpus = datasets.load_from_disk(str(out))
    tokenizer = load_tokenizer(out / "tokenizer")
    assert len(tokenizer) == stats["vocab_size"] <= 500
    row = corpus["train"][0]
    assert row["input_ids"] == tokenizer(row["src"])["input_ids"]
    assert row["labels"] == tokenizer(row["tgt"])["input_ids"]
    assert row["labels"][-1] == tokenizer.eos_token_id
    assert (
        max(stats["splits"]["train"]["src_tokens"]["max"], stats["splits"]["train"]["tgt_tokens"]["max"])
        <= 96
    )


def test_sword_corpus_stats(sword_corpus):
    _, stats = sword_corpus
    read = stats["read"]
    assert read["total"] == read["kept"] + read["dropped_missing"] + read["dropped_empty"]
    assert stats["dropped"]["cap"] == read["kept"] - 300
    assert len(stats["fingerprint"]) == 64


def test_rebuild_is_identical(sword_corpus, tmp_path):
    _, stats = sword_corpus
    again = build_corpus(tmp_path / "corpus", **SWORD)
    assert again == stats


def test_text_source_end_to_end(tmp_path):
    lines = [(f"The {index} house is red.", f"La casa {index} es roja.") for index in range(200)]
    (tmp_path / "a.en").write_text("".join(f"{en}\n" for en, _ in lines), encoding="utf-8")
    (tmp_path / "a.es").write_text("".join(f"{es}\n" for _, es in lines), encoding="utf-8")
    stats = build_corpus(
        tmp_path / "out",
        source="text",
        source_options={"source_file": tmp_path / "a.en", "target_file": tmp_path / "a.es"},
        vocab_size=100,
        max_length_ratio=3.0,
    )
    assert stats["read"]["kept"] == 200
    assert sum(split["examples"] for split in stats["splits"].values()) == 200
    assert datasets.load_from_disk(str(tmp_path / "out"))["train"][0]["id"].startswith("line-")


def test_hub_splits_are_kept(tmp_path):
    datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "translation": [
                        {"en": f"{split} sentence {i}.", "de": f"{split} Satz {i}."} for i in range(40)
                    ]
                }
            )
            for split in ("train", "validation", "test")
        }
    ).save_to_disk(tmp_path / "iwslt")
    stats = build_corpus(
        tmp_path / "out",
        source="hf",
        source_options={"name": str(tmp_path / "iwslt")},
        tgt_lang="de",
        vocab_size=100,
    )
    assert {name: split["examples"] for name, split in stats["splits"].items()} == {
        "train": 40,
        "valid": 40,
        "test": 40,
    }
    valid = datasets.load_from_disk(str(tmp_path / "out"))["valid"]
    assert valid[0]["id"] == "validation-0"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "web"}, "source = 'web' is not one of sword, text, hf"),
        ({"source": "text"}, r"needs source_options \['source_file', 'target_file'\]"),
        ({"source_options": {"path": "x"}}, r"\['path'\] are not options of source 'sword'"),
        ({"source": "hf", "source_options": {"name": "x", "src_lang": "en"}}, "not options of source 'hf'"),
        ({"test_fraction": 1.5}, "test_fraction"),
        ({"vocab_size": 5}, "vocab_size"),
        ({"max_examples": 0}, "max_examples"),
        ({"min_length": 0}, "min_length"),
    ],
)
def test_bad_arguments_fail_before_any_work(tmp_path, kwargs, match):
    with pytest.raises(UserError, match=match):
        build_corpus(tmp_path / "out", **kwargs)
    assert not list(tmp_path.iterdir())


def test_seen_sources_stay_when_asked(sword_corpus, tmp_path):
    """With held_out_unseen off, the pairs the default leaves out are back in the held-out splits."""
    _, stats = sword_corpus
    kept = build_corpus(tmp_path / "corpus", **SWORD, held_out_unseen=False)
    assert "seen_source" not in kept["dropped"]
    held_out = {
        name: kept["splits"][name]["examples"] - stats["splits"][name]["examples"]
        for name in ("valid", "test")
    }
    assert sum(held_out.values()) == stats["dropped"]["seen_source"]
