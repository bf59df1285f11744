"""The release report says what to do next (issue 47): the review commands when items wait for
people, each reason code in one line with where it is documented, the cells left out, and a
skin-tone block that does not read a design's intended lightening as an editor's bias. The score
report explains its blank cells and prints an interval bound of floating-point noise as 0."""

from __future__ import annotations

import re

from counterfactory.validation.reasons import REASONS
from counterfactory.validation.report import ReportHeader, report_html
from counterfactory.validation.scoring.report import BLANK, _fmt

HEADER = ReportHeader("demo", "0.1.0", "a demo", "face", ("race", "gender"), None, "classical")


def _item(template: str, race: str, status: str, reasons: list[str]) -> dict:
    return {
        "template_id": template,
        "condition": {"race": race, "gender": "male"},
        "status": status,
        "reasons": reasons,
    }


ITEMS = [
    _item("astronaut", "Black", "accepted", []),
    _item("astronaut", "White", "needs_review", ["locality_face_unchanged"]),
    _item("grace_hopper", "Black", "rejected", ["align_registration_failed: no keypoint matches"]),
]
STATS = {
    "items": {"accepted": 1, "needs_review": 1, "rejected": 1, "failed": 0, "total": 3},
    "templates": {"complete": 1, "total": 2},
    "failed_sources": [],
    "reasons": {"locality_face_unchanged": 1, "align_registration_failed": 1},
    "spec_hash": "0" * 64,
    "skin": {
        "by_condition": [{"label": "race=White", "n": 2, "median": 8.0, "q25": 4.0, "q75": 12.0}],
        "lightened_by_source_group": [
            {"group": "unknown", "n": 2, "k": 1, "share": 0.5, "ci_low": 0.1, "ci_high": 0.9}
        ],
    },
}


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).replace("&quot;", '"').replace("&#x27;", "'")


def test_the_report_says_what_to_do_next():
    page = report_html(HEADER, ITEMS, STATS)
    text = _text(page)
    # what next, before the counts
    assert page.index('id="next"') < page.index('id="status-counts"')
    assert "1 item(s) wait for people" in text
    assert "counterfactory review add-reviewer YOUR_NAME --out RUN_FOLDER" in text
    assert "counterfactory review serve RUN_FOLDER" in text
    # each reason code explained in one line, and where it is documented
    for code in ("locality_face_unchanged", "align_registration_failed"):
        assert REASONS[code][1] in text and f"docs/gates.md#{code}" in text
    # the left-out cells themselves, not only a pointer to left_out.jsonl
    left = page[page.index('id="left-out"') :]
    assert "needs_review" in left and "rejected" in left and "grace_hopper" in left and "accepted" not in left
    assert "2 cell(s) are not in the manifest" in text


def test_a_release_with_nothing_waiting_says_so():
    items = [_item("astronaut", "Black", "accepted", [])]
    stats = {**STATS, "items": {"accepted": 1, "total": 1}, "reasons": {}}
    text = _text(report_html(HEADER, items, stats))
    assert "Nothing waits for review" in text and "Every cell of the grid is in the manifest" in text


def test_the_skin_block_reads_lightening_against_what_the_conditions_asked():
    text = _text(report_html(HEADER, ITEMS, STATS))
    block = text[text.index("Skin tone") :]
    assert "unknown 50.0 %" in block and "Seo et al. (2026)" in block
    assert "meant to be lighter" in block and "skin_tone_shift" in block and "counted as unknown" in block


def test_score_tables_print_interval_noise_as_zero_and_keep_real_small_values():
    assert _fmt([5.551115123125783e-17, 0.561]) == "[0, 0.561]"
    assert _fmt([-2.7e-17, 1.0]) == "[0, 1]"
    assert _fmt(2.588e-82) == "2.588e-82"  # a p-value
    assert _fmt([0.0012, 0.3]) == "[0.0012, 0.3]"
    assert _fmt(None) == "" and BLANK == "–"


def test_the_report_is_the_same_from_items_jsonl_as_from_the_items_in_memory():
    """verify derives report.html from items.jsonl, whose condition keys are sorted; the run wrote
    it from its items, whose keys are in the design's axis order. The left-out table orders each
    condition by the axes, so the two pages are one (verify refused the demo's release when it did
    not: "male · White" against "White · male")."""
    import json

    read_back = [json.loads(json.dumps(r, sort_keys=True)) for r in ITEMS]
    assert list(read_back[1]["condition"]) == ["gender", "race"]
    assert report_html(HEADER, read_back, STATS) == report_html(HEADER, ITEMS, STATS)
