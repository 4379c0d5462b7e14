"""End to end on the micro profile in a temporary copy: dvc repro, invalidation, resume, DDP."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sacrebleu.metrics import BLEU

from pipeline.fingerprint import file_sha256
from pipeline.graphs import GraphStore
from pipeline.par.pattern import parse_pattern
from pipeline.training.trainer import CHECKPOINT_FILES

ROOT = Path(__file__).resolve().parents[1]
SPARSE = 0.4  # the least mean sparsity of the micro teacher's decoder self-attention
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path("/usr/share/sword/mods.d/engWEB2015eb.conf").is_file(), reason="SWORD modules not installed"
    ),
]


def project_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


# the block profiles' graph stores, predictors and grid at micro sizes, as (section path, values)
MICRO_PREDICTORS = [
    (("extract", "stores", "train"), {"max_sentences": 12}),
    (("extract", "stores", "test"), {"max_sentences": 4}),
    (("project",), {"hidden": 8, "epochs": 1}),
    (("cluster",), {"bucket_counts": [2, 4], "routing_clusters": [2], "reformer_buckets": [2]}),
    (("cluster", "indexer"), {"ranks": [2], "epochs": 1}),
    (("configure", "knobs"), {"buckets": 4}),
    (("evaluate",), {"windows": [0, 7], "global_tokens": [0]}),
    (("evaluate", "methods"), {"distance": {"threshold": [1.0]}, "quantization": {"bins": [2]}}),
]


def shrunk_profile(profile: str, changes: list[tuple[tuple[str, ...], dict]]) -> dict:
    """``configs/<profile>`` with ``changes`` applied: each (section path, values) updates that section."""
    params = yaml.safe_load((ROOT / "configs" / profile).read_text())
    for path, values in changes:
        section = params
        for key in path:
            section = section[key]
        section.update(values)
    return params


def project_copy(folder: Path, params: str) -> Path:
    """A git + DVC copy of the project in ``folder`` whose params.yaml holds ``params``."""
    for name in project_files():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, folder / name)
    (folder / "params.yaml").write_text(params)
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project with the micro profile as params.yaml."""
    return project_copy(tmp_path_factory.mktemp("project"), (ROOT / "configs" / "micro.yaml").read_text())


def run(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }
    result = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def dvc(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(project, sys.executable, "-m", "dvc", *args, check=check)


def set_params(project: Path, section: str, **values) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params[section].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def load(project: Path, name: str) -> dict:
    return json.loads((project / name).read_text())


def sentence_texts(folder: Path) -> set[tuple[tuple[str, ...], ...]]:
    """Every sentence of a graph store as its tokens on each side it stores (decoder_self: target only)."""
    store = GraphStore(folder)
    return {tuple(tuple(store.tokens(s, side)) for side in store.sides) for s in range(len(store))}


def test_dvc_repro_end_to_end(project: Path) -> None:
    dag = dvc(project, "dag").stdout
    assert all(
        f"| {stage} |" in dag
        for stage in (
            "prepare", "pretrain", "teacher", "extract", "project", "cluster", "configure",
            "student@sparsefinder", "student@ssa", "student@sbm", "student@samsa", "par_search",
            "student@par", "student@par-hand", "evaluate", "report",
        )
    )  # fmt: skip
    dvc(project, "repro")

    prepared = load(project, "artifacts/metrics/prepare.json")
    assert prepared["read"]["kept"] > 30000 and all(
        prepared["splits"][s]["examples"] > 0 for s in ("train", "valid", "test")
    )

    teacher = load(project, "artifacts/metrics/teacher.json")
    assert teacher["test"]["signature"].startswith("nrefs:1|case:mixed")
    assert math.isfinite(teacher["test"]["bleu"]) and teacher["test"]["sentences"] > 0
    assert math.isfinite(teacher["valid"]["perplexity"]) and teacher["valid"]["perplexity"] > 1.0
    sparsity = teacher["attention_sparsity"]
    assert [len(sparsity[k]) for k in ("encoder_self", "decoder_self", "cross")] == [1, 2, 2]
    # α-entmax makes the teacher really sparse where the graphs are taken (decoder self-attention): a large
    # share of valid pairs get exactly zero probability (typically 0.6–0.8; the bound leaves room because the
    # micro teacher's short CPU training is not yet bit-reproducible across machines). Other kinds are still
    # near dense.
    assert all(0.0 <= s < 1.0 for layer in sparsity.values() for s in layer), sparsity
    assert sum(sparsity["decoder_self"]) / len(sparsity["decoder_self"]) > SPARSE, sparsity

    manifest = load(project, "artifacts/models/teacher/manifest.json")
    assert manifest["attn_implementation"] == "entmax" and manifest["entmax_alpha"] == 1.5
    assert manifest["parent"]["model_sha256"] == file_sha256(
        project / "artifacts/models/pretrain/model.safetensors"
    )
    assert not (project / "artifacts/runs/teacher").exists()

    # One extract run writes the training store and the held-out test store, from disjoint splits.
    teacher_sha256 = file_sha256(project / "artifacts/models/teacher/model.safetensors")
    extract_metrics = load(project, "artifacts/metrics/extract.json")
    assert list(extract_metrics) == ["train", "test"]
    for name, most in (("train", 40), ("test", 16)):
        graphs = load(project, f"artifacts/graphs/{name}/manifest.json")
        assert graphs["split"] == name and extract_metrics[name]["split"] == name
        assert graphs["teacher"]["checkpoint"] == "artifacts/models/teacher"
        assert graphs["teacher"]["model_sha256"] == teacher_sha256
        assert 0 < graphs["counts"]["sentences"] == extract_metrics[name]["sentences"] <= most
        inspected = run(project, "sparsefinder", "inspect", f"artifacts/graphs/{name}", "--check").stdout
        assert "sha256 ok" in inspected
        extracted = extract_metrics[name]["kinds"]["decoder_self"]
        assert SPARSE < extracted["sparsity"] < 1.0 and extracted["mean_degree"] >= 1.0
    train_texts = sentence_texts(project / "artifacts/graphs/train")
    test_texts = sentence_texts(project / "artifacts/graphs/test")
    assert train_texts and test_texts and not train_texts & test_texts

    project_metrics = load(project, "artifacts/metrics/project.json")
    assert math.isfinite(project_metrics["valid_loss"])
    cluster = load(project, "artifacts/metrics/cluster.json")
    fitted = [[p["predictor"] for p in layer["predictors"]] for layer in cluster["layers"]]
    kmeans = [[name for name in names if name.startswith("kmeans(")] for names in fitted]
    assert len(kmeans) == 2 and all(len(names) == 2 and "buckets=4" in names[1] for names in kmeans), fitted
    indexers = [
        sorted(name.split("fitting=")[1][:3] for name in names if name.startswith("indexer("))
        for names in fitted
    ]
    assert indexers == [["dis", "pca"]] * 2, fitted  # the τ-indexer's PCA and distilled maps per layer
    for layer in cluster["layers"]:
        for predictor in layer["predictors"]:
            held_out = predictor["held_out"]
            assert 0.0 < held_out["recall"] <= 1.0 and 0.0 <= held_out["sparsity"] < 1.0, predictor

    # evaluate: every method of the grid scored on the held-out store; the recall-1 point is the teacher
    evaluation = load(project, "artifacts/evaluation/evaluate.json")
    assert evaluation["store"]["split"] == "test" and evaluation["kind"] == "decoder_self"
    methods = yaml.safe_load((project / "params.yaml").read_text())["evaluate"]["methods"]
    assert {row["method"] for row in evaluation["graphs"]} == set(methods)
    assert SPARSE < evaluation["gold_sparsity"] < 1.0
    for row in evaluation["graphs"]:
        assert 0.0 <= row["sparsity"] <= 1.0 and 0.0 <= row["recall"] <= 1.0, row
    # the indexer's grid names its own window list: it is crossed with window 0 alone
    assert {row["window"] for row in evaluation["graphs"] if row["method"] == "indexer"} == {0}
    teacher_quality = evaluation["quality"]["teacher"]
    points = {p["label"]: p for p in evaluation["quality"]["points"]}
    full = [p for label, p in points.items() if label.startswith("window() w=") and p["graph_recall"] == 1.0]
    assert len(full) == 1 and full[0]["graph_sparsity"] == 0.0
    assert (full[0]["bleu"], full[0]["perplexity"]) == (
        teacher_quality["bleu"],
        teacher_quality["perplexity"],
    )
    decoded = [p for p in points.values() if p is not full[0]]
    assert {p["method"] for p in decoded} <= {
        "window",
        "distance",
        "kmeans",
        "reformer",
        "indexer",
    } and decoded
    assert "indexer" in {p["method"] for p in decoded}  # a row-scope predictor runs in the decoder
    assert all(0.0 <= p["sparsity"] <= 1.0 and math.isfinite(p["perplexity"]) for p in decoded), decoded

    # evidence: every model a row on the same sentences, the files behind it line for line; the recall-1
    # window reproduces the teacher's outputs, so each of its differences is exactly 0
    evidence = load(project, "artifacts/evaluation/quality.json")
    rows = {row["name"]: row for row in evidence["rows"]}
    assert {"teacher", *points, *(row["student"] for row in evaluation["students"])} <= set(rows)
    folder = project / "artifacts/evaluation/hypotheses"
    references = (folder / evidence["references"]).read_text().splitlines()
    assert len(references) == evaluation["quality"]["sentences"] == rows["teacher"]["sentences"]
    # the files are line for line with the references: sacreBLEU on them gives the BLEU evaluate measured
    teacher_lines = (folder / rows["teacher"]["hypotheses"]).read_text().splitlines()
    assert round(BLEU().corpus_score(teacher_lines, [references]).score, 2) == teacher_quality["bleu"]
    same = rows[full[0]["label"]]
    assert (folder / same["hypotheses"]).read_text() == (folder / rows["teacher"]["hypotheses"]).read_text()
    for measure, difference in same["vs_teacher"].items():
        assert difference["ci95"] == [0.0, 0.0] and not difference["significant"], measure

    # report: the table has a row per method, the headline metrics are DVC metrics, the plots exist
    report = (project / "artifacts/report.md").read_text()
    assert all(f"| {method} |" in report for method in methods) and "| teacher" in report
    assert "## τ-indexer: rank and fitting" in report and "## Claims" in report and "## Evidence" in report
    headline = load(project, "artifacts/metrics/report.json")
    assert set(headline["methods"]) == set(methods) and headline["teacher_bleu"] == teacher_quality["bleu"]
    assert "report.json" in dvc(project, "metrics", "show").stdout
    # the Results table: one line per model, the teacher's first
    table = dvc(project, "metrics", "show", "artifacts/metrics/results").stdout.splitlines()
    assert table[1].startswith("artifacts/metrics/results/00-teacher.json")
    assert any(f"results/{len(table) - 2:02d}-student-" in line for line in table[-1:])
    for name in ("sparsity_recall.png", "sparsity_bleu.png", "sparsity_perplexity.png", "recall_heatmap.png",
                 "speed_bleu.png", "pareto_recall.csv", "quality.csv"):  # fmt: skip
        assert (project / "artifacts/plots/report" / name).stat().st_size > 0

    # students: each starts from its init folder, is distilled from the teacher, and loads back alone
    # each once per seed (student.seeds [0, 1]): a model folder and a metrics entry per seed
    names = {"sparsefinder", "ssa", "sbm", "samsa"}
    for name in names:
        assert sorted(p.name for p in (project / f"artifacts/students/{name}").iterdir()) == [
            "seed-0",
            "seed-1",
        ]
        metrics = load(project, f"artifacts/metrics/student_{name}.json")
        assert list(metrics) == ["seed-0", "seed-1"]
        for seed in (0, 1):
            manifest = load(project, f"artifacts/students/{name}/seed-{seed}/manifest.json")
            assert manifest["attn_implementation"] == name and manifest["stage"] == f"student@{name}"
            assert manifest["parent"]["teacher"]["model_sha256"] == teacher_sha256
            assert manifest["seed"] == manifest["params"]["train"]["seed"] == seed
            measured = metrics[f"seed-{seed}"]
            assert math.isfinite(measured["test"]["bleu"]) and measured["valid"]["perplexity"] > 1.0
        assert not (project / f"artifacts/runs/student-{name}").exists()
    students = {row["student"]: row for row in evaluation["students"]}
    # a student's row is the mean over its seeds, each seed's beside it; its evidence too, with the spread
    ssa = students["ssa"]
    assert list(ssa["seeds"]) == ["seed-0", "seed-1"]
    assert ssa["perplexity"] == round(
        (ssa["seeds"]["seed-0"]["perplexity"] + ssa["seeds"]["seed-1"]["perplexity"]) / 2, 4
    )
    ssa_evidence = rows["ssa"]
    assert ssa_evidence["seeds"] == ["seed-0", "seed-1"] and len(ssa_evidence["hypotheses"]) == 2
    spread = ssa_evidence["bleu"]["spread"]
    seed_bleu = [
        BLEU().corpus_score((folder / f).read_text().splitlines(), [references]).score
        for f in ssa_evidence["hypotheses"]
    ]
    assert spread["seeds"] == pytest.approx(seed_bleu, abs=1e-6)
    assert ssa_evidence["bleu"]["value"] == pytest.approx(sum(seed_bleu) / 2, abs=1e-6)
    par_students = {"par-hand": {"encoder": "sff", "decoder": "scfcff"}}
    assert set(students) == names | set(par_students) | {"par"}
    assert students["ssa"]["sparsity"] == 0.0  # SSA samples in training only
    for name in ("sparsefinder", "sbm", "samsa"):  # these decode on graphs of their own
        assert 0.0 < students[name]["sparsity"] < 1.0, name
    # every self-attention layer of SBM and SAMSA counts (1 encoder + 2 decoder); sparsefinder's decoder only
    assert len(students["sparsefinder"]["computed_fraction_per_layer"]) == 2
    assert len(students["sbm"]["computed_fraction_per_layer"]) == 3
    assert len(students["samsa"]["computed_fraction_per_layer"]) == 3
    assert [e["samples"] for e in students["ssa"]["ensembles"]] == [1, 2]
    assert all(math.isfinite(e["perplexity"]) for e in students["ssa"]["ensembles"])
    assert "## Students" in report and set(headline["students"]) == set(students)

    # PAR: the search writes its patterns, mixing weights and a starting folder; both PAR students reload
    mixing = load(project, "artifacts/par/mixing.json")
    searched = {stack: parse_pattern(mixing["patterns"][stack], stack) for stack in ("encoder", "decoder")}
    assert [len(mixing["mixing_weights"][stack]) for stack in ("encoder", "decoder")] == [2, 6]
    assert all(
        math.isclose(sum(p.values()), 1.0, abs_tol=1e-3)
        for positions in mixing["mixing_weights"].values()
        for p in positions
        if p != "c"
    )
    assert (project / "artifacts/plots/par_search.png").stat().st_size > 0
    assert load(project, "artifacts/models/par-searched/config.json")["par"] == searched
    for name, patterns in {**par_students, "par": searched}.items():
        manifest = load(project, f"artifacts/students/{name}/seed-0/manifest.json")
        assert manifest["attn_implementation"] == "entmax" and manifest["stage"] == f"student@{name}"
        assert load(project, f"artifacts/students/{name}/seed-1/config.json")["par"] == patterns
        row = students[name]["par"]
        attention = sum(pattern.count("s") for pattern in patterns.values())
        assert row["attention_sublayers"] == attention
        assert row["attention_fraction"] == round(attention / 3, 4)
        assert students[name]["sparsity"] == 0.0 and math.isfinite(students[name]["bleu"])
    assert "| par-hand | s (f)x2 | s (cf)x2 f | 0.67 |" in report  # the PAR table

    assert "up to date" in dvc(project, "status").stdout
    # outputs are byte-reproducible: forcing extract and project to run again changes nothing DVC tracks
    dvc(project, "repro", "--force", "--single-item", "extract", "project")
    assert "up to date" in dvc(project, "status").stdout
    assert (project / "artifacts/metrics/extract.timings.json").is_file()
    run(project, "git", "check-ignore", "-q", "artifacts/metrics/extract.timings.json")  # git leaves it out

    # Switching to a profile with fewer students in the same workspace scores those alone.
    check_fewer_students(project)
    assert "up to date" in dvc(project, "status").stdout

    # Pointing extract at another checkpoint invalidates it alone, and re-extraction names the new teacher.
    set_params(project, "extract", teacher="artifacts/models/pretrain")
    status = dvc(project, "status").stdout
    assert "extract:" in status and "teacher:" not in status and "pretrain:" not in status
    dvc(project, "repro", "-s", "extract")
    for name in ("train", "test"):
        graphs = load(project, f"artifacts/graphs/{name}/manifest.json")
        assert graphs["teacher"]["checkpoint"] == "artifacts/models/pretrain"
    assert "project:" in dvc(project, "status").stdout


def copy_path(source: Path, target: Path) -> None:
    """Copy a file or a whole folder to ``target``, making its parent folders."""
    target.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)


def check_fewer_students(project: Path) -> None:
    """Switching to a profile that declares fewer students in the same workspace: the other profile's student
    folders stay on disk, and evaluate and report follow ``student.instances``, not the folder listing. A
    declared student with no folder gets one line naming the command that builds it. The workspace is put
    back as it was (params, lock and the evaluation's and report's outputs) afterwards."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    written = [params["evaluate"][key] for key in ("out", "timings", "evidence", "hypotheses")]
    written += [params["report"][key] for key in ("out", "plots", "metrics", "results")]
    saved = project.parent / f"{project.name}-saved"
    kept_files = ["params.yaml", "dvc.lock", *written]
    for name in kept_files:
        copy_path(project / name, saved / name)
    kept = {
        name: spec for name, spec in params["student"]["instances"].items() if name in ("sparsefinder", "ssa")
    }
    try:
        set_params(project, "student", instances=kept)
        assert (project / "artifacts/students/samsa/seed-0/manifest.json").is_file()  # the leftover
        dvc(project, "repro")
        evaluation = load(project, params["evaluate"]["out"])
        assert [row["student"] for row in evaluation["students"]] == ["sparsefinder", "ssa"]
        assert set(load(project, params["report"]["metrics"])["students"]) == {"sparsefinder", "ssa"}
        report = (project / params["report"]["out"]).read_text()
        assert "| samsa" not in report and "| sbm" not in report and "| par" not in report

        paths = {"out": "artifacts/students/ghost", "run_dir": "artifacts/runs/student-ghost"}
        ghost = {**kept, "ghost": {**kept["ssa"], **paths, "metrics": "artifacts/metrics/student_ghost.json"}}
        set_params(project, "student", instances=ghost)
        failed = run(project, sys.executable, "-m", "stages.evaluate", check=False)
        assert failed.returncode == 2
        assert failed.stderr.strip().splitlines()[-1] == (
            "error: student.instances.ghost.out: 'artifacts/students/ghost/seed-0' holds no student model "
            "(one folder per seed of student.seeds); build it: dvc repro student@ghost"
        )
    finally:
        for name in kept_files:
            if (project / name).is_dir():
                shutil.rmtree(project / name)
            copy_path(saved / name, project / name)
        shutil.rmtree(saved)


def test_killed_training_resumes(project: Path) -> None:
    """Kill pretrain after a checkpoint; running it again resumes from the last one and finishes."""
    if not (project / "artifacts/data/dataset_dict.json").is_file():
        run(project, sys.executable, "-m", "stages.prepare")
    params = yaml.safe_load((project / "params.yaml").read_text())
    # Checkpoints every 2 of 40 steps leave a wide window to kill the run in, whatever the machine's speed.
    params["pretrain"]["train"].update(max_steps=40, save_steps=2, eval_steps=20)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run_dir, out = project / params["pretrain"]["run_dir"], project / "artifacts/resume-test/model"
    set_params(project, "pretrain", out=str(out), metrics=str(project / "artifacts/resume-test/metrics.json"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.pretrain"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not list(run_dir.glob(f"checkpoint-*/{CHECKPOINT_FILES}")) and time.monotonic() < deadline:
        assert process.poll() is None, "pretrain exited before its first checkpoint"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = sorted(
        run_dir.glob(f"checkpoint-*/{CHECKPOINT_FILES}"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    assert saved and not out.exists(), "training was not interrupted after a checkpoint"

    resumed = run(project, sys.executable, "-m", "stages.pretrain")
    assert f"resuming from {saved[-1].parent.relative_to(project)}" in resumed.stderr
    assert (out / "model.safetensors").is_file() and not run_dir.exists()


def test_torchrun_two_processes(project: Path) -> None:
    """A few pretrain steps under torchrun with 2 CPU processes (gloo)."""
    if not (project / "artifacts/data/dataset_dict.json").is_file():
        run(project, sys.executable, "-m", "stages.prepare")
    out = project / "artifacts/ddp-test/model"
    set_params(
        project,
        "pretrain",
        out=str(out),
        run_dir=str(project / "artifacts/ddp-test/run"),
        metrics=str(project / "artifacts/ddp-test/metrics.json"),
    )
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["pretrain"]["train"].update(max_steps=3, save_steps=3, eval_steps=3)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run(
        project,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        "-m",
        "stages.pretrain",
    )
    assert (out / "model.safetensors").is_file(), result.stderr[-2000:]
    assert load(project, "artifacts/ddp-test/metrics.json")["test"]["sentences"] > 0


def test_student_distills_under_torchrun(project: Path) -> None:
    """A few steps of the SSA student (sampled attention, distillation) under torchrun with 2 processes."""
    if not (project / "artifacts/models/teacher/manifest.json").is_file():
        dvc(project, "repro", "teacher")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["student"]["train"].update(max_steps=2, save_steps=2, eval_steps=2)
    out = project / "artifacts/ddp-test/student"
    params["student"]["instances"]["ssa"].update(
        out=str(out), run_dir=str(project / "artifacts/ddp-test/student-run"),
        metrics=str(project / "artifacts/ddp-test/student.json"),
    )  # fmt: skip
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run(
        project, sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", "29518", "-m", "stages.student", "ssa",
    )  # fmt: skip
    for seed in params["student"]["seeds"]:
        manifest = load(project, f"artifacts/ddp-test/student/seed-{seed}/manifest.json")
        assert manifest["attn_implementation"] == "ssa", result.stderr[-2000:]
        assert math.isfinite(
            load(project, "artifacts/ddp-test/student.json")[f"seed-{seed}"]["valid"]["perplexity"]
        )


def test_pretrain_from_named_checkpoint(project: Path) -> None:
    """``pretrain.init`` naming a model folder fine-tunes it with its own tokenizer and records the parent."""
    init = project / "artifacts/models/pretrain"
    if not (init / "model.safetensors").is_file():
        dvc(project, "repro", "pretrain")
    out = project / "artifacts/init-test/model"
    set_params(
        project,
        "pretrain",
        init=str(init),
        out=str(out),
        run_dir=str(project / "artifacts/init-test/run"),
        metrics=str(project / "artifacts/init-test/metrics.json"),
    )
    run(project, sys.executable, "-m", "stages.pretrain")
    manifest = load(project, "artifacts/init-test/model/manifest.json")
    assert manifest["parent"] == {
        "source": str(init),
        "model_sha256": file_sha256(init / "model.safetensors"),
    }
    assert manifest["attn_implementation"] == "sdpa"
    vocabulary = [json.loads((folder / "tokenizer.json").read_text())["model"] for folder in (out, init)]
    assert vocabulary[0] == vocabulary[1]
