"""Corpus preparation: sources (SWORD Bible modules, aligned text files, Hugging Face datasets), OSIS
cleaning, hash-based splits, a joint BPE tokenizer, length filtering, the corpus builders, and the MQAR
task's generator. Import the module you need: importing the package loads none of them."""
