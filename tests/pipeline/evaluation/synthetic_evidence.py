"""Hand-made evidence for a synthetic evaluation: what the evaluate stage's quality.json would hold.

Every row is scored on the same sentences of a made-up language. The teacher's hypotheses are the
references with every 7th word dropped; a row is, by its name in the arguments:

- ``same`` (the default): the teacher's hypotheses and sums exactly, so each difference is 0 with a
  zero-width interval (the verdict *keeps*);
- ``worse``: every 3rd word dropped as well, and 30 % more NLL per token (significantly worse);
- ``noisy``: better on half the sentences and worse on the other (even ones are the references
  themselves, odd ones the teacher's with every 5th word dropped as well), so its BLEU moves both ways
  around the teacher's and its interval holds 0 but reaches beyond ±0.5 BLEU (*not distinguishable*).
"""

from __future__ import annotations

import numpy as np

from pipeline.evaluation.evidence import gather_evidence, row_facts
from pipeline.evaluation.intervals import SystemScores
from pipeline.params.evaluate import Quality

WORDS = "el la de que y en un una los se por con para su al lo como más pero sus le ya o este sí"


def references(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS.split(), size=int(rng.integers(8, 20)))) for _ in range(count)]


def dropped(text: str, every: int) -> str:
    return " ".join(word for i, word in enumerate(text.split()) if (i + 1) % every)


def scores(kind: str, refs: list[str], seed: int) -> SystemScores:
    rng = np.random.default_rng(seed)
    teacher = [dropped(text, 7) for text in refs]
    tokens = np.array([len(text.split()) + 1 for text in refs], dtype=float)
    nll = tokens * np.log(5.0) * rng.uniform(0.8, 1.2, len(refs))
    if kind == "same":
        return SystemScores(teacher, nll=nll, tokens=tokens, kl=np.zeros(len(refs)), agree=tokens)
    if kind == "worse":
        hypotheses = [dropped(text, 3) for text in teacher]
        return SystemScores(hypotheses, nll=1.3 * nll, tokens=tokens, kl=0.2 * tokens, agree=0.7 * tokens)
    pairs = enumerate(zip(refs, teacher, strict=True))
    hypotheses = [ref if i % 2 == 0 else dropped(ours, 5) for i, (ref, ours) in pairs]
    wobble = nll * rng.uniform(0.9, 1.1, len(refs))
    return SystemScores(hypotheses, nll=wobble, tokens=tokens, kl=0.001 * tokens, agree=0.99 * tokens)


def synthetic_evidence(
    evaluation: dict,
    *,
    worse: tuple[str, ...] = (),
    noisy: tuple[str, ...] = (),
    sentences: int = 120,
    resamples: int = 200,
) -> tuple[dict, dict[str, list[str]]]:
    """(quality.json's document, the hypotheses folder's files) for ``evaluation``'s rows."""
    evaluation = {"students": [], **evaluation}  # the evaluate stage always writes the list
    refs = references(sentences)
    produced = {}
    for name in row_facts(evaluation):
        kind = "worse" if name in worse else "noisy" if name in noisy else "same"
        produced[name] = scores(kind, refs, seed=0)
    found = gather_evidence(
        evaluation, produced, refs, quality=Quality(resamples=resamples), split_units=sentences
    )
    return found.document, found.files
