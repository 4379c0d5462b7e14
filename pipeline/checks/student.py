"""The ``student@NAME`` stages' checks: the teacher is the teacher stage's folder, the corpus is prepared,
each student starts from a folder of the stage it needs with the attention it needs, a block corpus was
cut with that folder's tokenizer, and a PAR student's patterns fit its folder's stacks (manifests,
tokenizers and model skeletons only: no weight is read)."""

from __future__ import annotations

from functools import cached_property

from datasets import DatasetDict
from transformers import PreTrainedTokenizerBase

from pipeline.attention import model_skeleton
from pipeline.attention.entmax import ENTMAX
from pipeline.checkpoint import load_auto_tokenizer, loading, resolve_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import TASKS, Task
from pipeline.params.student import ParStudent, Student
from pipeline.students.init import check_student_init, par_patterns
from pipeline.training.run import check_vocabulary, prepared_corpus


class StudentInputs(StageInputs):
    """The inputs of the students ``names`` (every instance by default) and the checks against them."""

    def __init__(self, params: Student, names: list[str] | None = None) -> None:
        self.params = params
        self.names = list(params.instances) if names is None else names
        self._inits: dict[str, str] = {}

    @cached_property
    def teacher(self) -> str:
        """``student.teacher``, checked as a folder the teacher stage wrote."""
        return resolve_checkpoint(self.params.teacher, "student.teacher", writer="teacher")

    @cached_property
    def corpus(self) -> tuple[DatasetDict, PreTrainedTokenizerBase, Task]:
        """(the prepared corpus, the tokenizer it was cut with, its task)."""
        data, tokenizer, card = prepared_corpus(self.params.data, "student.data", tasks=TASKS)
        return data, tokenizer, card.task

    def init(self, name: str) -> str:
        """Student ``name``'s starting folder, checked (:func:`check_student_init`) once."""
        if name not in self._inits:
            self._inits[name] = check_student_init(self.params.instances[name], self.key(name))
        return self._inits[name]

    @staticmethod
    def key(name: str) -> str:
        return f"student.instances.{name}.init"

    def check_vocabulary(self, name: str) -> None:
        """Student ``name``'s folder reads the corpus's blocks with the corpus's own tokenizer."""
        spec, key, init = self.params.instances[name], self.key(name), self.init(name)
        with loading(init, key):
            tokenizer = load_auto_tokenizer(init)
        _, corpus_tokenizer, task = self.corpus
        check_vocabulary(corpus_tokenizer, tokenizer, task=task, key=f"{key} = {spec.init!r}")

    def check_par(self, name: str) -> None:
        """PAR student ``name``'s patterns fit its folder's stacks (its skeleton: no weight is read)."""
        spec, key, init = self.params.instances[name], self.key(name), self.init(name)
        with loading(init, key):
            skeleton = model_skeleton(init, attn_implementation=ENTMAX)
        par_patterns(skeleton, spec, key)

    def checks(self) -> list[InputCheck]:
        teacher, data = {"student.teacher": self.params.teacher}, {"student.data": self.params.data}
        checks = [InputCheck(teacher, lambda: self.teacher), InputCheck(data, lambda: self.corpus)]
        for name in self.names:
            init = {self.key(name): self.params.instances[name].init}
            checks.append(InputCheck(init, lambda name=name: self.init(name)))
            checks.append(InputCheck(init | data, lambda name=name: self.check_vocabulary(name)))
            if isinstance(self.params.instances[name], ParStudent):
                checks.append(InputCheck(init, lambda name=name: self.check_par(name)))
        return checks


def input_checks(params: Student) -> list[InputCheck]:
    return StudentInputs(params).checks()


def check_inputs(params: Student, name: str) -> StudentInputs:
    """Student ``name``'s checks, as its stage runs them."""
    return StudentInputs(params, [name]).check()
