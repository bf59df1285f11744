"""Template-level expression audit, as FOCUS reports it: does an edit change the expression?

Each image gets a label, ``SMILE``, ``NEUTRAL`` or ``SERIOUS``, from MediaPipe's blendshapes;
each template's label is the modal label of its variants (ties go to the source's label); a
variant whose label differs from its template's has *drifted*. The drift rate, overall and per
group, goes into ``stats.json`` and the report, and trials can be restricted to consistent
variants.

Thresholds: ``mouthSmile`` (mean of left and right) >= 0.5 is a smile; otherwise
``mouthPress`` >= 0.4 or ``mouthFrown`` >= 0.3 is serious; else neutral. On the bundled photos
smiling faces score 0.61-0.97 on ``mouthSmile`` and unsmiling ones 0.006-0.052; the one
tight-lipped, arms-crossed portrait scores 0.63 on ``mouthPress`` while neutral faces score
0.13-0.15 (smiles raise ``browDown``, so it is not used).

Reference: Dehdashtian et al., "FOCUS" (2025), expression consistency of counterfactual sets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from counterfactory.validation.attrition import wilson_interval

LABELS = ("SMILE", "NEUTRAL", "SERIOUS")
SMILE_MIN = 0.5
PRESS_MIN = 0.4
FROWN_MIN = 0.3


def _pair(shapes: Mapping[str, float], name: str) -> float:
    return (float(shapes.get(f"{name}Left", 0.0)) + float(shapes.get(f"{name}Right", 0.0))) / 2


def expression_label(blendshapes: Mapping[str, float]) -> tuple[str, dict[str, float]]:
    """``(label, scores)`` from MediaPipe's 52 blendshape scores (each in [0, 1]).

    ``scores`` holds ``smile`` (mean ``mouthSmile``), ``press`` and ``frown`` (means of the
    left/right blendshapes), each in [0, 1].
    """
    scores = {
        "smile": _pair(blendshapes, "mouthSmile"),
        "press": _pair(blendshapes, "mouthPress"),
        "frown": _pair(blendshapes, "mouthFrown"),
    }
    if scores["smile"] >= SMILE_MIN:
        return "SMILE", scores
    if scores["press"] >= PRESS_MIN or scores["frown"] >= FROWN_MIN:
        return "SERIOUS", scores
    return "NEUTRAL", scores


def modal_label(labels: Sequence[str], tie_break: str | None = None) -> str:
    """The most common label; a tie goes to ``tie_break`` if tied, else to the order of LABELS."""
    counts = Counter(labels)
    top = max(counts.values())
    tied = [label for label in LABELS if counts.get(label) == top]
    return tie_break if tie_break in tied else tied[0]


def drift_rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Drift rate overall and per condition group, with Wilson 95 % intervals.

    Args:
        rows: ``{"condition": {axis: value}, "expression": {"consistent": bool} | None}``;
            rows without an expression label are not counted.

    Returns:
        ``{"overall": rate, "per_group": [{"axis", "group", **rate}], "labels": {label: n}}``
        where a rate is ``{"n", "drifted", "rate", "ci_low", "ci_high"}``.
    """

    def rate(drifted: int, n: int) -> dict[str, Any]:
        low, high = wilson_interval(drifted, n)
        return {"n": n, "drifted": drifted, "rate": drifted / n if n else None, "ci_low": low, "ci_high": high}

    labelled = [r for r in rows if r.get("expression")]
    groups: dict[tuple[str, str], list[int]] = {}
    for r in labelled:
        drift = not r["expression"]["consistent"]
        for axis, value in r["condition"].items():
            slot = groups.setdefault((axis, str(value)), [0, 0])
            slot[0] += drift
            slot[1] += 1
    return {
        "overall": rate(sum(not r["expression"]["consistent"] for r in labelled), len(labelled)),
        "per_group": [{"axis": a, "group": g, **rate(d, n)} for (a, g), (d, n) in sorted(groups.items())],
        "labels": dict(Counter(r["expression"]["label"] for r in labelled)),
        "thresholds": {"smile_min": SMILE_MIN, "press_min": PRESS_MIN, "frown_min": FROWN_MIN},
    }
