"""The joint BPE tokenizer: Marian's special-token layout, </s> appended, lossless round trip."""

from __future__ import annotations

import unicodedata

import pytest

from pipeline.data.tokenizer import EOS, PAD, UNK, load_tokenizer, train_tokenizer
from pipeline.errors import UserError


@pytest.fixture(scope="module")
def verses(sword_read):
    return [text for pair in sword_read.pairs[:3_000] for text in (pair.src, pair.tgt)]


@pytest.fixture(scope="module")
def tokenizer(verses):
    return train_tokenizer(verses[:4_000], vocab_size=600)


def test_special_tokens_follow_marian(tokenizer):
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token) == (PAD, EOS, UNK)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert len(tokenizer) == 600
    ids = tokenizer("In the beginning.")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    assert ids.count(tokenizer.eos_token_id) == 1


def test_round_trip_on_held_out_verses(tokenizer, verses):
    held_out = [text for text in verses[4_000:] if unicodedata.normalize("NFKC", text) == text]
    assert len(held_out) > 1_000
    for text in held_out:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_save_and_load(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "Y dijo Dios: Sea la luz."
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 1


def test_tiny_vocabulary_is_a_user_error():
    with pytest.raises(UserError, match="vocab_size"):
        train_tokenizer(["a b"], vocab_size=10)
