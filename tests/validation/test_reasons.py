"""Every reason code the aligner, the judge and the built-in gates can write is explained in one
line (validation/reasons.py), and nothing is explained that no code writes."""

from __future__ import annotations

import re

from counterfactory.validation.gates.rules import rule_rows
from counterfactory.validation.gates.tables import RULE_TABLES, docs_section
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


def test_every_reason_a_rule_table_can_give_is_explained_and_its_own_gates():
    given = {rule.reason for rules in RULE_TABLES.values() for rule in rules}
    assert len(given) > 30
    assert given - set(REASONS) == set(), "explain these in validation/reasons.py"
    for gate, rules in RULE_TABLES.items():
        for rule in rules:
            assert rule.reason.startswith(gate + "_"), (gate, rule.reason)
            assert REASONS[rule.reason][0] == gate, rule.reason


def test_the_docs_print_every_rule_of_every_table_as_the_code_declares_it():
    page = (REPO / "docs" / "gates.md").read_text()
    assert docs_section() in page, "run: python -m counterfactory.validation.gates.tables"
    for gate, rules in RULE_TABLES.items():
        section = page.split(f"### {gate}\n", 1)[1].split("\n\n", 1)[0]
        printed = [line for line in section.splitlines() if line.startswith("| `")]
        assert len(printed) == len(rules), gate
        for line, row in zip(printed, rule_rows(rules), strict=True):
            cells = [c.strip().strip("`") for c in line.strip("|").split(" | ")]
            assert cells == [row[k] for k in ("metric", "comparison", "threshold", "reason", "outcome", "applies")]
