"""The MQAR corpus as the stages read it: generated splits with labels in the causal-LM convention, its
card and tokenizer, and the answers alone scored by the block tasks' measures."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.corpus_card import MQAR_CARD, read_corpus_card
from pipeline.data.mqar import IGNORE, MqarSpec, generate, query_gaps, split_seeds
from pipeline.data.mqar_card import mqar_card_text, read_mqar_card
from pipeline.data.mqar_corpus import build_mqar_corpus, causal_labels, mqar_tokenizer
from pipeline.errors import UserError
from pipeline.metrics.language_model import token_loss
from pipeline.metrics.teacher_forced import Scoring, median_gap, unit_sums
from pipeline.params.sections import validate_section
from pipeline.training.run import load_corpus
from pipeline.training.trainer import right_padded

SPEC = MqarSpec(vocab_size=64, input_seq_len=32, num_kv_pairs=4)
COUNTS = {"train": 20, "valid": 6, "test": 5}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("mqar") / "data"
    stats = build_mqar_corpus(folder, spec=SPEC, counts=COUNTS, seed=3)
    return folder, stats


def test_each_split_is_the_generator_of_its_own_seed_with_labels_moved_one_place(corpus) -> None:
    folder, stats = corpus
    data, _ = load_corpus(str(folder), tasks=("mqar",))
    seeds = split_seeds(3)
    for name, count in COUNTS.items():
        inputs, labels = generate(SPEC, count, seeds[name])
        assert np.array_equal(np.asarray(data[name]["input_ids"]), inputs)
        stored = np.asarray(data[name]["labels"])
        # logit t − 1 is read against labels[t]: the value follows its query position
        assert np.array_equal(stored[:, 1:], labels[:, :-1])
        assert (stored[:, 0] == IGNORE).all()
        assert stats["splits"][name] == {"examples": count, "answers": count * SPEC.num_kv_pairs}
    assert read_corpus_card(folder, "data").task == "mqar"
    assert read_corpus_card(folder, "data").context == SPEC.input_seq_len
    assert not np.array_equal(
        np.asarray(data["train"]["input_ids"][:5]), np.asarray(data["test"]["input_ids"])
    )


def test_the_corpus_is_a_function_of_spec_counts_and_seed(corpus, tmp_path) -> None:
    _, stats = corpus
    again = build_mqar_corpus(tmp_path / "again", spec=SPEC, counts=COUNTS, seed=3)
    other = build_mqar_corpus(tmp_path / "other", spec=SPEC, counts=COUNTS, seed=4)
    assert again["fingerprint"] == stats["fingerprint"] != other["fingerprint"]


def test_the_card_names_the_task_and_each_splits_seed(corpus) -> None:
    folder, _ = corpus
    card = read_mqar_card(folder, "data")
    assert card.spec == SPEC and card.token_offset == 0 and card.seed == 3
    assert card.splits["test"] == {"seed": split_seeds(3)["test"], "examples": 5}
    assert json.loads(mqar_card_text(folder))["num_kv_pairs"] == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda card: card.pop("splits"), "malformed"),
        (lambda card: card.update(token_offset=3), "token_offset 0"),
        (lambda card: card.update(power_a=0), "power_a"),
        (lambda card: card.update(colour="red"), "unknown field"),
    ],
)
def test_a_damaged_card_is_refused_in_one_line(corpus, tmp_path, change, message) -> None:
    folder, _ = corpus
    card = json.loads((folder / MQAR_CARD).read_text())
    change(card)
    (tmp_path / MQAR_CARD).write_text(json.dumps(card))
    with pytest.raises(UserError, match=message):
        read_mqar_card(tmp_path, "data")


def test_a_folder_without_a_card_is_refused(tmp_path) -> None:
    with pytest.raises(UserError, match=r"no mqar\.json"):
        read_mqar_card(tmp_path, "teacher")


def test_the_tokenizer_writes_ids_as_numbers_and_appends_its_specials() -> None:
    tokenizer = mqar_tokenizer(64)
    assert tokenizer("5 40 5")["input_ids"] == [5, 40, 5]
    assert tokenizer.decode([7, 63]) == "7 63"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (64, 65, 66)
    assert len(tokenizer) == 67


def test_a_label_on_the_last_position_cannot_move() -> None:
    labels = np.full((1, 4), IGNORE)
    labels[0, 3] = 9
    with pytest.raises(ValueError, match="last position"):
        causal_labels(labels)


class Recaller(torch.nn.Module):
    """Solves MQAR exactly (logit t: the value after the earlier occurrence of token t) or, ``late``, one
    position late (logit t answers the query at t − 1): scored right, the first is always correct and the
    second never. With a ``reach`` it sees keys at most that far back, and misses the others."""

    def __init__(self, vocab: int, *, late: bool = False, reach: int | None = None) -> None:
        super().__init__()
        self.vocab, self.late, self.reach = vocab, late, reach
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(_attn_implementation="sdpa", pad_token_id=None)
        self.device = torch.device("cpu")

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab)
        for row in range(batch):
            ids = input_ids[row].tolist()
            for t in range(2, length):
                query = t - 1 if self.late else t
                first = 0 if self.reach is None else max(0, query - self.reach)
                earlier = [j for j in range(0, query - 1, 2) if ids[j] == ids[query] and j >= first]
                if earlier:
                    logits[row, t, ids[earlier[0] + 1]] = 10.0
        return SimpleNamespace(logits=logits)


def test_only_the_answers_are_scored_and_a_perfect_recaller_scores_one(corpus) -> None:
    folder, _ = corpus
    data, _ = load_corpus(str(folder), tasks=("mqar",))
    exact = token_loss(Recaller(67), "mqar", data["valid"], batch_size=4)
    assert exact["tokens"] == COUNTS["valid"] * SPEC.num_kv_pairs
    assert exact["accuracy"] == 1.0
    assert token_loss(Recaller(67, late=True), "mqar", data["valid"], batch_size=4)["accuracy"] < 0.2


def test_teacher_forced_sums_score_each_examples_answers(corpus) -> None:
    folder, _ = corpus
    data, _ = load_corpus(str(folder), tasks=("mqar",))
    sums = unit_sums(Recaller(67), data["test"], Scoring("mqar", batch_size=2))
    assert sums["tokens"].tolist() == [SPEC.num_kv_pairs] * COUNTS["test"]
    assert sums["correct"].tolist() == [SPEC.num_kv_pairs] * COUNTS["test"]


def test_answers_are_counted_near_or_far_by_how_far_back_their_key_is(corpus) -> None:
    folder, _ = corpus
    test = load_corpus(str(folder), tasks=("mqar",))[0]["test"]
    gap = median_gap(test)
    inputs = np.asarray(test["input_ids"])
    labels = np.asarray(test["labels"])
    gaps = query_gaps(inputs, np.concatenate([labels[:, 1:], np.full((len(labels), 1), IGNORE)], axis=1))
    assert gap == int(np.median(gaps)) and 2 <= gap <= SPEC.input_seq_len
    scoring = Scoring("mqar", batch_size=2, far_gap=gap)
    # a model that reaches only `gap` back gets every near answer and no far one
    sums = unit_sums(Recaller(67, reach=gap), test, scoring)
    assert sums["tokens_far"].tolist() == (gaps > gap).sum(axis=1).tolist()
    assert np.array_equal(sums["tokens_near"] + sums["tokens_far"], sums["tokens"])
    assert np.array_equal(sums["correct_near"], sums["tokens_near"])
    assert sums["correct_far"].sum() == 0 < sums["tokens_far"].sum()
    assert np.array_equal(sums["correct"], sums["correct_near"])


def test_params_name_the_mqar_task_and_refuse_a_bad_size() -> None:
    section = validate_section("prepare", {"task": "mqar", "mqar": {"input_seq_len": 256, "num_kv_pairs": 8}})
    assert section.mqar.counts() == {"train": 20000, "valid": 256, "test": 256}
    with pytest.raises(UserError, match="num_kv_pairs"):
        validate_section("prepare", {"task": "mqar", "mqar": {"num_kv_pairs": 0}})


def test_a_training_mixture_holds_each_part_from_its_own_seed(tmp_path) -> None:
    mixture = [(16, 2, 6), (32, 4, 3)]
    build_mqar_corpus(tmp_path / "mix", spec=SPEC, counts=COUNTS, seed=3, mixture=mixture)
    data, _ = load_corpus(str(tmp_path / "mix"), tasks=("mqar",))
    card = read_mqar_card(tmp_path / "mix", "data")
    parts = card.splits["train"]["mixture"]
    assert [(p["input_seq_len"], p["num_kv_pairs"], p["examples"]) for p in parts] == mixture
    assert card.splits["train"]["examples"] == 9 and len({p["seed"] for p in parts}) == 2
    assert [len(ids) for ids in data["train"]["input_ids"]] == [16] * 6 + [32] * 3
    short = MqarSpec(vocab_size=64, input_seq_len=16, num_kv_pairs=2)
    inputs, labels = generate(short, 6, parts[0]["seed"])
    assert np.array_equal(np.asarray(data["train"]["input_ids"][:6]), inputs)
    assert np.array_equal(np.asarray(data["train"]["labels"][:6]), causal_labels(labels))
    # valid and test keep the spec's own length
    assert {len(ids) for ids in data["test"]["input_ids"]} == {SPEC.input_seq_len}


def test_a_mixture_part_longer_than_the_test_examples_is_refused() -> None:
    mqar = {
        "input_seq_len": 64,
        "num_kv_pairs": 4,
        "train_mixture": [{"input_seq_len": 128, "num_kv_pairs": 4, "examples": 8}],
    }
    with pytest.raises(UserError, match="at most 64"):
        validate_section("prepare", {"task": "mqar", "mqar": mqar})
    both = {
        **mqar,
        "train_mixture": [{"input_seq_len": 32, "num_kv_pairs": 4, "examples": 8}],
        "train_examples": 5,
    }
    with pytest.raises(UserError, match="not both"):
        validate_section("prepare", {"task": "mqar", "mqar": both})


def test_batches_of_mixed_lengths_are_padded_after_their_end_and_never_scored() -> None:
    features = [{"input_ids": [5, 6, 7], "labels": [-100, 9, -100]}, {"input_ids": [8], "labels": [-100]}]
    batch = right_padded(features, pad_id=99)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 99, 99]]
    assert batch["labels"].tolist() == [[-100, 9, -100], [-100, -100, -100]]
    assert set(batch) == {"input_ids", "labels"}
