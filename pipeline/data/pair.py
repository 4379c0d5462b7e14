"""The unit every corpus source produces: one aligned sentence pair with a stable id."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pair:
    """An aligned source/target pair.

    ``split`` is the split the source itself assigns (a hub dataset's own train/validation/test); ``None``
    when the source has no splits and the pair is placed by hashing its id.
    """

    id: str
    src: str
    tgt: str
    split: str | None = None


@dataclass
class SourceRead:
    """What a source reader returns: the kept pairs and how many candidates were dropped, by reason.

    ``dropped_missing``: one side absent (a verse outside the target's versification, a null cell);
    ``dropped_empty``: one side present but empty once cleaned.
    """

    pairs: list[Pair] = field(default_factory=list)
    total: int = 0
    dropped_missing: int = 0
    dropped_empty: int = 0

    @property
    def kept(self) -> int:
        return len(self.pairs)

    def add(self, pair_id: str, src: str | None, tgt: str | None, split: str | None = None) -> None:
        """Count one candidate pair and keep it unless a side is missing or empty."""
        self.total += 1
        if src is None or tgt is None:
            self.dropped_missing += 1
        elif not src or not tgt:
            self.dropped_empty += 1
        else:
            self.pairs.append(Pair(pair_id, src, tgt, split))

    def counts(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return {
            "total": self.total,
            "kept": self.kept,
            "dropped_missing": self.dropped_missing,
            "dropped_empty": self.dropped_empty,
        }
