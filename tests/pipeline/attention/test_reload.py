"""A folder the project writes reloads as the model it was, and no other way of loading it computes a
different model in silence: ``load_model`` rebuilds every attention kind, plain ``from_pretrained``
rebuilds what it can and refuses, in one line naming the right call, what it cannot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianMTModel

from pipeline.attention import ENTMAX, attach_learned_alpha, load_model
from pipeline.attention.implementations import IMPLEMENTATIONS
from pipeline.attention.samsa import SAMSA, attach_samsa
from pipeline.attention.sbm import SBM, attach_sbm
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_sparsefinder
from pipeline.attention.ssa import SSA, attach_ssa
from pipeline.checkpoint import save_checkpoint
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.projection.model import HeadProjections
from tests.pipeline.attention.test_sbm import SPEC as SBM_SPEC
from tests.tiny import padded_batch, teacher_and_student, word_tokenizer

VOCAB, HEADS, HEAD_DIM, RANK, BUCKETS = 40, 4, 4, 3, 3
BOTH = ["encoder_self", "decoder_self"]
ROOT = Path(__file__).resolve().parents[3]
PAR_PATTERNS = {"encoder": "sfff", "decoder": "scffssfcf"}  # more sublayers than the model has layers


def _sparsefinder(model: MarianMTModel) -> None:
    """k-means heads in decoder self-attention: random projections and centroids, all of them state."""
    generator = torch.Generator().manual_seed(1)
    layers = range(2)
    projections = {layer: HeadProjections(HEADS, HEAD_DIM, RANK, generator=generator) for layer in layers}
    centroids = [HEADS, BUCKETS, RANK]
    states = {layer: {"centroids": torch.randn(centroids, generator=generator)} for layer in layers}
    spec = {
        "kind": "decoder_self",
        "predictor": "kmeans",
        "knobs": {},
        "window": 0,
        "global_tokens": 0,
        "projections": projections[0].config(),
        "state_shapes": {"centroids": centroids},
    }
    attach_sparsefinder(model, spec, projections, states)


def _learned_alpha(model: MarianMTModel) -> None:
    attach_learned_alpha(model)
    with torch.no_grad():  # trained-looking: a reload that fell back to the config's α would show
        for name, parameter in model.named_parameters():
            if name.endswith("entmax_alpha.theta"):
                parameter.uniform_(-1.0, 1.0)


def _samsa(model: MarianMTModel) -> None:
    attach_samsa(model, {"keys": 3, "temperature": 1.0, "kinds": BOTH})
    with torch.no_grad():  # trained-looking supports, so a reload that re-initialised them would show
        for name, parameter in model.named_parameters():
            if "samsa.support" in name:
                parameter.normal_()


# kind → (attn_implementation, what gives the model its state; None: no state beyond the config's α)
KINDS = {
    "entmax": (ENTMAX, None),
    "learned alpha": (ENTMAX, _learned_alpha),
    "sparsefinder": (SPARSEFINDER, _sparsefinder),
    "ssa": (SSA, lambda model: attach_ssa(model, {"mode": "unbiased", "keys": 3, "kinds": BOTH})),
    "sbm": (SBM, lambda model: attach_sbm(model, SBM_SPEC)),
    "samsa": (SAMSA, _samsa),
    # PAR: the stacks rebuilt sublayer by sublayer
    "par": (ENTMAX, lambda model: rebuild_from_teacher(model, PAR_PATTERNS, seed=0)),
}
STATEFUL = [kind for kind, (_, attach) in KINDS.items() if attach is not None]


def saved(folder: Path, kind: str) -> MarianMTModel:
    """A tiny Marian of ``kind`` (random weights, heads for the whole of both self-attentions), saved as a
    checkpoint folder; the model, in eval mode."""
    implementation, attach = KINDS[kind]
    _, model = teacher_and_student(vocab=VOCAB, attn_implementation=implementation)
    if attach is not None:
        attach(model)
    save_checkpoint(folder, model, word_tokenizer(VOCAB), {"stage": "test"})
    return model.eval()


def logits(model: MarianMTModel) -> torch.Tensor:
    with torch.no_grad():
        return model(**padded_batch(VOCAB)).logits


@pytest.mark.parametrize("kind", KINDS)
def test_load_model_rebuilds_every_kind_as_it_was_saved(tmp_path, kind):
    model = saved(tmp_path / kind, kind)
    config = json.loads((tmp_path / kind / "config.json").read_text())
    assert config["attn_implementation"] == KINDS[kind][0]
    reloaded = load_model(tmp_path / kind)  # no attn_implementation: the folder's own
    assert reloaded.config._attn_implementation == KINDS[kind][0]
    assert torch.equal(logits(reloaded), logits(model))


def test_plain_from_pretrained_rebuilds_an_entmax_folder(tmp_path):
    model = saved(tmp_path / "entmax", "entmax")
    model.config.entmax_alpha = 1.5
    plain = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "entmax")
    assert plain.config._attn_implementation == ENTMAX
    assert torch.equal(logits(plain), logits(model))
    softmax = logits(load_model(tmp_path / "entmax", attn_implementation="sdpa"))
    assert not torch.allclose(softmax, logits(model), atol=1e-3)  # the fallback the folder used to get


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("kind", STATEFUL)
def test_plain_from_pretrained_of_a_stateful_folder_refuses_to_compute(tmp_path, kind, explicit):
    saved(tmp_path / kind, kind)
    implementation = KINDS[kind][0]
    options = {"attn_implementation": implementation} if explicit else {}
    plain = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / kind, **options)
    assert plain.config._attn_implementation == implementation
    with pytest.raises(RuntimeError) as refused:
        logits(plain)
    message = str(refused.value)
    assert "\n" not in message
    assert "plain from_pretrained leaves it out" in message
    assert "import pipeline.attention.implementations" in message and "load_model(folder)" in message


def test_a_dense_evaluation_of_a_stateful_folder_is_asked_for_by_name(tmp_path):
    model = saved(tmp_path / "ssa", "ssa")
    dense = load_model(tmp_path / "ssa", attn_implementation=ENTMAX)
    assert dense.config._attn_implementation == ENTMAX
    assert torch.equal(logits(dense), logits(model))  # SSA evaluates densely: eval mode draws nothing


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, which has registered only what ``code`` imports."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_without_the_import_transformers_refuses_a_project_folder(tmp_path):
    saved(tmp_path / "entmax", "entmax")
    run = _run(
        "from transformers import AutoModelForSeq2SeqLM\n"
        f"AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / 'entmax')!r})\n"
    )
    assert run.returncode != 0
    assert 'attn_implementation="entmax"` is not supported' in run.stderr


def test_one_import_registers_every_implementation_and_load_model_names_it(tmp_path):
    saved(tmp_path / "sbm", "sbm")
    folder = str(tmp_path / "sbm")
    run = _run(
        "import json\n"
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n"
        "from pipeline.attention import load_model\n"
        "before = set(ALL_ATTENTION_FUNCTIONS.valid_keys())\n"
        "try:\n"
        f"    load_model({folder!r})\n"
        "except Exception as err:\n"
        "    refusal = str(err)\n"
        "import pipeline.attention.implementations\n"
        "after = set(ALL_ATTENTION_FUNCTIONS.valid_keys())\n"
        f"load_model({folder!r})\n"
        "print(json.dumps({'refusal': refusal, 'added': sorted(after - before)}))\n"
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["added"] == sorted(set(IMPLEMENTATIONS) - {ENTMAX})  # entmax: by pipeline.attention
    assert result["refusal"] == (
        f"{folder}: attention 'sbm' is not registered in this process; allowed: the implementations "
        "transformers ships, and this project's after import pipeline.attention.implementations"
    )
