"""Params checked by meaning: finite numbers, sizes a machine can hold, a file read defensively, knob flags
parsed to one line, and ``sparsefinder params`` refusing a file exactly when the stage would.

Every case is validation only: a stage's checks run before any work, so no case trains or extracts.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from pipeline.cli.predictor_args import parse_knobs
from pipeline.errors import UserError
from pipeline.graphs.extract import extract_graphs, teacher_fingerprint
from pipeline.params.base import MAX_DEPTH, MAX_NODES, Section
from pipeline.params.sections import SECTIONS, load_all
from tests.reliability.test_params_strict import nested_sections, user_error
from tests.stage_runner import run_module
from tests.test_params_errors import (  # noqa: F401  (module fixtures: corpus, texts)
    MICRO,
    TEACHER_POSITIONS,
    assert_user_error,
    corpus,
    forbid_loading_weights,
    params_file,
    run_stage,
    save_tiny_teacher,
    texts,
)
from tests.tiny import wikitext_folder

# no message, whatever the input, is longer than this
MESSAGE_LIMIT = 600


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a run that exited 2 without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert len(lines[0]) < MESSAGE_LIMIT, lines[0][:300]
    return lines[0]


def sparsefinder_params(path: Path) -> subprocess.CompletedProcess:
    return run_module("pipeline", "params", "--params", str(path), cwd=path.parent)


# ----------------------------------------------------------------------------------------------------------
# finite numbers


def float_fields(model: type[Section], where: str) -> Iterator[str]:
    """Dotted keys of every float field of ``model`` and of the sections nested in it (not in maps); a
    list's items as its first one (``….restarts.0.lr``)."""
    for name, field in model.model_fields.items():
        if float in (field.annotation, *get_args(field.annotation)):
            yield f"{where}.{name}"
        if "dict" not in str(field.annotation):
            item = ".0" if "list" in str(field.annotation) else ""
            for nested in nested_sections(field.annotation):
                yield from float_fields(nested, f"{where}.{name}{item}")


FLOAT_KEYS = sorted({key for name, model in SECTIONS.items() for key in float_fields(model, name)})
# a valid first item of each list of sections a float key passes through, the rest of that item
LIST_ITEMS = {"restarts": {"step": 5, "lr": 1e-3}}


def nan_at(key: str) -> dict[str, Any]:
    """Params changes putting NaN at ``key``, inside a valid first item where the key runs through a list."""
    if ".0." not in key:
        return {key: math.nan}
    listed, field = key.split(".0.")
    return {listed: [LIST_ITEMS[listed.rsplit(".", 1)[1]] | {field: math.nan}]}


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_refuses_nan(tmp_path: Path, key: str) -> None:
    message = user_error(key.split(".")[0], params_file(tmp_path, nan_at(key)))
    assert message.endswith(f"{key} = nan: Input should be a finite number"), message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "student.distill.temperature",
            math.inf,
            "student.distill.temperature = inf: Input should be a finite",
        ),
        ("teacher.alpha", -math.inf, "teacher.alpha = -inf: Input should be a finite number"),
        (
            "report.sparsity_levels",
            [0.8, math.nan],
            "report.sparsity_levels.1 = nan: Input should be a finite",
        ),
        (
            "evaluate.methods.indexer",
            {"margin": [0.0, math.nan]},
            "evaluate: methods.indexer.margin = nan: must be a finite number",
        ),
        (
            "configure.knobs",
            {"buckets": 8, "top_k": math.inf},
            "configure: knobs.top_k = inf: must be a finite",
        ),
    ],
    ids=["temperature-inf", "alpha-minus-inf", "list-item", "grid-margin", "knob"],
)
def test_infinities_and_grids(tmp_path: Path, key: str, value: Any, expected: str) -> None:
    assert expected in user_error(key.split(".")[0], params_file(tmp_path, {key: value}))


# ----------------------------------------------------------------------------------------------------------
# sizes


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "pretrain.model.d_model",
            10**12,
            "pretrain.model.d_model = 1000000000000: a 1e+12 × 8000-word embedding needs ~3.2e+16 bytes; "
            "allowed: ≤ 65536",
        ),
        (
            "project.rank",
            10**12,
            "project.rank = 1000000000000: a 1e+12 × 512 projection per head needs ~2.0e+15 bytes; "
            "allowed: ≤ 65536",
        ),
        (
            "project.hidden",
            10**12,
            "project.hidden = 1000000000000: a 1e+12 × 512 hidden layer per head needs",
        ),
        ("pretrain.eval.beams", 10**12, "pretrain.eval.beams = 1000000000000: 1e+12 beams × 256 tokens"),
        ("cluster.bucket_counts", [2, 10**12], "cluster.bucket_counts.1 = 1000000000000: 1e+12 centroids"),
        ("teacher.train.batch_size", 10**9, "teacher.train.batch_size = 1000000000: 1e+09 sequences × 256"),
        ("teacher.train.max_steps", 10**12, "teacher.train.max_steps = 1000000000000: allowed: ≤ 100000000"),
        (
            "extract.stores.train.max_sentences",
            10**12,
            "extract.stores.train.max_sentences = 1000000000000: allowed: ≤ 1000000000",
        ),
        ("evaluate.windows", [0, 2**40 + 1], "evaluate.windows.1 = 1099511627777: a window wider than any"),
        (
            "configure.knobs",
            {"buckets": 10**12},
            "configure: knobs.buckets = 1000000000000: allowed: at most",
        ),
    ],
    ids=["d-model", "rank", "hidden", "beams", "buckets", "batch", "steps", "sentences", "window", "knob"],
)
def test_sizes_are_bounded(tmp_path: Path, key: str, value: Any, expected: str) -> None:
    assert expected in user_error(key.split(".")[0], params_file(tmp_path, {key: value}))


def test_a_huge_size_stops_the_stage_before_it_allocates(tmp_path: Path) -> None:
    line = one_line(run_stage("pretrain", tmp_path, {"pretrain.model.d_model": 10**12}))
    assert "pretrain.model.d_model = 1000000000000" in line and "allowed: ≤ 65536" in line
    assert not (tmp_path / "artifacts").exists()


# ----------------------------------------------------------------------------------------------------------
# reading the file


def laughs(levels: int) -> str:
    """A document whose last anchor expands to 9**levels strings ("billion laughs")."""
    text = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, levels + 1):
        text += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    return text + f"prepare: {{sword: {{modules: *a{levels}}}}}\n"


def nested_aliases(levels: int) -> str:
    """A document of small lists, each holding the previous one: ``levels`` deep once expanded."""
    return "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, levels))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            MICRO.read_bytes().replace(b"prepare:", b"prepare: # \xff", 1),
            "not UTF-8 text (byte 0xff at offset {offset}); allowed: a UTF-8 YAML file",
        ),
        (
            b"prepare: " + b"[" * 2000 + b"]" * 2000 + b"\n",  # Python's stack holds 1000 frames
            f"not valid YAML (line 1: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH} at most)",
        ),
        (
            ("prepare:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 2 * MAX_DEPTH))).encode(),
            f"nested deeper than {MAX_DEPTH} levels",
        ),
        (
            laughs(9).encode(),
            f"not valid YAML (line 6: more than {MAX_NODES} values once its aliases are expanded; allowed: "
            f"{MAX_NODES} at most)",
        ),
        (
            nested_aliases(MAX_DEPTH + 20).encode(),
            f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded",
        ),
        (b"prepare: &x {sword: {modules: [*x]}}\n", "an alias refers to a node that contains it"),
    ],
    ids=["not-utf8", "deep-flow", "deep-block", "billion-laughs", "deep-aliases", "self-alias"],
)
def test_hostile_files_are_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    """The library's error and the command's agree, and both are one short line naming the file."""
    path = tmp_path / "params.yaml"
    path.write_bytes(content)
    expected = expected.format(offset=content.find(b"\xff"))
    message = user_error("prepare", path)
    assert message.startswith(f"{path}: ") and expected in message, message
    assert one_line(sparsefinder_params(path)) == f"error: {message}"


def test_long_values_are_cut_in_messages(tmp_path: Path) -> None:
    message = user_error("project", params_file(tmp_path, {"project.rank": "9" * 100_000, "x" * 1000: 1}))
    assert message.startswith(f"{tmp_path / 'params.yaml'}: project.rank = '999")
    assert "9" * 100 not in message and message.endswith("got a string (write numbers unquoted)")
    assert len(message) < 300


# ----------------------------------------------------------------------------------------------------------
# knob flags


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("buckets", "--knob 'buckets': not KEY=VALUE; allowed: --knob KEY=VALUE, KEY one of alpha, backend"),
        ("=3", "--knob '=3': not KEY=VALUE; allowed: --knob KEY=VALUE, KEY one of"),
        ("buckets=1000000000000", "--knob 'buckets=1000000000000': allowed: at most 1048576"),
        ("margin=.nan", "--knob 'margin=.nan': must be a finite number"),
        (
            "buckets=[2, 4]",
            "--knob 'buckets=[2, 4]': allowed: a number, a string, true/false or null, not a list",
        ),
        (
            "buckets=[[[",
            "--knob 'buckets=[[[': the value is not valid YAML (line 1: expected the node content",
        ),
        ("b" * 500, "--knob 'bbbbbbbb"),
    ],
    ids=["no-equals", "no-key", "huge", "nan", "list", "bad-yaml", "long"],
)
def test_malformed_knobs(tmp_path: Path, flag: str, expected: str) -> None:
    with pytest.raises(UserError) as err:
        parse_knobs([flag])
    assert str(err.value).startswith(expected), str(err.value)
    result = run_module(
        "pipeline", "configure", "no-teacher", "out", "--method", "kmeans", "--knob", flag, cwd=tmp_path
    )
    assert one_line(result) == f"error: {err.value}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--knob", "nosuch=3"],
            "predictor kmeans has no knob nosuch; its knobs: buckets, top_k, iterations, "
            "max_points_per_centroid, backend",
        ),
        (["--knob", "buckets=x"], "kmeans.buckets must be an integer >= 1; got 'x'"),
        (["--knob", "buckets=8"], "predictor kmeans is fitted; give its state file (--centroids)"),
        (
            ["--knob", "buckets=8", "--centroids", "state.safetensors"],
            "predictor kmeans works on projected queries and keys; give --projections",
        ),
        (
            ["--knob", "buckets=8", "--centroids", "state.safetensors", "--projections", "p.safetensors"],
            "projections file p.safetensors not found; run the project stage first",
        ),
    ],
    ids=["unknown-knob", "knob-value", "no-state", "no-projections", "missing-projections"],
)
@pytest.mark.parametrize("teacher_exists", [False, True], ids=["missing-teacher", "teacher"])
def test_the_predictor_is_checked_before_the_teacher(
    tmp_path: Path,
    teacher: tuple[Any, Any, Path],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    expected: str,
    teacher_exists: bool,
) -> None:
    """What cannot make the predictor (its knobs, the inputs it needs) is reported before the teacher is
    looked for, so a missing teacher does not hide it; a missing input file is reported after the teacher
    is found but before it is loaded, so a large one is not read first."""
    if not teacher_exists and "--projections" in flags:
        expected = "teacher = 'no-teacher': not a local model folder"  # the files come after the teacher
    forbid_loading_weights(monkeypatch, "pipeline.attention.configure", "load_model")
    folder = str(teacher[2]) if teacher_exists else "no-teacher"
    result = run_module("pipeline", "configure", folder, "out", "--method", "kmeans", *flags, cwd=tmp_path)
    assert one_line(result).startswith(f"error: {expected}"), result.stderr
    assert not (tmp_path / "out").exists()


def test_well_formed_knobs_read_as_yaml_scalars() -> None:
    parsed = parse_knobs(
        ["buckets=8", "threshold=1e-1", "tokens_per_bin=null", "fitting=pca", "seed=4294967295"]
    )
    assert parsed == {
        "buckets": 8,
        "threshold": 0.1,
        "tokens_per_bin": None,
        "fitting": "pca",
        "seed": 2**32 - 1,
    }


# ----------------------------------------------------------------------------------------------------------
# `sparsefinder params` refuses exactly when the stage would


@pytest.fixture(scope="module")
def projected(
    micro_store: Path,
    teacher: tuple[Any, Any, Path],
    dataset: Any,
    corpus: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """Every kind of input the checks read: the micro store (head dim 8, train split) and projections
    fitted on it by the project stage (decoder_self), the micro teacher it was extracted from (64
    positions) and two test-split stores of it (one of decoder_self and cross graphs, one of cross graphs
    only); a prepared corpus of sentence pairs and a tiny α-entmax Marian over it (32 positions); a
    prepared lm corpus of blocks, cut with a tokenizer of its own."""
    folder = tmp_path_factory.mktemp("projected")
    model, tokenizer, micro_teacher = teacher
    for name, kinds in [("held_out", ("decoder_self", "cross")), ("cross_only", ("cross",))]:
        extract_graphs(
            model,
            tokenizer,
            dataset,
            folder / name,
            fingerprint=teacher_fingerprint(model, micro_teacher),
            split="test",
            kinds=kinds,
            min_length=4,
            batch_size=4,
            dtype="float32",
            shard_sentences=4,
        )
    result = run_stage("project", folder, {"project.graphs": str(micro_store)})
    assert result.returncode == 0, result.stderr[-3000:]
    splits = {"train": {f"Train {i}": 200 for i in range(4)}, "validation": {"V": 200}, "test": {"T": 200}}
    hf = {"name": str(wikitext_folder(folder / "wikitext", splits)), "text_column": "text"}
    blocks = {"prepare.task": "lm", "prepare.source": "hf", "prepare.hf": hf, "prepare.context": 48}
    result = run_stage("prepare", folder, {**blocks, "prepare.vocab_size": 120, "prepare.out": "blocks"})
    assert result.returncode == 0, result.stderr[-3000:]
    return {
        "graphs": str(micro_store),
        "projections": str(folder / "artifacts/predictors/projections.safetensors"),
        "corpus": str(corpus),
        "teacher": str(save_tiny_teacher(corpus, folder / "teacher")),
        "blocks": str(folder / "blocks"),
        "micro_teacher": str(micro_teacher),
        "held_out": str(folder / "held_out"),
        "cross_only": str(folder / "cross_only"),
    }


def cluster_inputs(projected: dict[str, str]) -> dict[str, str]:
    return {"cluster.graphs": projected["graphs"], "cluster.projections": projected["projections"]}


def trained_on(section: str, p: dict[str, str], data: str = "corpus", model: str = "init") -> dict[str, str]:
    """``section``'s corpus (``data``: "corpus" or "blocks") and its model key set to the tiny teacher."""
    return {f"{section}.data": p[data], f"{section}.{model}": p["teacher"]}


AGREEMENT = [
    (
        "project",
        lambda p: {"project.graphs": p["graphs"], "project.rank": 16},
        "project.rank = 16: the teacher's",
    ),
    (
        "cluster",
        lambda p: {**cluster_inputs(p), "cluster.indexer.ranks": [2, 16]},
        "cluster.indexer.ranks = [2, 16]: rank 16 exceeds the head dim 8",
    ),
    (
        "cluster",
        lambda p: {**cluster_inputs(p), "cluster.bucket_counts": [2, 4096]},
        "cluster.bucket_counts = [2, 4096]: 4096 centroids need",
    ),
    ("evaluate", lambda p: {"evaluate.methods.nosuch": {}}, "evaluate.methods.nosuch: unknown predictor"),
    (
        "evaluate",
        lambda p: {"evaluate.methods.distance": {"threshold": [-1.0]}},
        "distance.threshold must be a number >= 0",
    ),
    (
        "evaluate",
        lambda p: {"evaluate.speed": {"methods": ["bigbird"]}, "evaluate.methods": {"window": {}}},
        "evaluate: speed.methods lists 'bigbird', which methods does not evaluate",
    ),
    (
        "evaluate",
        lambda p: {"evaluate.graphs": p["graphs"]},
        "evaluate.graphs = '{graphs}' was extracted from the train split, which the predictors were fitted "
        "on; allowed: a store of the valid or test split",
    ),
    (
        "evaluate",
        lambda p: {"evaluate.graphs": p["held_out"], "evaluate.teacher": p["teacher"]},
        "evaluate.teacher = '{teacher}' is not the teacher evaluate.graphs was extracted from",
    ),
    (
        "evaluate",
        lambda p: {
            "evaluate.graphs": p["cross_only"],
            "evaluate.teacher": p["micro_teacher"],
            "evaluate.projections": p["projections"],
        },
        "evaluate.graphs = '{cross_only}' holds no decoder_self graphs (the projections' kind)",
    ),
    (
        "evaluate",
        lambda p: {
            "evaluate.graphs": p["held_out"],
            "evaluate.teacher": p["micro_teacher"],
            "evaluate.projections": p["projections"],
            "evaluate.data": p["blocks"],
            "evaluate.speed.contexts": [128],
        },
        "evaluate.speed.contexts = [128]: the teacher has learned positions for 64 tokens; allowed: "
        "contexts up to 64 (rotary models take any length)",
    ),
    (
        "configure",
        lambda p: {"configure.knobs": {"buckets": 8, "top_kk": 1}},
        "configure.method = 'kmeans', configure.knobs: predictor kmeans has no knob top_kk",
    ),
    (
        "configure",
        lambda p: {
            "configure.teacher": p["teacher"],
            "configure.projections": p["projections"],
            "configure.method": "distance",
            "configure.knobs": {"threshold": 1.0},
        },
        "{projections} was fitted on the graphs of another teacher",
    ),
    ("project", lambda p: {"project.lr": math.nan}, "project.lr = nan: Input should be a finite number"),
    (
        "pretrain",
        lambda p: {"pretrain.data": p["corpus"], "pretrain.init": p["corpus"]},
        "pretrain.init = '{corpus}': not a model folder (need config.json there) nor a hub id like "
        "'org/name'",
    ),
    (
        "pretrain",
        lambda p: trained_on("pretrain", p, "blocks"),
        "pretrain.init = '{teacher}': a lm corpus holds blocks of its own tokenizer; allowed: null (a model "
        "from scratch)",
    ),
    (
        "pretrain",
        lambda p: {
            "pretrain.data": p["corpus"],
            "pretrain.model.max_positions": 4,
            "pretrain.eval.max_new_tokens": 4,
        },
        "pretrain.model.max_positions = 4: {corpus} holds sequences of up to",
    ),
    (
        "pretrain",
        lambda p: {**trained_on("pretrain", p), "pretrain.eval.max_new_tokens": 100},
        "pretrain.eval.max_new_tokens = 100: the model of pretrain.init = '{teacher}' has "
        f"{TEACHER_POSITIONS} positions; allowed: at most {TEACHER_POSITIONS}",
    ),
    (
        "teacher",
        lambda p: {"teacher.data": p["corpus"], "teacher.init": p["corpus"]},
        "teacher.init = '{corpus}': not a local model folder (need config.json and model.safetensors)",
    ),
    (
        "teacher",
        lambda p: {**trained_on("teacher", p), "teacher.eval.max_new_tokens": 100},
        "teacher.eval.max_new_tokens = 100: the model of teacher.init = '{teacher}' has",
    ),
    (
        "teacher",
        lambda p: trained_on("teacher", p, "blocks"),
        "teacher.init = '{teacher}': the model's tokenizer is not the one its lm corpus was cut with",
    ),
    (
        "extract",
        lambda p: {
            **trained_on("extract", p, model="teacher"),
            "extract.kinds": ["decoder_self", "encoder_self"],
        },
        "extract.kinds = ['decoder_self', 'encoder_self']: the teacher's kinds differ in shape",
    ),
    (
        "extract",
        lambda p: {**trained_on("extract", p, model="teacher"), "extract.stores.test.min_length": 500},
        "extract.stores.test.min_length = 500: no sentence of the test split has 500 target tokens",
    ),
    (
        "extract",
        lambda p: trained_on("extract", p, "blocks", "teacher"),
        "extract.teacher = '{teacher}': the model's tokenizer is not the one its lm corpus was cut with",
    ),
    (
        "par_search",
        lambda p: trained_on("par_search", p, "blocks", "teacher"),
        "par_search.teacher = '{teacher}': the model's tokenizer is not the one its lm corpus was cut with",
    ),
    (
        "student@ssa",
        lambda p: {**trained_on("student", p, model="teacher"), "student.teacher": p["corpus"]},
        "student.teacher = '{corpus}': not a local model folder",
    ),
    (
        "student@sparsefinder",
        lambda p: {
            **trained_on("student", p, model="teacher"),
            "student.instances.sparsefinder.init": p["teacher"],
        },
        "student.instances.sparsefinder.init = '{teacher}' holds a model with entmax attention; allowed: a "
        "folder with sparsefinder attention",
    ),
    (
        "student@ssa",
        lambda p: {
            **trained_on("student", p, "blocks", "teacher"),
            "student.instances.ssa.init": p["teacher"],
        },
        "student.instances.ssa.init = '{teacher}': the model's tokenizer is not the one its lm corpus",
    ),
    (
        "student@par-hand",
        lambda p: {
            **trained_on("student", p, model="teacher"),
            "student.instances.par-hand.init": p["teacher"],
            "student.instances.par-hand.encoder": None,
            "student.instances.par-hand.decoder": None,
        },
        "student.instances.par-hand.init = '{teacher}' is no PAR model and no patterns are given; "
        "allowed: its encoder and decoder patterns to rebuild it to, or a par_search folder as init",
    ),
]


@pytest.mark.parametrize(
    ("stage", "changes", "expected"),
    AGREEMENT,
    ids=[
        "rank",
        "indexer-rank",
        "centroids",
        "method",
        "knob-value",
        "speed-methods",
        "held-out-store",
        "evaluate-teacher",
        "evaluate-projections-kind",
        "evaluate-speed-positions",
        "knob-name",
        "configure-projections-teacher",
        "nan",
        "pretrain-init",
        "pretrain-init-blocks",
        "pretrain-positions",
        "pretrain-generation",
        "teacher-init",
        "teacher-generation",
        "teacher-vocabulary",
        "extract-kinds",
        "extract-min-length",
        "extract-vocabulary",
        "par-search-vocabulary",
        "student-teacher",
        "student-init-attention",
        "student-vocabulary",
        "student-par-patterns",
    ],
)
def test_params_command_and_stage_agree(
    tmp_path: Path, projected: dict[str, str], stage: str, changes: Any, expected: str
) -> None:
    """Each check a stage makes before its work: the same exit 2 and the same line from the stage and
    from ``sparsefinder params`` (the student checks for one instance run for every instance there)."""
    path = params_file(tmp_path, changes(projected))
    expected = expected.format(**projected)
    line = one_line(sparsefinder_params(path))
    assert expected in line, line
    script, _, instance = stage.partition("@")
    instance_args = [instance] if instance else []
    stage_line = assert_user_error(
        run_module(f"stages.{script}", *instance_args, "--params", str(path), cwd=tmp_path),
        expected,
        tmp_path / "artifacts",
    )
    assert stage_line == line


def test_params_command_checks_outputs(tmp_path: Path) -> None:
    (tmp_path / "artifacts").write_text("a file where the outputs' folder should be\n")
    line = one_line(sparsefinder_params(params_file(tmp_path, {})))
    assert "prepare.out" in line and "artifacts" in line, line
    assert (tmp_path / "artifacts").read_text() == "a file where the outputs' folder should be\n"


def test_params_command_says_which_checks_wait_for_inputs(tmp_path: Path, projected: dict[str, str]) -> None:
    """Each check waits only for its own inputs: the corpus and the teacher exist, so every check of the
    stages reading only those ran; the line names the first missing input of each check still waiting."""
    changes = {
        "project.graphs": projected["graphs"],
        **trained_on("teacher", projected, model="init"),
        "student.teacher": projected["teacher"],
    }
    result = sparsefinder_params(params_file(tmp_path, changes))
    assert result.returncode == 0, result.stderr[-3000:]
    waiting = (
        "pretrain.data, extract.teacher, extract.data, cluster.graphs, evaluate.graphs, evaluate.data, "
        "evaluate.students, configure.teacher, configure.projections, configure.state, par_search.teacher, "
        "par_search.data, "
        "student.data, student.instances.sparsefinder.init, "
        "student.instances.ssa.init, student.instances.sbm.init, student.instances.samsa.init, "
        "student.instances.par.init, student.instances.par-hand.init"
    )
    assert result.stdout.splitlines() == [
        f"{tmp_path / 'params.yaml'}: valid ({', '.join(SECTIONS)})",
        f"not checked against their inputs, which do not exist yet: {waiting}",
    ]


def test_a_check_runs_once_its_own_inputs_exist(tmp_path: Path, projected: dict[str, str]) -> None:
    """evaluate's corpus check needs neither its graph store nor its state file."""
    changes = {"evaluate.data": projected["corpus"], "evaluate.speed.contexts": [64]}
    line = one_line(sparsefinder_params(params_file(tmp_path, changes)))
    assert line == (
        f"error: evaluate.speed.contexts = [64]: {projected['corpus']} holds sentence pairs, not long "
        "sequences; allowed: [] (or a corpus of prepare.task lm, mlm or mqar)"
    )


def test_the_gpu_profiles_pass_the_command(tmp_path: Path) -> None:
    """The bounds leave the profiles with the largest values valid (their inputs do not exist here)."""
    for profile in [MICRO.parent / "gpu.yaml", MICRO.parent / "lm-gpu.yaml"]:
        path = tmp_path / "params.yaml"
        path.write_text(profile.read_text())
        assert set(load_all(path)) == set(SECTIONS)
        result = sparsefinder_params(path)
        assert result.returncode == 0, (profile, result.stderr[-3000:])
