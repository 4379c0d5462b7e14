"""The language-modelling corpus: documents from SWORD chapters and from a WikiText-format dataset, split by
unit, cut into full blocks, saved with its card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.corpus_card import read_corpus_card
from pipeline.data.blocks import cut_blocks
from pipeline.data.documents import Document, read_hf_documents, read_sword_chapters
from pipeline.data.lm_corpus import build_lm_corpus, split_documents
from pipeline.data.tokenizer import train_tokenizer
from pipeline.errors import UserError
from pipeline.params.sections import validate_section
from pipeline.training.run import load_corpus
from tests.tiny import wikitext_folder

SWORD = "/usr/share/sword"
MODULES = ["engWEB2015eb", "engKJV2006eb"]
needs_sword = pytest.mark.skipif(
    not all(Path(f"{SWORD}/mods.d/{m}.conf").is_file() for m in MODULES), reason="SWORD modules not installed"
)
SPLIT = {"valid_fraction": 0.2, "test_fraction": 0.2, "seed": 0}


@needs_sword
def test_chapters_of_two_translations_share_their_units() -> None:
    documents = read_sword_chapters(SWORD, MODULES, books=["Ruth", "Jonah"])
    by_module = {m: [d for d in documents if d.stream == m] for m in MODULES}
    units = [[d.unit for d in docs] for docs in by_module.values()]
    assert units[0] == units[1] == [f"Ruth.{c}" for c in range(1, 5)] + [f"Jonah.{c}" for c in range(1, 5)]
    assert by_module["engKJV2006eb"][0].text.startswith("Now it came to pass in the days when the judges")
    assert all(d.split is None and len(d.text) > 500 for d in documents)


@needs_sword
def test_a_chapter_keeps_its_split_when_books_or_translations_are_added() -> None:
    def assigned(documents: list[Document]) -> dict[tuple[str, str], str]:
        splits = split_documents(documents, **SPLIT)
        return {(d.stream, d.unit): name for name, docs in splits.items() for d in docs}

    small = assigned(read_sword_chapters(SWORD, MODULES[:1], books=["Ruth", "Jonah"]))
    large = assigned(read_sword_chapters(SWORD, MODULES, books=["Ruth", "Jonah", "Obad", "Titus"]))
    assert small.items() <= large.items()
    # one chapter, one split, in every translation: no test chapter is trained on in another translation
    for (_, unit), split in large.items():
        assert all(large[m, unit] == split for m in MODULES)
    assert {"train", "valid", "test"} == set(large.values())


def test_blocks_are_full_and_cut_in_reading_order() -> None:
    documents = [Document("a", f"a{i}", f"word {i} " * (5 + i)) for i in range(6)]
    documents += [Document("b", "b0", "other text " * 9)]
    tokenizer = train_tokenizer((d.text for d in documents), vocab_size=64)
    blocks, count = cut_blocks(documents, "test", tokenizer, context=8)
    assert {len(b.input_ids) for b in blocks} == {8}
    for stream in ("a", "b"):
        ids = [
            t
            for enc in tokenizer([d.text for d in documents if d.stream == stream])["input_ids"]
            for t in enc
        ]
        cut = [t for b in blocks if b.id.startswith(f"{stream}/") for t in b.input_ids]
        assert cut == ids[: len(ids) // 8 * 8]  # consecutive, the shorter rest dropped
    assert [b.id for b in blocks if b.id.startswith("a/")][:2] == ["a/test/0", "a/test/1"]
    assert count.tokens == 8 * len(blocks) and count.documents == 7 and 0 <= count.dropped_tokens < 16
    # every document ends with </s>, so a block shows where one ends and the next begins
    assert tokenizer.eos_token_id in blocks[0].input_ids + blocks[1].input_ids


@needs_sword
@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_sword_corpus(task: str, tmp_path: Path) -> None:
    options = {"sword_path": SWORD, "modules": MODULES, "books": ["Ruth", "Jonah", "Obad", "Titus"]}
    build = dict(task=task, source="sword", source_options=options, context=64, vocab_size=300, split_seed=0)
    stats = build_lm_corpus(tmp_path / "a", valid_fraction=0.2, test_fraction=0.2, **build)
    corpus, tokenizer = load_corpus(str(tmp_path / "a"), "data", tasks=(task,))
    assert read_corpus_card(tmp_path / "a", "data").context == 64
    for name in ("train", "valid", "test"):
        assert stats["splits"][name]["blocks"] == len(corpus[name]) > 0
        assert {len(ids) for ids in corpus[name]["input_ids"]} == {64}
    assert (tokenizer.mask_token == "<mask>") == (task == "mlm")
    assert stats["task"] == task and stats["documents"] == 2 * (4 + 4 + 1 + 3)
    again = build_lm_corpus(tmp_path / "b", valid_fraction=0.2, test_fraction=0.2, **build)
    assert again["fingerprint"] == stats["fingerprint"]  # deterministic
    capped = build_lm_corpus(tmp_path / "c", valid_fraction=0.2, test_fraction=0.2, max_examples=3, **build)
    assert capped["splits"]["train"]["blocks"] == 3
    with pytest.raises(UserError, match=rf"holds a '{task}' corpus; allowed here: translation"):
        load_corpus(str(tmp_path / "a"), "teacher.data")


def test_context_longer_than_a_split_names_the_key(tmp_path: Path, wikitext_like: Path) -> None:
    with pytest.raises(UserError, match=r"prepare.context = 300: the valid split .* holds no whole block"):
        build_lm_corpus(
            tmp_path / "c",
            task="lm",
            source="hf",
            source_options={"name": str(wikitext_like)},
            context=300,
            vocab_size=100,
        )
    assert not (tmp_path / "c").exists()


@pytest.fixture
def wikitext_like(tmp_path: Path) -> Path:
    articles = {
        "train": {"Alpha": 600, "Beta": 400},
        "validation": {"Gamma": 40},
        "test": {"Delta": 300, "Epsilon": 180},
    }
    return wikitext_folder(tmp_path / "wikitext-103-raw-v1", articles)


def test_wikitext_articles_keep_the_dataset_splits(wikitext_like: Path, tmp_path: Path) -> None:
    documents = read_hf_documents(str(wikitext_like))
    assert [(d.stream, d.unit, d.split) for d in documents] == [
        ("train", "train-0", "train"),
        ("train", "train-1", "train"),
        ("validation", "validation-0", "valid"),
        ("test", "test-0", "test"),
        ("test", "test-1", "test"),
    ]
    assert documents[1].text.startswith("= Beta = = = Section = = w")
    stats = build_lm_corpus(
        tmp_path / "lm",
        task="lm",
        source="hf",
        source_options={"name": str(wikitext_like)},
        context=32,
        vocab_size=100,
    )
    assert all(stats["splits"][name]["blocks"] > 0 for name in ("train", "valid", "test"))
    assert json.loads((tmp_path / "lm" / "corpus.json").read_text()) == {"task": "lm", "context": 32}
    rows = read_hf_documents(str(wikitext_like), lines=False)
    assert len(rows) == sum(1 for d in rows) and rows[0].text == "= Alpha ="


def test_params_refuse_a_pair_source_for_lm() -> None:
    with pytest.raises(
        UserError, match="source 'text' reads sentence pairs; allowed for task 'lm': sword, hf"
    ):
        validate_section(
            "prepare", {"task": "lm", "source": "text", "text": {"source_file": "a", "target_file": "b"}}
        )
    with pytest.raises(UserError, match=r"set hf\.text_column"):
        validate_section("prepare", {"task": "mlm", "source": "hf", "hf": {"name": "wikitext"}})
    with pytest.raises(UserError, match=r"prepare\.context = 1"):
        validate_section("prepare", {"task": "lm", "context": 1})


def test_a_corpus_without_its_card_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dataset_dict.json").write_text("{}")
    with pytest.raises(UserError, match=r"no corpus\.json there; allowed: a folder written by prepare"):
        load_corpus(str(tmp_path), "pretrain.data")
