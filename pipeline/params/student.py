"""The ``student`` section: the teacher fine-tuned with a sparse attention, distilled from the teacher; one
DVC stage (``student@NAME``) per entry of ``instances``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from pipeline.par.pattern import Stack, parse_pattern
from pipeline.params.base import Hidden, Section, Seed, Tokens
from pipeline.params.training import Distillation, Evaluation, Training

# the self-attention kinds a student's attention replaces (cross-attention stays dense)
SelfKinds = Annotated[list[Literal["encoder_self", "decoder_self"]], Field(min_length=1)]


class StudentInstance(Section):
    """What one student starts from (a model folder, loaded with the attention its manifest names) and
    writes; every instance needs its own outputs."""

    init: str
    out: str
    run_dir: str
    metrics: str


class SparsefinderStudent(StudentInstance):
    """Fine-tunes a ``sparsefinder`` folder (the ``configure`` stage's): the teacher restricted to the
    predicted graph, so that it adapts to the recall it actually gets."""

    attention: Literal["sparsefinder"] = "sparsefinder"
    init: str = "artifacts/models/sparsefinder"


class SsaStudent(StudentInstance):
    """Stochastically subsampled self-attention in training; dense (or a self-ensemble) at evaluation."""

    attention: Literal["ssa"] = "ssa"
    init: str = "artifacts/models/teacher"
    mode: Literal["unbiased", "local"] = "local"
    keys: Tokens = 16  # unbiased: keys kept per layer and step
    windows: Tokens = 2  # locally biased: windows per sequence
    # locally biased: the local bias's standard deviation per layer; one value stands for every layer
    sigma: Annotated[list[Annotated[float, Field(gt=0.0)]], Field(min_length=1)] = [4.0]
    kinds: SelfKinds = ["encoder_self", "decoder_self"]
    # "+FT": the last fraction of the steps trains with dense attention
    dense_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


class SbmStudent(StudentInstance):
    """SBM-Transformer: each head samples its attention graph from a learned stochastic block model
    (cluster memberships of queries and keys, a block matrix); straight-through gradients, a density
    regulariser."""

    attention: Literal["sbm"] = "sbm"
    init: str = "artifacts/models/teacher"
    clusters: Hidden = 8  # cluster embeddings per head
    kinds: SelfKinds = ["encoder_self", "decoder_self"]
    density_weight: Annotated[float, Field(ge=0.0)] = 1e-4  # λ: loss + λ · mean sampled density
    # sequences longer than this draw edges with the sub-quadratic sampler (no n × n probability matrix)
    sparse_above: Tokens = 256
    # evaluation graph: "sampled" draws from the model with a fixed seed (the distribution it trained
    # on); "expected" keeps the edges with p ≥ threshold
    evaluation: Literal["sampled", "expected"] = "sampled"
    threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    seed: Seed = 0


class SamsaStudent(StudentInstance):
    """SAMSA: each head attends the k keys of highest learned importance (differentiable top-k) plus 2k
    learned support keys and values; Gumbel noise in training only."""

    attention: Literal["samsa"] = "samsa"
    init: str = "artifacts/models/teacher"
    keys: Tokens = 8  # k: keys of the sequence each head selects
    temperature: Annotated[float, Field(gt=0.0)] = 1.0  # τ of the soft top-k proxy
    kinds: SelfKinds = ["encoder_self", "decoder_self"]


def _pattern_of(stack: Stack) -> AfterValidator:
    def check(text: str) -> str:
        parse_pattern(text, stack, cross=None)  # whether the decoder reads an encoder is the model's
        return text

    return AfterValidator(check)


# PAR patterns as written ('(sff)x2 (f)x2'): s self-attention, f feed-forward, c cross-attention (decoder)
EncoderPattern = Annotated[str, _pattern_of("encoder")]
DecoderPattern = Annotated[str, _pattern_of("decoder")]


class ParStudent(StudentInstance):
    """PAR: the teacher's stacks rebuilt to a pattern of sublayers (``s`` self-attention, ``f``
    feed-forward, ``c`` the decoder's cross-attention), distilled like every student. From the teacher
    with a pattern per stack it has (an encoder–decoder's ``encoder`` and ``decoder``, a decoder-only LM's
    ``decoder``), or from a ``par_search`` folder, which holds its searched patterns (give none)."""

    attention: Literal["par"] = "par"
    init: str = "artifacts/models/par-searched"
    encoder: EncoderPattern | None = None
    decoder: DecoderPattern | None = None

    @model_validator(mode="after")
    def _decoder_with_encoder(self) -> ParStudent:
        if self.encoder is not None and self.decoder is None:
            raise ValueError(
                "give both encoder and decoder patterns (init: an encoder–decoder teacher), the decoder "
                "pattern alone (a decoder-only teacher), or none (init: a par_search folder)"
            )
        if self.encoder is not None:  # an encoder–decoder: its decoder reads the encoder
            try:
                parse_pattern(self.decoder, "decoder", cross=True)
            except ValueError as err:
                raise ValueError(f"decoder = {self.decoder!r}: {err}") from None
        return self


class EntmaxStudent(StudentInstance):
    """The control: the teacher fine-tuned and distilled exactly like the others, with its own dense
    α-entmax, so that a sparse student's gap to it is the cost of its sparsity alone, not of the extra
    training."""

    attention: Literal["entmax"] = "entmax"
    init: str = "artifacts/models/teacher"


StudentSpec = Annotated[
    SparsefinderStudent | SsaStudent | SbmStudent | SamsaStudent | ParStudent | EntmaxStudent,
    Field(discriminator="attention"),
]
# an instance name is a DVC foreach key (student@NAME) and part of file names
STUDENT_NAME = re.compile(r"[a-z][a-z0-9_-]*")


class Student(Section):
    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    distill: Distillation = Distillation()
    train: Training = Training(max_steps=200, lr=2e-4, warmup_steps=20)
    eval: Evaluation = Evaluation()
    # every student is trained once per seed (its added parameters' initial values and the batch order),
    # into out/seed-S; the evaluation reports the mean over seeds with their spread
    seeds: Annotated[list[Seed], Field(min_length=1)] = [0]
    instances: Annotated[dict[str, StudentSpec], Field(min_length=1)] = {
        name: kind(
            out=f"artifacts/students/{name}",
            run_dir=f"artifacts/runs/student-{name}",
            metrics=f"artifacts/metrics/student_{name}.json",
        )
        for name, kind in {
            "sparsefinder": SparsefinderStudent,
            "ssa": SsaStudent,
            "sbm": SbmStudent,
            "samsa": SamsaStudent,
            "par": ParStudent,
            "dense": EntmaxStudent,
        }.items()
    }

    @model_validator(mode="after")
    def _instances(self) -> Student:
        if "seed" in self.train.model_fields_set:
            raise ValueError("train.seed: a student trains once per seed of student.seeds; set those instead")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} lists a seed twice")
        for name in self.instances:
            if not STUDENT_NAME.fullmatch(name):
                raise ValueError(
                    f"student name {name!r}: allowed are lower-case letters, digits, '_' and '-', "
                    "starting with a letter"
                )
        for key in ("out", "run_dir", "metrics"):
            paths = [getattr(spec, key) for spec in self.instances.values()]
            if len(set(paths)) != len(paths):
                raise ValueError(f"two students share one {key} path; every student needs its own")
        return self

    def run(self, name: str) -> StudentRun:
        """Everything student ``name`` trains with, flat like a ``teacher`` section."""
        spec = self.instances[name]
        shared = self.model_dump(exclude={"instances"})
        return StudentRun(
            name=name, spec=spec, out=spec.out, run_dir=spec.run_dir, metrics=spec.metrics, **shared
        )


class StudentRun(Section):
    """One student's settings: the shared ones and its instance (what its run fingerprint covers)."""

    # built from validated values, not YAML
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str
    teacher: str
    data: str
    distill: Distillation
    train: Training
    eval: Evaluation
    seeds: list[Seed]
    spec: StudentSpec
    out: str
    run_dir: str
    metrics: str
