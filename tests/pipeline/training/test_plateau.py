"""The plateau guard: the unigram entropy of the training labels, and a stage refusing a model whose
validation loss is not clearly below it (one line naming both numbers, nothing written)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.training.plateau import require_learning, unigram_entropy
from tests.test_params_errors import corpus, run_stage, texts  # noqa: F401  (module fixtures: corpus, texts)

# pretrain on the tiny corpus for a few steps at a learning rate that leaves the weights as they started,
# with the guard on (the micro profile turns it off)
UNTRAINED = {
    "pretrain.train.lr": 1e-7,
    "pretrain.train.max_steps": 4,
    "pretrain.train.warmup_steps": 0,
    "pretrain.unigram_margin": 0.1,
}


def test_unigram_entropy_counts_labels_only():
    # tokens 1, 2: twice each; 3, 4: once; −100 (no label) and the pad id 0 are not labels
    rows = [[1, 2, 3, 0, 0], [-100, 1, 2, 4]]
    frequencies = [2 / 6, 2 / 6, 1 / 6, 1 / 6]
    expected = -sum(f * math.log(f) for f in frequencies)
    assert unigram_entropy(rows, vocab_size=5, pad_id=0) == pytest.approx(expected, rel=1e-12)
    assert unigram_entropy([[7, 7, 7]], vocab_size=8) == 0.0  # one token: nothing to learn beyond it
    assert unigram_entropy([[-100]], vocab_size=8) == 0.0


def test_a_loss_clearly_below_the_unigram_entropy_passes_and_one_at_it_is_refused():
    require_learning("teacher", loss=3.0, entropy=6.0, margin=0.1)
    with pytest.raises(UserError) as refused:
        require_learning("teacher", loss=5.5, entropy=6.0, margin=0.1)
    message = str(refused.value)
    assert "\n" not in message
    assert "validation loss 5.5000 is not below 5.4000" in message
    assert "unigram entropy 6.0000" in message and "teacher.train (lr, warmup_steps" in message
    with pytest.raises(UserError):
        require_learning("teacher", loss=math.nan, entropy=6.0, margin=0.0)


def test_pretrain_refuses_an_untrained_model_and_writes_nothing(
    tmp_path: Path,
    corpus: Path,  # noqa: F811
):
    changes = {"pretrain.data": str(corpus), "pretrain.out": "model", "pretrain.metrics": "pretrain.json"}
    result = run_stage("pretrain", tmp_path, {**changes, **UNTRAINED})
    # the training showed its progress; then one line of error, and nothing was written
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    line = last[last.index("error: ") :]  # after the progress bars' carriage returns
    assert line.startswith("error: pretrain: the trained model's validation loss"), line
    assert "unigram entropy" in line and "pretrain.unigram_margin" in line
    assert not (tmp_path / "model").exists() and not (tmp_path / "pretrain.json").exists()
