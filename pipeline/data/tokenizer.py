"""Joint source/target BPE tokenizer, trained with ``tokenizers`` and wrapped for ``transformers``.

Layout follows Marian (the translation models this pipeline trains): ``<pad>`` is id 0 and doubles as the
decoder start token, ``</s>`` (id 1) ends every sequence and is appended by the post-processor, ``<unk>`` is
id 2. Text is NFKC-normalised; a Metaspace pre-tokenizer marks word starts with "▁" and the matching decoder
turns them back into spaces, so ``decode(encode(x)) == x`` for NFKC-normal text with single spaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pipeline.checkpoint import refuse_foreign_code
from pipeline.errors import UserError

PAD, EOS, UNK, MASK = "<pad>", "</s>", "<unk>", "<mask>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
# Below this a vocabulary is little more than the special tokens and the alphabet: a typo, not a choice.
MIN_VOCAB_SIZE = 64


def check_vocab_size(vocab_size: int) -> None:
    """Raise :class:`UserError` for a vocabulary too small to be meant."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(f"vocab_size = {vocab_size} is below the minimum {MIN_VOCAB_SIZE}")


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int, min_frequency: int = 2, mask: bool = False
) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer of at most ``vocab_size`` entries on ``texts`` (both languages together).

    Pairs of symbols seen fewer than ``min_frequency`` times are never merged. ``mask`` adds ``<mask>``
    (id 3, after the others) for masked language modelling.
    """
    specials = [*SPECIAL_TOKENS, MASK] if mask else list(SPECIAL_TOKENS)
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    extra = {"mask_token": MASK} if mask else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, **extra
    )


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by ``save_pretrained`` (``<corpus>/tokenizer``), running no code shipped with
    it (:func:`~pipeline.checkpoint.refuse_foreign_code`)."""
    refuse_foreign_code(path)
    return PreTrainedTokenizerFast.from_pretrained(os.fspath(path), trust_remote_code=False)
