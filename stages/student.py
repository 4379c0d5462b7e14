"""Stage ``student@NAME``: the teacher fine-tuned with student NAME's sparse attention, distilled from the
teacher (cross-entropy + KL to the teacher's token distributions), once per seed of ``student.seeds``."""

from __future__ import annotations

from transformers import PreTrainedModel

from pipeline.attention import ENTMAX, load_model
from pipeline.checkpoint import describe_parent, loading
from pipeline.checks.student import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.params.student import Student
from pipeline.stage import stage_instance
from pipeline.students.init import build_student, student_callbacks
from pipeline.training.run import data_for_model, train_seeds


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    section, name = stage_instance("student", Student, "instances", argv)
    inputs = check_inputs(section, name)
    params = section.run(name)
    teacher_folder = inputs.teacher
    data, corpus_tokenizer, task = inputs.corpus
    checked = inputs.init(name)
    model, tokenizer = build_student(params.spec, inputs.key(name), seed=params.seeds[0], checked=checked)
    with loading(teacher_folder, "student.teacher"):
        teacher = load_model(teacher_folder, attn_implementation=ENTMAX)
    key = f"student.instances.{name}.init = {params.spec.init!r}"
    data = data_for_model(data, corpus_tokenizer, tokenizer, model, task=task, key=key)
    built = {params.seeds[0]: model}

    def build(seed: int) -> PreTrainedModel:
        """The student before training with ``seed`` (the first seed's is built above)."""
        if seed in built:
            return built.pop(seed)
        return build_student(params.spec, inputs.key(name), seed=seed, checked=checked)[0]

    train_seeds(
        f"student@{name}",
        params,
        build,
        tokenizer,
        data,
        {"init": describe_parent(params.spec.init), "teacher": describe_parent(teacher_folder)},
        seeds=params.seeds,
        teacher=teacher,
        callbacks=lambda: student_callbacks(params),
    )


if __name__ == "__main__":
    main()
