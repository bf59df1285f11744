"""Every reason code the aligner, the judge and the built-in gates can write is explained in one
line (validation/reasons.py), and nothing is explained that no code writes."""

from __future__ import annotations

import re

from counterfactory.validation.reasons import REASONS, code_of, docs_anchor, explain
from tests.conftest import REPO

SOURCES = [
    *sorted((REPO / "validation" / "gates").glob("*.py")),
    REPO / "validation" / "judging.py",
    REPO / "flows" / "engine" / "judge.py",  # TemplateJudge: an attempt the editor failed, refused or never ran
    REPO / "generation" / "align.py",
]
# a code is a string literal of a gate's prefix ending the way a reason does (metric names such as
# "face_box" or "skin_tone" are not reasons)
CODE = re.compile(r"""["']((?:align|attribute|editor|expression|face|identity|import|locality|skin)_[a-z_]+)\b""")
ENDINGS = (
    "above_max", "below_min", "mismatch", "failed", "no_face", "not_finite", "unchanged", "unavailable",
    "unmapped", "low_confidence", "blank", "no_mask", "not_run", "skipped", "invalid", "malformed", "refused",
    "unanswered", "tone_shift", "out_of_bounds", "below_band", "above_band", "against_direction",
    "bad_candidate", "no_edit_mask", "no_face_mask", "accessory_changed",
)  # fmt: skip


def _written() -> set[str]:
    codes = set()
    for path in SOURCES:
        codes |= {c for c in CODE.findall(path.read_text()) if c.endswith(ENDINGS)}
    # expression.py writes f"expression_{key.removesuffix('_iod')}_above_max" for these keys
    text = (REPO / "validation" / "gates" / "expression.py").read_text()
    block = re.search(r"for key, bound in \((.*?)\):\n", text, re.S).group(1)
    for key in re.findall(r'\("([a-z_]+_iod)"', block):
        codes.add(f"expression_{key.removesuffix('_iod')}_above_max")
    return codes


def test_every_code_written_is_explained_and_every_explained_code_is_written():
    written = _written()
    assert len(written) > 50
    assert written - set(REASONS) == set(), "explain these in validation/reasons.py"
    assert set(REASONS) - written == {"review_rejected"}, "no code writes these"


def test_a_reason_with_its_detail_is_explained_by_its_code():
    reason = "align_registration_failed: no keypoint matches and ECC did not converge"
    assert code_of(reason) == "align_registration_failed"
    assert explain(reason) == REASONS["align_registration_failed"][1]
    assert docs_anchor("review_rejected: artifact") == "docs/gates.md#review_rejected"
    assert explain("mine_plugin_reason") is None
