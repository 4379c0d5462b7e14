"""Scoring chosen query rows alone (an mqar example's answers): the predictor sees every query, the recall
counts only the chosen rows' gold keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.graphs import GraphStore
from pipeline.predictors.scoring import Setting, score_settings
from pipeline.predictors.window import WindowPredictor

WINDOW = 5  # |i − j| ≤ 2


def band_recall(gold: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(H,) recall of the causal band of WINDOW // 2 keys back (and the query itself) over the ``rows`` of
    gold (H, n, m); NaN for a head without gold keys there."""
    n, m = gold.shape[1:]
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    band = (j <= i) & (i - j <= WINDOW // 2)
    chosen = gold & rows[None, :, None]
    hits = (chosen & band).sum(axis=(1, 2))
    total = chosen.sum(axis=(1, 2))
    return np.where(total > 0, hits / np.maximum(total, 1), np.nan)


def test_recall_over_chosen_rows_is_the_recall_of_their_gold_keys(micro_store: Path) -> None:
    store = GraphStore(micro_store)
    indices = list(range(len(store)))
    setting = Setting(WindowPredictor(), WINDOW)
    rows = {}
    for index in indices:
        n = store.layer_arrays(index, 0, "decoder_self")[2].shape[1]
        rows[index] = np.arange(n) % 3 == 1
    [chosen] = score_settings(store, "decoder_self", 0, [setting], indices, batch_size=3, query_rows=rows)
    expected = np.stack([band_recall(store.layer_arrays(i, 0, "decoder_self")[2], rows[i]) for i in indices])
    counts = (~np.isnan(expected)).sum(axis=0)
    assert chosen.counts["recall"].tolist() == counts.tolist()
    assert np.allclose(chosen.sums["recall"].numpy(), np.nansum(expected, axis=0))

    # every row chosen: the plain score
    everything = {index: np.ones_like(mask) for index, mask in rows.items()}
    [plain] = score_settings(store, "decoder_self", 0, [setting], indices, batch_size=3)
    [full] = score_settings(store, "decoder_self", 0, [setting], indices, batch_size=3, query_rows=everything)
    assert np.allclose(plain.sums["recall"].numpy(), full.sums["recall"].numpy())
    assert not np.allclose(plain.sums["recall"].numpy(), chosen.sums["recall"].numpy())
