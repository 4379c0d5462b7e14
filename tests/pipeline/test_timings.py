"""Wall times live beside metrics, not in them: split on write, merged back for the report."""

from __future__ import annotations

import json

import torch

from pipeline.timings import merge_timings, split_timings, timings_path, write_metrics

METRICS = {
    "kind": "decoder_self",
    "train_seconds": 12.5,
    "layers": [
        {"layer": 0, "valid_loss": 0.5, "seconds": 1.0, "positive_pairs_per_second": 900},
        {"layer": 1, "valid_loss": 0.4},
    ],
    "quality": {"teacher": {"bleu": 20.0, "decode_seconds": 3.0}, "points": [{"label": "w=3", "bleu": 19.0}]},
}


def test_split_moves_every_timing_key_and_merge_puts_it_back():
    kept, timed = split_timings(METRICS)
    assert kept == {
        "kind": "decoder_self",
        "layers": [{"layer": 0, "valid_loss": 0.5}, {"layer": 1, "valid_loss": 0.4}],
        "quality": {"teacher": {"bleu": 20.0}, "points": [{"label": "w=3", "bleu": 19.0}]},
    }
    # each timing keeps the row identity beside it; rows without timings are null
    assert timed == {
        "train_seconds": 12.5,
        "layers": [{"layer": 0, "seconds": 1.0, "positive_pairs_per_second": 900}, None],
        "quality": {"teacher": {"decode_seconds": 3.0}},
    }
    assert merge_timings(kept, timed) == METRICS
    assert merge_timings(kept, None) == kept


def test_write_metrics_writes_two_files(tmp_path):
    write_metrics(tmp_path / "project.json", METRICS)
    kept = json.loads((tmp_path / "project.json").read_text())
    timed = json.loads(timings_path(tmp_path / "project.json").read_text())
    assert timings_path(tmp_path / "project.json") == tmp_path / "project.timings.json"
    assert "seconds" not in json.dumps(kept) and timed["torch_threads"] == torch.get_num_threads()
    assert merge_timings(kept, timed) == {**METRICS}  # torch_threads is not a timing of a row
    write_metrics(tmp_path / "e.json", METRICS, tmp_path / "elsewhere.json")
    assert (tmp_path / "elsewhere.json").is_file() and not (tmp_path / "e.timings.json").exists()
