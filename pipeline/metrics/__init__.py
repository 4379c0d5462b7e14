"""Quality metrics: BLEU, perplexity."""
