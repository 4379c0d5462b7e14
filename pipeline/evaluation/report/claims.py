"""The section "Claims": each seed paper's headline claim, checked on this corpus and budget as *holds*,
*does not hold* or *not distinguishable*, with what decided it.

- Sparsefinder: the learned predictors' sparsity–recall fronts Pareto-dominate the fixed patterns', and its
  predictors (distance, quantization, k-means) keep near-teacher quality at the teacher's sparsity (their
  decoded point of highest graph recall at sparsity ≥ gold − the margin; the difference from the teacher
  within tolerance). The τ-indexer, this project's, is judged the same way on its own row.
- SSA (+FT): a student with sampled attention is close to the dense model (within tolerance of the dense
  control, or better).
- PAR: fewer attention sublayers, the same perplexity (a PAR student with fewer self-attention sublayers
  within tolerance of the dense control, or better).
- SBM, SAMSA: competitive with dense attention (within tolerance of the dense control, or better).

A claim on quality holds when every judged measure's interval supports it (keeps or better), does not hold
when one interval lies wholly past the tolerance on the worse side, and is not distinguishable otherwise
(an interval that excludes 0 but reaches into the tolerance cannot rule "as good as" out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.evaluation.intervals import HIGHER_IS_BETTER
from pipeline.evaluation.pareto import front_dominates
from pipeline.evaluation.report.points import LEARNED, finite_points, rows_by_method
from pipeline.evaluation.report.verdicts import judge, judged, seeds_text, task_measures
from pipeline.evaluation.table_text import table_row

HOLDS, FAILS, UNDECIDED, UNTESTED = "holds", "does not hold", "not distinguishable", "not tested"


def quality_claim(
    compared: Mapping[str, dict] | None, keys: Sequence[str], tolerances: Mapping[str, float], units: str
) -> tuple[str, str]:
    """(outcome, why) of "as good as the reference" on ``keys`` from a row's differences ``compared``."""
    present = [key for key in keys if compared and key in compared]
    if not present:
        return UNTESTED, "no paired difference was measured"
    found = [judge(compared[key], key, tolerances) for key in present]
    why = "; ".join(judged(compared[key], key, tolerances, units) for key in present)
    if any(beyond(compared[key], key, tolerances) for key in present):
        return FAILS, why
    if all(verdict in ("keeps", "better") for verdict in found):
        return HOLDS, why
    return UNDECIDED, why


def beyond(entry: Mapping[str, Any], key: str, tolerances: Mapping[str, float]) -> bool:
    """Whether the whole interval of a difference lies past the tolerance on the worse side: the data rule
    out "as good as the reference". An interval that excludes 0 but reaches into the tolerance does not."""
    low, high = entry["ci95"]
    return high < -tolerances[key] if HIGHER_IS_BETTER[key] else low > tolerances[key]


def _dominance(evaluation: dict) -> tuple[str, str]:
    points = {
        m: finite_points(r, "sparsity", "recall")[0] for m, r in rows_by_method(evaluation["graphs"]).items()
    }
    learned = [m for m in points if m in LEARNED and points[m]]
    fixed = [m for m in points if m not in LEARNED and points[m]]
    if not learned or not fixed:
        return UNTESTED, "the grid lacks learned or fixed-pattern methods"
    beaten = [b for b in fixed if any(front_dominates(points[a], points[b]) for a in learned)]
    standing = [b for b in fixed if b not in beaten]
    why = f"dominated: {', '.join(beaten) or 'none'}; not dominated: {', '.join(standing) or 'none'}"
    return (HOLDS if not standing else FAILS), why


SPARSEFINDER_METHODS = ("distance", "quantization", "kmeans")
"""The Sparsefinder paper's own predictors (the τ-indexer is this project's, judged on its own row)."""


def _best_point(evaluation: dict, methods: Sequence[str], margin: float) -> dict | None:
    """The decoded point of ``methods`` with the highest graph recall at sparsity ≥ gold − ``margin``."""
    level = evaluation["gold_sparsity"] - margin
    candidates = [
        point
        for point in evaluation["quality"]["points"]
        if point["method"] in methods
        and _decoding_sparsity(point) >= level
        and point.get("evidence")
        and point.get("decoded", True)
    ]
    return max(candidates, key=lambda p: (p["graph_recall"], _decoding_sparsity(p)), default=None)


def _decoding_sparsity(point: dict) -> float:
    """The sparsity of the graphs a point decoded with (its held-out graph's when none was counted)."""
    value = point.get("sparsity")
    return (point.get("graph_sparsity") or 0.0) if value is None else value


def _at_gold(
    evaluation: dict,
    methods: Sequence[str],
    margin: float,
    keys: Sequence[str],
    tolerances: Mapping[str, float],
) -> tuple[str, str]:
    """Whether ``methods``' best decoded point at sparsity ≥ gold − ``margin`` keeps the teacher's quality."""
    level = evaluation["gold_sparsity"] - margin
    point = _best_point(evaluation, methods, margin)
    if point is None:
        decoded = [
            _decoding_sparsity(p)
            for p in evaluation["quality"]["points"]
            if p["method"] in methods and p.get("decoded", True)
        ]
        sparsest = f"; the sparsest decoded one has {max(decoded):.3f}" if decoded else ""
        return UNTESTED, f"no point of {', '.join(methods)} was decoded at sparsity ≥ {level:.3f}{sparsest}"
    units = f"{point['evidence']['sentences']} {evaluation['evidence']['units']}"
    outcome, why = quality_claim(point["evidence"].get("vs_teacher"), keys, tolerances, units)
    where = (
        f"its highest-recall point at decoding sparsity ≥ {level:.3f} (gold − {margin:g}): {point['label']} "
        f"(sparsity {_decoding_sparsity(point):.3f}, graph recall {point['graph_recall']:.3f})"
    )
    return outcome, f"{where}: {why}"


def claims_section(evaluation: dict, tolerances: Mapping[str, float], *, margin: float = 0.1) -> str:
    """The table of claims, each with its outcome and what decided it, and the budget it was tested on."""
    evidence = evaluation["evidence"]
    units = f"{evidence['rows'][0]['sentences']} {evidence['units']}"
    keys = task_measures(evidence["rows"][0])
    claims = [
        ("Sparsefinder", "learned predictors Pareto-dominate the fixed patterns", *_dominance(evaluation))
    ]
    gold = evaluation["gold_sparsity"]
    found = _at_gold(evaluation, SPARSEFINDER_METHODS, margin, keys, tolerances)
    claims.append(("Sparsefinder", f"near-teacher quality at the teacher's sparsity ({gold:.3f})", *found))
    found = _at_gold(evaluation, ("indexer",), margin, keys, tolerances)
    claims.append(("τ-indexer (this project)", f"the teacher's quality at its sparsity ({gold:.3f})", *found))
    students = evaluation.get("students") or []
    for paper, attention, text in (
        ("SSA", "ssa", "a sampled-attention student is as good as dense"),
        ("SBM", "sbm", "competitive with dense attention"),
        ("SAMSA", "samsa", "competitive with dense attention"),
    ):
        for row in (r for r in students if r.get("attention") == attention):
            compared = (row.get("evidence") or {}).get("vs_dense")
            outcome, why = quality_claim(compared, keys, tolerances, units)
            claims.append((paper, f"{text} ({row['student']} vs the dense control)", outcome, why))
    for row in (r for r in students if r.get("par")):
        kept = row["par"].get("attention_fraction", 1.0)
        compared = (row.get("evidence") or {}).get("vs_dense")
        outcome, why = quality_claim(compared, ["perplexity"], tolerances, units)
        if kept >= 1.0:
            outcome, why = FAILS, f"it keeps every attention sublayer ({kept:.2f})"
        text = f"fewer attention sublayers ({kept:.2f} kept), the same perplexity ({row['student']})"
        claims.append(("PAR", text, outcome, why))
    lines = [table_row(["paper", "claim", "on this corpus", "decided by"]), table_row(["---"] * 4)]
    lines += [
        table_row([paper, claim, f"**{outcome}**", why.replace("|", "\\|")])
        for paper, claim, outcome, why in claims
    ]
    decoding = evidence.get("decoding") or {}
    beams = decoding.get("beams")
    how = "" if beams is None else (", greedy decoding" if beams == 1 else f", beam {beams}")
    lines += [
        "",
        f"Tested on {units}{how}, {seeds_text(evidence)}; quality claims are judged by the 95 % "
        "intervals of the Evidence section against the tolerances there.",
    ]
    return "\n".join(lines)
