"""The dense control among the students: the teacher's architecture and its own dense α-entmax, trained
further exactly as the students are, so a student's difference from it is the attention's alone (a
student's difference from the teacher also holds the extra training)."""

from __future__ import annotations

from collections.abc import Sequence


def dense_control(students: Sequence[dict]) -> dict | None:
    """The students' row (of ``evaluate.json``) of the dense control, or None when there is none."""
    return next((row for row in students if row.get("attention") == "entmax" and not row.get("par")), None)
