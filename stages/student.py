"""Stage ``student@NAME``: the teacher fine-tuned with student NAME's sparse attention, distilled from the
teacher (cross-entropy + KL to the teacher's token distributions)."""

from __future__ import annotations

from pipeline.attention import load_model
from pipeline.checkpoint import describe_parent, loading, resolve_checkpoint
from pipeline.corpus_card import TASKS, read_corpus_card
from pipeline.errors import exits_cleanly
from pipeline.stage import stage_instance
from pipeline.students.init import build_student, student_callbacks
from pipeline.training.run import data_for_model, load_corpus, train_and_evaluate


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    section, name = stage_instance("student", "instances", argv)
    params = section.run(name)
    teacher_folder = resolve_checkpoint(params.teacher, "student.teacher", writer="teacher")
    data, corpus_tokenizer = load_corpus(params.data, "student.data", tasks=TASKS)
    model, tokenizer = build_student(params.spec, f"student.instances.{name}.init", seed=params.train.seed)
    with loading(teacher_folder, "student.teacher"):
        teacher = load_model(teacher_folder)
    task = read_corpus_card(params.data, "student.data").task
    key = f"student.instances.{name}.init = {params.spec.init!r}"
    data = data_for_model(data, corpus_tokenizer, tokenizer, model, task=task, key=key)
    train_and_evaluate(
        f"student@{name}",
        params,
        model,
        tokenizer,
        data,
        {"init": describe_parent(params.spec.init), "teacher": describe_parent(teacher_folder)},
        teacher=teacher,
        callbacks=student_callbacks(params),
    )


if __name__ == "__main__":
    main()
