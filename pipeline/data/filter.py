"""Length filter on tokenised pairs.

Lengths are counted in tokens of the trained tokenizer, as the model sees them (the appended ``</s>``
included), because that is what sequence-length limits and memory depend on; whitespace words would
under-count long compounds and names that split into many pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UserError

REASONS = ("too_short", "too_long", "ratio")


@dataclass(frozen=True)
class LengthFilter:
    """Drop a pair when either side has fewer than ``min_length`` or more than ``max_length`` tokens, or when
    the longer side exceeds ``max_length_ratio`` times the shorter one (``None``: no ratio limit)."""

    min_length: int = 1
    max_length: int = 256
    max_length_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.min_length < 1:
            raise UserError(f"min_length = {self.min_length} must be at least 1")
        if self.max_length < self.min_length:
            raise UserError(f"max_length = {self.max_length} is below min_length = {self.min_length}")
        if self.max_length_ratio is not None and self.max_length_ratio < 1.0:
            raise UserError(
                f"max_length_ratio = {self.max_length_ratio} must be at least 1 (or null for no limit)"
            )

    def reason(self, src_tokens: int, tgt_tokens: int) -> str | None:
        """Why a pair with these token counts is dropped, one of :data:`REASONS`; ``None`` to keep it."""
        shorter, longer = sorted((src_tokens, tgt_tokens))
        if shorter < self.min_length:
            return "too_short"
        if longer > self.max_length:
            return "too_long"
        if self.max_length_ratio is not None and longer > self.max_length_ratio * shorter:
            return "ratio"
        return None
