"""Corpus preparation: sources (SWORD Bible modules, aligned text files, Hugging Face datasets), OSIS
cleaning, hash-based splits, a joint BPE tokenizer, length filtering, and the corpus builder."""

from pipeline.data.corpus import build_corpus
from pipeline.data.filter import LengthFilter
from pipeline.data.hf_source import read_hf
from pipeline.data.osis import clean_osis
from pipeline.data.pair import Pair, SourceRead
from pipeline.data.split import assign_split, cap_examples, split_pairs
from pipeline.data.sword import open_module, read_sword, read_verses
from pipeline.data.text_source import read_text_pair
from pipeline.data.tokenizer import load_tokenizer, train_tokenizer

__all__ = [
    "LengthFilter",
    "Pair",
    "SourceRead",
    "assign_split",
    "build_corpus",
    "cap_examples",
    "clean_osis",
    "load_tokenizer",
    "open_module",
    "read_hf",
    "read_sword",
    "read_text_pair",
    "read_verses",
    "split_pairs",
    "train_tokenizer",
]
