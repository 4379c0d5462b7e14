"""The block tasks through the stages: prepare (a WikiText-format dataset) → pretrain (softmax, from scratch)
→ teacher (α-entmax) → extract → project → cluster → configure → students → evaluate → report, for a causal
LM (Llama) and a masked LM (ModernBERT)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from transformers import Seq2SeqTrainingArguments

from pipeline.attention import load_model
from pipeline.graphs import GraphStore
from pipeline.metrics.language_model import masked_positions, token_loss
from pipeline.params.training import Distillation
from pipeline.students.distill import DistillationTrainer
from pipeline.training.run import load_corpus
from stages import (
    cluster,
    configure,
    evaluate,
    extract,
    par_search,
    prepare,
    pretrain,
    project,
    report,
    student,
    teacher,
)
from tests.tiny import wikitext_folder

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = 48
KINDS = {"lm": "decoder_self", "mlm": "encoder_self"}
STUDENTS = ("sparsefinder", "ssa", "sbm", "samsa")
PAR_STUDENTS = ("par", "par-hand")  # the lm task's: PAR's papers are decoder-only LMs
PERPLEXITY_GAP = 0.2


def block_params(task: str, corpus: Path) -> dict:
    """The micro profile with a block corpus of ``task`` read from the WikiText-format folder ``corpus``."""
    params = yaml.safe_load((ROOT / "configs" / "micro.yaml").read_text())
    params["prepare"].update(
        task=task,
        source="hf",
        hf={"name": str(corpus), "text_column": "text"},
        context=CONTEXT,
        vocab_size=120,
    )
    params["pretrain"]["model"].update(max_positions=CONTEXT, encoder_layers=2)
    params["pretrain"]["train"].update(max_steps=40, eval_steps=40, save_steps=40)
    params["teacher"]["train"].update(max_steps=10)
    params["extract"]["kinds"] = [KINDS[task]]
    params["project"]["kind"] = KINDS[task]
    contexts = [CONTEXT, 2 * CONTEXT]  # rotary positions (Llama, ModernBERT) take any length
    params["evaluate"]["speed"] = {"contexts": contexts, "methods": ["kmeans", "indexer"], "repeats": 1}
    if task == "lm":  # the lm picks its speed settings by perplexity, the mlm by recall
        params["evaluate"]["speed"]["perplexity_gap"] = PERPLEXITY_GAP
    instances = params["student"]["instances"]
    for name in STUDENTS:
        if "kinds" in instances[name]:
            instances[name]["kinds"] = [KINDS[task]]
    if task == "lm":  # a decoder-only model: one decoder pattern, no cross-attention
        del instances["par-hand"]["encoder"]
        instances["par-hand"]["decoder"] = "s (f)x3"
    names = STUDENTS + (PAR_STUDENTS if task == "lm" else ())
    params["student"]["instances"] = {name: instances[name] for name in names}
    return params


@pytest.fixture(scope="module", params=["lm", "mlm"])
def trained(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    task, folder = request.param, tmp_path_factory.mktemp(request.param)
    corpus = wikitext_folder(
        folder / "wikitext",
        {
            "train": {f"Train {i}": 400 for i in range(8)},
            "validation": {"Valid": 300},
            "test": {"Test": 300},
        },
    )
    (folder / "params.yaml").write_text(yaml.safe_dump(block_params(task, corpus)))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        for stage in (prepare, pretrain, teacher, extract, project, cluster, configure):
            stage.main(["--params", "params.yaml"])
        if task == "lm":
            par_search.main(["--params", "params.yaml"])
        for name in STUDENTS + (PAR_STUDENTS if task == "lm" else ()):
            student.main([name, "--params", "params.yaml"])
        evaluate.main(["--params", "params.yaml"])
        report.main(["--params", "params.yaml"])
    return task, folder


def metrics(folder: Path, stage: str) -> dict:
    return json.loads((folder / "artifacts" / "metrics" / f"{stage}.json").read_text())


def test_perplexity_and_sparsity(trained) -> None:
    task, folder = trained
    pretrained, entmax = metrics(folder, "pretrain"), metrics(folder, "teacher")
    for measured in (pretrained, entmax):
        for split in ("valid", "test"):
            assert 1.0 < measured[split]["perplexity"] < 120  # below a uniform guess over the vocabulary
        assert ("accuracy" in measured["test"]) == (task == "mlm")
    assert "attention_sparsity" not in pretrained  # softmax: dense by construction
    sparsity = entmax["attention_sparsity"][KINDS[task]]
    assert len(sparsity) == 2 and all(0.0 <= s < 1.0 for s in sparsity) and max(sparsity) > 0.0


def test_teacher_checkpoint_describes_itself(trained) -> None:
    task, folder = trained
    model = load_model(folder / "artifacts" / "models" / "teacher")
    assert type(model).__name__ == {"lm": "LlamaForCausalLM", "mlm": "ModernBertForMaskedLM"}[task]
    assert model.config._attn_implementation == "entmax" and model.config.entmax_alpha == 1.5


def test_only_the_causal_teacher_is_blind_to_later_tokens(trained) -> None:
    """Changing the tokens from position 20 on: a causal LM's logits before 20 stay exactly as they were,
    while a bidirectional masked LM's change, since every position attends the whole block."""
    task, folder = trained
    model = load_model(folder / "artifacts" / "models" / "teacher")
    data, _ = load_corpus(str(folder / "artifacts" / "data"), tasks=(task,))
    ids = torch.tensor(data["test"]["input_ids"][:2])
    perturbed = ids.clone()
    perturbed[:, 20:] = torch.randint(
        3, model.config.vocab_size, perturbed[:, 20:].shape, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=perturbed).logits
    if task == "lm":
        torch.testing.assert_close(before[:, :20], after[:, :20], rtol=0, atol=1e-6)
    else:
        assert not torch.allclose(before[:, :20], after[:, :20], rtol=0, atol=1e-4)
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_the_loss_is_the_models_own(trained) -> None:
    """The held-out loss is the one the model's own head computes from ``labels``: for the causal LM, over
    every position but the first, each predicted by the logits one position before; for the masked LM,
    over the chosen positions only (read as ``<mask>``), each predicted by the logits at that very
    position, with no shift."""
    task, folder = trained
    model = load_model(folder / "artifacts" / "models" / "teacher")
    data, tokenizer = load_corpus(str(folder / "artifacts" / "data"), tasks=(task,))
    measured = token_loss(model, task, data["valid"], batch_size=4, mask_id=tokenizer.mask_token_id)
    ids = torch.tensor(data["valid"]["input_ids"])
    if task == "lm":
        inputs, labels = ids, ids
        assert measured["tokens"] == ids.shape[0] * (CONTEXT - 1)
    else:
        # the positions token_loss draws: the same seeded generator, batch after batch
        generator = torch.Generator().manual_seed(0)
        chosen = torch.cat([masked_positions(batch, generator) for batch in ids.split(4)])
        inputs, labels = ids.masked_fill(chosen, tokenizer.mask_token_id), ids.masked_fill(~chosen, -100)
        assert measured["tokens"] == int(chosen.sum()) < ids.numel()
    with torch.no_grad():
        own = model(input_ids=inputs, labels=labels).loss.item()
    assert measured["loss"] == pytest.approx(own, abs=1e-4)
    assert measured["perplexity"] == pytest.approx(math.exp(measured["loss"]), rel=1e-3)
    assert metrics(folder, "teacher")["valid"]["loss"] == pytest.approx(own, abs=1e-4)


def test_extraction_stores_the_task_kind(trained) -> None:
    task, folder = trained
    store = GraphStore(folder / "artifacts" / "graphs" / "test")
    assert store.manifest["attention_kinds"] == [KINDS[task]]
    assert store.causal(KINDS[task]) == (task == "lm")
    side = store.sides_of(KINDS[task])[0]
    assert set(store.lengths(side).tolist()) == {CONTEXT}


def test_evaluation_scores_predicted_graphs_by_perplexity(trained) -> None:
    task, folder = trained
    evaluation = json.loads((folder / "artifacts" / "evaluation" / "evaluate.json").read_text())
    assert evaluation["task"] == task and evaluation["kind"] == KINDS[task]
    teacher_quality, points = evaluation["quality"]["teacher"], evaluation["quality"]["points"]
    assert teacher_quality["perplexity"] == metrics(folder, "teacher")["test"]["perplexity"]
    assert "bleu" not in teacher_quality and ("accuracy" in teacher_quality) == (task == "mlm")
    *predicted, full = points
    # sparse-consistency: a window wider than any block attends everything the teacher does
    assert full["graph_recall"] == 1.0 and full["perplexity"] == teacher_quality["perplexity"]
    assert predicted and all(math.isfinite(point["perplexity"]) for point in predicted)
    if task == "lm":  # the lm reads the very blocks the store holds (mlm: with tokens masked)
        for point in predicted:
            assert point["sparsity"] == pytest.approx(point["graph_sparsity"], abs=0.05)


def test_speed_table_runs_the_models_side_by_side(trained) -> None:
    task, folder = trained
    evaluation = json.loads((folder / "artifacts" / "evaluation" / "evaluate.json").read_text())
    timings = json.loads((folder / "artifacts" / "evaluation" / "evaluate.timings.json").read_text())
    rows = evaluation["speed"]
    contexts = [CONTEXT, 2 * CONTEXT]
    assert [row["context"] for row in rows] == [n for n in contexts for _ in range(5)]
    names = [row["model"] for row in rows[:5]]
    assert names[:2] == ["softmax (sdpa)", "entmax (dense)"]
    assert names[2].startswith("kmeans(") and names[3].startswith("indexer(")
    assert names[4] == f"{names[3]} certified"
    for row in rows[2:4]:  # each predictor at its graph's measured sparsity and recall
        graph = next(r for r in evaluation["graphs"] if r["label"] == row["model"])
        assert (row["graph_sparsity"], row["graph_recall"]) == (graph["sparsity"], graph["recall"])
    # certified attention lives on the teacher's own support
    assert (rows[4]["graph_sparsity"], rows[4]["graph_recall"]) == (evaluation["gold_sparsity"], 1.0)
    assert rows[0]["graph_recall"] == 1.0
    teacher_perplexity = evaluation["quality"]["teacher"]["perplexity"]
    assert rows[0]["perplexity"] is None
    assert rows[1]["perplexity"] == rows[4]["perplexity"] == teacher_perplexity
    points, limit = evaluation["quality"]["points"], (1 + PERPLEXITY_GAP) * teacher_perplexity
    for row in rows[2:4]:
        method = row["model"].split("(")[0]
        close = [p for p in points if p["method"] == method and p["perplexity"] <= limit]
        if task == "lm" and close:  # the sparsest point within the gap, with its measured perplexity
            best = max(close, key=lambda p: (p["graph_sparsity"], p["graph_recall"]))
            assert row["chosen_by"] == "perplexity" and row["model"] == best["label"]
            assert row["perplexity"] == best["perplexity"]
        else:
            assert row["chosen_by"] == "recall"
    # the wall times live beside the metrics, which stay reproducible
    assert all("forward_seconds" not in row for row in rows)
    assert [t["model"] for t in timings["speed"]] == [row["model"] for row in rows]
    assert all(t["forward_seconds"] > 0 and t["forward_backward_seconds"] > 0 for t in timings["speed"])


def test_students_are_distilled_and_measured_like_the_teacher(trained) -> None:
    task, folder = trained
    evaluation = json.loads((folder / "artifacts" / "evaluation" / "evaluate.json").read_text())
    rows = {row["student"]: row for row in evaluation["students"]}
    assert set(rows) == set(STUDENTS + (PAR_STUDENTS if task == "lm" else ()))
    for name, row in rows.items():
        assert math.isfinite(row["perplexity"]) and "bleu" not in row
        assert ("accuracy" in row) == (task == "mlm")
        trained_metrics = metrics(folder, f"student_{name}")
        assert trained_metrics["seed-0"]["test"]["perplexity"] > 1.0
    # the sparsefinder student attends its predicted graph; its untrained twin is the configured teacher
    assert rows["sparsefinder"]["sparsity"] > 0 and "perplexity" in rows["sparsefinder"]["untrained"]
    assert rows["ssa"]["sparsity"] == 0.0  # SSA evaluates densely ...
    assert [e["samples"] for e in rows["ssa"]["ensembles"]] == [1, 2]  # ... and as self-ensembles


def test_distillation_at_weight_0_is_the_models_own_loss(trained, tmp_path) -> None:
    """At weight 0 the distillation loss is the model's own cross-entropy: a causal LM's pairs the logits
    at position t − 1 with token t, a masked LM's the logits at each masked position with the token there
    (no shift)."""
    task, folder = trained
    model = load_model(folder / "artifacts" / "models" / "teacher")
    data, tokenizer = load_corpus(str(folder / "artifacts" / "data"), tasks=(task,))
    trainer = DistillationTrainer(
        model=model,
        args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True),
        teacher=model,
        distillation=Distillation(weight=0.0, temperature=2.0),
        processing_class=tokenizer,
    )
    ids = torch.tensor(data["valid"]["input_ids"][:2])
    if task == "lm":
        inputs, labels = ids, ids
    else:
        chosen = masked_positions(ids, torch.Generator().manual_seed(0))
        inputs, labels = ids.masked_fill(chosen, tokenizer.mask_token_id), ids.masked_fill(~chosen, -100)
    with torch.no_grad():
        outputs = model(input_ids=inputs, labels=labels)
        trainer._teacher_logits = outputs.logits
        loss = trainer._loss(outputs, labels)
    assert trainer.shifted == (task == "lm")
    assert loss.item() == pytest.approx(outputs.loss.item(), rel=1e-5)


def test_report_speaks_of_the_tasks_measures(trained) -> None:
    task, folder = trained
    markdown = (folder / "artifacts" / "report.md").read_text()
    headline = metrics(folder, "report")
    assert "## Language-model quality with predicted graphs" in markdown and "BLEU" not in markdown
    assert "## Speed inside the model" in markdown and "× dense entmax" in markdown
    assert headline["teacher_perplexity"] == metrics(folder, "teacher")["test"]["perplexity"]
    assert "teacher_bleu" not in headline and ("teacher_accuracy" in headline) == (task == "mlm")
    assert set(headline["students"]) == set(STUDENTS + (PAR_STUDENTS if task == "lm" else ()))
    figures = sorted(path.name for path in (folder / "artifacts" / "plots" / "report").glob("*.png"))
    # the speed table's contexts give the figure of speed-up against n, linked from the report
    assert figures == ["recall_heatmap.png", "sparsity_perplexity.png", "sparsity_recall.png", "speedup.png"]
    assert "(plots/report/speedup.png)" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| n | model |"))
    assert header.count("× softmax SDPA") == 2  # forward, and forward + backward


def test_a_speed_method_that_is_not_evaluated_stops_evaluate_before_any_work(trained, capsys) -> None:
    _, folder = trained
    params = yaml.safe_load((folder / "params.yaml").read_text())
    params["evaluate"]["speed"]["methods"] = ["kmeans", "lsh"]
    params["evaluate"]["out"] = "artifacts/evaluation/refused.json"
    (folder / "refused.yaml").write_text(yaml.safe_dump(params))
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stopped:
        patch.chdir(folder)
        evaluate.main(["--params", "refused.yaml"])
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "evaluate: speed.methods lists 'lsh'" in line
    assert "allowed: bigbird, distance, indexer, kmeans" in line
    assert "\n" not in line and not (folder / "artifacts" / "evaluation" / "refused.json").exists()


def test_par_searches_and_distills_a_decoder_only_lm(trained) -> None:
    task, folder = trained
    if task == "mlm":  # PAR rebuilds decoder-only LMs and encoder–decoders, not an encoder-only model
        assert not (folder / "artifacts" / "par").exists()
        report_text = (folder / "artifacts" / "report.md").read_text()
        assert "| student | decoder | attention kept |" not in report_text
        return
    mixing = json.loads((folder / "artifacts" / "par" / "mixing.json").read_text())
    assert list(mixing["patterns"]) == ["decoder"] and mixing["teacher_patterns"] == {"decoder": "(sf)x2"}
    assert len(mixing["mixing_weights"]["decoder"]) == 4  # s and f positions of two teacher layers
    searched = load_model(folder / "artifacts" / "models" / "par-searched")
    assert set(searched.config.par) == {"decoder"} and "c" not in searched.config.par["decoder"]
    evaluation = json.loads((folder / "artifacts" / "evaluation" / "evaluate.json").read_text())
    rows = {row["student"]: row for row in evaluation["students"]}
    assert rows["par-hand"]["par"] == {
        "decoder": "s (f)x3",
        "attention_sublayers": 1,
        "attention_fraction": 0.5,
    }
    assert rows["par"]["par"]["decoder"] == mixing["patterns"]["decoder"]
    assert all(math.isfinite(rows[name]["perplexity"]) for name in PAR_STUDENTS)
    markdown = (folder / "artifacts" / "report.md").read_text()
    assert "| student | decoder | attention kept |" in markdown and "| s (f)x3 | 0.50 |" in markdown
