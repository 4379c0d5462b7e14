"""``sparsefinder score``: a saved mqar model scored on freshly generated examples of the task its
``mqar.json`` names, with 95 % intervals, overall and near/far."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.checkpoint import save_checkpoint
from pipeline.cli import main
from pipeline.corpus_card import MQAR_CARD
from pipeline.data.mqar import IGNORE, MqarSpec, query_gaps
from pipeline.data.mqar_card import mqar_card_text, read_mqar_card
from pipeline.data.mqar_corpus import build_mqar_corpus, mqar_tokenizer
from pipeline.errors import UserError
from pipeline.evaluation.mqar_score import fresh_examples, score_examples
from pipeline.metrics.language_model import token_loss
from tests.pipeline.data.test_mqar_corpus import Recaller
from tests.tiny import tiny_llama

SPEC = MqarSpec(vocab_size=64, input_seq_len=32, num_kv_pairs=4)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("score")
    corpus = root / "data"
    build_mqar_corpus(corpus, spec=SPEC, counts={"train": 4, "valid": 4, "test": 4}, seed=0)
    folder = root / "teacher"
    model = tiny_llama(vocab=67, attn_implementation="sdpa")
    extra = {MQAR_CARD: mqar_card_text(corpus)}
    save_checkpoint(folder, model, mqar_tokenizer(64), {"stage": "teacher"}, extra)
    return folder


def test_fresh_examples_are_the_task_of_the_card_and_never_a_split_of_it(model_folder: Path) -> None:
    examples = fresh_examples(model_folder, 8, seed=5)
    inputs, labels = np.asarray(examples["input_ids"]), np.asarray(examples["labels"])
    assert inputs.shape == (8, SPEC.input_seq_len)
    assert ((labels != IGNORE).sum(axis=1) == SPEC.num_kv_pairs).all()
    test_seed = read_mqar_card(model_folder, "model").splits["test"]["seed"]
    with pytest.raises(UserError, match="seed of the test split"):
        fresh_examples(model_folder, 8, seed=test_seed)


def test_a_perfect_recaller_scores_one_and_a_short_sighted_one_loses_the_far_half(model_folder: Path) -> None:
    examples = fresh_examples(model_folder, 12, seed=5)
    exact = score_examples(Recaller(67), examples, batch_size=4)
    assert exact["answers"] == 12 * SPEC.num_kv_pairs
    assert exact["accuracy"] == {"value": 1.0, "ci95": [1.0, 1.0]}
    near_only = score_examples(Recaller(67, reach=exact["far_gap"]), examples, batch_size=4)
    assert near_only["accuracy_near"]["value"] == 1.0 and near_only["accuracy_far"]["value"] == 0.0
    labels = np.asarray(examples["labels"])
    gaps = query_gaps(
        np.asarray(examples["input_ids"]), np.concatenate([labels[:, 1:], labels[:, :1]], axis=1)
    )
    share_near = (gaps <= exact["far_gap"]).mean()
    assert near_only["accuracy"]["value"] == pytest.approx(share_near)
    low, high = near_only["accuracy"]["ci95"]
    assert low < share_near < high


def test_the_command_prints_and_writes_what_the_models_own_measure_gives(
    model_folder, tmp_path, capsys
) -> None:
    out = tmp_path / "score.json"
    assert main(["score", str(model_folder), "--examples", "16", "--seed", "9", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["examples"] == 16 and written["answers"] == 16 * SPEC.num_kv_pairs
    model = tiny_llama(vocab=67, attn_implementation="sdpa")
    direct = token_loss(model, "mqar", fresh_examples(model_folder, 16, seed=9), batch_size=4)
    assert written["accuracy"]["value"] == pytest.approx(direct["accuracy"], abs=1e-4)
    assert "accuracy" in capsys.readouterr().out


def test_a_folder_without_a_card_or_with_a_split_seed_exits_2(model_folder, tmp_path) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["score", str(tmp_path)])
    assert stopped.value.code == 2
    seed = read_mqar_card(model_folder, "model").splits["train"]["seed"]
    with pytest.raises(SystemExit) as stopped:
        main(["score", str(model_folder), "--seed", str(seed)])
    assert stopped.value.code == 2
