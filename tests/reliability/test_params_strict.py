"""Strict params: no type is converted, no key is given twice, no section is left out, seeds are ≥ 0.

Each bad file is the micro profile changed in one place, and each error is one line naming the key, what it
got and what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from pydantic.fields import FieldInfo

from pipeline.checkpoint import resolve_checkpoint, resolve_outside_checkpoint
from pipeline.errors import UserError
from pipeline.params.base import Section, Seed, UniqueKeyLoader
from pipeline.params.prepare import Prepare
from pipeline.params.sections import SECTIONS, load_all, load_section
from tests.test_params_errors import MICRO, REMOVE, assert_user_error, params_file, run_stage

ROOT = Path(__file__).resolve().parents[2]
PROFILES = [ROOT / "params.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]
MISSING = "section (every stage reads its own section; see configs/micro.yaml for a complete example)"


def user_error(section: str, path: Path) -> str:
    """The one-line message of the UserError that loading ``section`` from ``path`` raises."""
    with pytest.raises(UserError) as err:
        load_section(section, path)
    message = str(err.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------------------------------------
# strict types


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("project.rank", True, "Input should be a valid integer, got a boolean"),
        ("project.rank", "4", "Input should be a valid integer, got a string (write numbers unquoted)"),
        ("project.rank", 4.0, "Input should be a valid integer, got a float"),
        ("project.lr", True, "Input should be a valid number, got a boolean"),
        ("project.lr", "0.01", "Input should be a valid number, got a string (write numbers unquoted)"),
        ("project.graphs", 5, "Input should be a valid string, got an integer"),
        ("project.shared", 1, "Input should be a valid boolean, got an integer"),
        ("project.shared", "yes", "Input should be a valid boolean, got a string"),
        # nested sections given as mappings, list items, dict values and null-able fields are strict too
        ("pretrain.model.d_model", True, "Input should be a valid integer, got a boolean"),
        ("pretrain.init", 5, "Input should be a valid string, got an integer"),
        ("prepare.max_length_ratio", False, "Input should be a valid number, got a boolean"),
        (
            "extract.stores.test.max_sentences",
            "16",
            "Input should be a valid integer, got a string (write numbers unquoted)",
        ),
    ],
)
def test_no_type_is_converted(tmp_path: Path, key: str, value: Any, expected: str) -> None:
    message = user_error(key.split(".")[0], params_file(tmp_path, {key: value}))
    assert message == f"{tmp_path / 'params.yaml'}: {key} = {value!r}: {expected}"


def test_list_items_are_strict(tmp_path: Path) -> None:
    message = user_error("cluster", params_file(tmp_path, {"cluster.bucket_counts": [2, True]}))
    assert message.endswith("cluster.bucket_counts.1 = True: Input should be a valid integer, got a boolean")


def test_exponents_are_floats_as_in_yaml_1_2_and_quoted_numbers_are_text(tmp_path: Path) -> None:
    """``1e-3`` is a float (YAML 1.2, as DVC reads the file); ``'1e-3'`` stays text and is refused."""
    path = tmp_path / "params.yaml"
    for written in ("1e-3", "1.0e-3", "1E-3"):
        path.write_text(MICRO.read_text().replace("    lr: 0.0003\n", f"    lr: {written}\n"))
        assert load_section("teacher", path).train.lr == 0.001
    path.write_text(MICRO.read_text().replace("    lr: 0.0003\n", "    lr: '1e-3'\n"))
    assert user_error("teacher", path).endswith(
        "teacher.train.lr = '1e-3': Input should be a valid number, got a string (write numbers unquoted)"
    )


def test_an_int_is_a_float(tmp_path: Path) -> None:
    lr = load_section("project", params_file(tmp_path, {"project.lr": 1})).lr
    assert lr == 1.0 and isinstance(lr, float)


@pytest.mark.parametrize("key", ["project.hidden", "prepare.max_examples"])
def test_null_stays_allowed(tmp_path: Path, key: str) -> None:
    section, field = key.split(".")
    assert getattr(load_section(section, params_file(tmp_path, {key: None})), field) is None


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_methods_of_every_profile_pass_unchanged(profile: Path) -> None:
    """``evaluate.methods`` holds lists of anything (null, ints, floats): strict mode keeps them as is."""
    written = yaml.safe_load(profile.read_text())["evaluate"]["methods"]
    assert load_all(profile)["evaluate"].methods == written


# ----------------------------------------------------------------------------------------------------------
# duplicate keys


def duplicated(tmp_path: Path, first: str, duplicate: str, after: str) -> tuple[Path, int, int]:
    """The micro profile with ``duplicate`` inserted after line ``after``: the file and the lines of both."""
    lines = MICRO.read_text().splitlines(keepends=True)
    at = lines.index(after) + 1
    lines.insert(at, duplicate)
    path = tmp_path / "params.yaml"
    path.write_text("".join(lines))
    return path, lines.index(first) + 1, at + 1


@pytest.mark.parametrize(
    ("first", "duplicate", "after", "key"),
    [
        ("report:\n", "report: {}\n", "  results: artifacts/metrics/results\n", "report"),
        ("  rank: 4\n", "  rank: 8\n", "  rank: 4\n", "project.rank"),
        ("    lr: 0.005\n", "    lr: 0.01\n", "    lr: 0.005\n", "pretrain.train.lr"),
        (
            "      min_length: 4\n",
            "      min_length: 8\n",
            "      min_length: 4\n",
            "extract.stores.train.min_length",
        ),
    ],
    ids=["top", "section", "nested", "store"],
)
def test_a_key_given_twice_is_an_error(
    tmp_path: Path, first: str, duplicate: str, after: str, key: str
) -> None:
    """At any depth, and whichever section is read: the whole file is refused."""
    path, first_line, second_line = duplicated(tmp_path, first, duplicate, after)
    expected = (
        f"{path}: not valid YAML (line {second_line}: key {key} is given twice, first on line {first_line}; "
        "allowed: each key once per mapping)"
    )
    assert user_error("prepare", path) == expected
    with pytest.raises(UserError) as err:
        load_all(path)
    assert str(err.value) == expected


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_loader_reads_like_safe_load(profile: Path) -> None:
    text = profile.read_text()
    assert yaml.load(text, Loader=UniqueKeyLoader) == yaml.safe_load(text)


def test_merge_keys_may_override(tmp_path: Path) -> None:
    """``<<`` merges are no duplicates: the mapping's own key wins, as with ``yaml.safe_load`` (which DVC
    uses). A merge of a merge reads however the installed PyYAML reads it (6.0.4 differs from 6.0.2)."""
    text = "base: &base {x: 1, y: 2}\nmid: &mid {<<: *base, x: 3}\ntop: {<<: *mid, y: 5}\n"
    assert yaml.load(text, Loader=UniqueKeyLoader) == yaml.safe_load(text)
    assert yaml.load(text, Loader=UniqueKeyLoader)["mid"] == {"x": 3, "y": 2}
    assert yaml.load(text, Loader=UniqueKeyLoader)["top"]["y"] == 5


def test_python_tags_stay_refused(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("prepare: !!python/object/apply:os.system [echo unsafe]\n")
    expected = "not valid YAML (line 1: could not determine a constructor for the tag"
    assert expected in user_error("prepare", path)


# ----------------------------------------------------------------------------------------------------------
# missing sections


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_missing_section_is_an_error(tmp_path: Path, section: str) -> None:
    path = params_file(tmp_path, {section: REMOVE})
    expected = f"{path}: no {section!r} {MISSING}"
    assert user_error(section, path) == expected
    with pytest.raises(UserError) as err:
        load_all(path)
    assert str(err.value) == expected


def test_load_all_reports_the_first_missing_section(tmp_path: Path) -> None:
    path = params_file(tmp_path, {"cluster": REMOVE, "teacher": REMOVE})
    for text, first in [(path.read_text(), "teacher"), ("", "prepare")]:
        path.write_text(text)
        with pytest.raises(UserError) as err:
            load_all(path)
        assert str(err.value) == f"{path}: no {first!r} {MISSING}"


@pytest.mark.parametrize("text", ["prepare: {}\n", "prepare:\n"], ids=["empty", "null"])
def test_an_empty_section_means_all_defaults(tmp_path: Path, text: str) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    assert load_section("prepare", path) == Prepare()


# ----------------------------------------------------------------------------------------------------------
# checkpoints: hub ids only where a stage loads from the hub


def test_pretrain_init_may_be_a_hub_id() -> None:
    """``pretrain.init`` is the one entry for a model from outside the pipeline."""
    assert resolve_outside_checkpoint("org/model", "pretrain.init") == "org/model"


@pytest.mark.parametrize("key", ["teacher.init", "extract.teacher", "evaluate.teacher"])
def test_checkpoints_of_the_pipeline_must_be_local(key: str) -> None:
    """Every other stage reads a folder the pipeline wrote (:func:`resolve_checkpoint`)."""
    with pytest.raises(UserError, match=f"{key} = 'org/model': not a local model folder"):
        resolve_checkpoint("org/model", key, writer="teacher")


# ----------------------------------------------------------------------------------------------------------
# seeds


def nested_sections(annotation: Any) -> Iterator[type[Section]]:
    """The sections inside a field's type: itself, an optional one, a list's items or a dict's values."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        yield annotation
    for arg in get_args(annotation):
        yield from nested_sections(arg)


def seed_fields(model: type[Section], where: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        if "seed" in name:
            yield f"{where}.{name}", field
        for nested in nested_sections(field.annotation):
            yield from seed_fields(nested, f"{where}.{name}")


def test_every_seed_is_a_seed() -> None:
    """Every field named like a seed, in every section, is ``Seed`` (an int in [0, 2³²))."""
    seeds = dict(kv for name, model in SECTIONS.items() for kv in seed_fields(model, name))
    assert set(seeds) == {
        "prepare.split_seed",
        "pretrain.train.seed",
        "teacher.train.seed",
        "extract.seed",
        "project.seed",
        "cluster.seed",
        "evaluate.quality.ensemble_seed",
        "evaluate.quality.bootstrap_seed",
        "par_search.train.seed",
        "student.train.seed",  # refused: student.seeds replaces it
        "student.seeds",  # a list of seeds, one training run each
        "student.instances.seed",  # an SBM student's evaluation graph
    }
    rule = get_args(Seed)[1].metadata
    listed = seeds.pop("student.seeds").annotation
    assert get_origin(listed) is list and get_args(listed)[0] == Seed
    assert all(field.annotation is int and field.metadata == rule for field in seeds.values()), seeds


# ----------------------------------------------------------------------------------------------------------
# as a stage sees them: one line, exit 2, nothing written


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"project.rank": True}, "project.rank = True: Input should be a valid integer, got a boolean"),
        ({"project": REMOVE}, f"no 'project' {MISSING}"),
    ],
    ids=["bool-rank", "no-section"],
)
def test_project_stage_refuses(tmp_path: Path, changes: dict, expected: str) -> None:
    result = run_stage("project", tmp_path, changes)
    line = assert_user_error(result, expected, tmp_path / "artifacts/predictors/projections.safetensors")
    assert line == f"error: {tmp_path / 'params.yaml'}: {expected}"
    assert not (tmp_path / "artifacts").exists()
