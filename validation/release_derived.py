"""A release's derived files, re-derived from its own tables: what ``verify`` compares.

``publish`` writes ``stats.json``'s counting sections (:func:`derived_stats`) and ``report.html``
(:func:`counterfactory.validation.report.report_html`) with these functions, and ``verify``
(:func:`counterfactory.manifests.release_verify.verify_release`, handed :func:`check_derived` by the
engine, :mod:`counterfactory.flows.engine.verify`) runs them again on the release's
``items.jsonl``, ``left_out.jsonl``, ``stats.json``, ``release.json`` and ``spec.yaml`` and
compares. So an edited count, a row dropped from ``items.jsonl`` or an edited report (a
``<script>`` added) shows even when ``checksums.sha256`` and ``release.json`` were regenerated
to match.

Re-derived: ``stats.json``'s :data:`DERIVED_STATS` sections, its ``release``, ``spec_hash`` and
failed sources (against ``release.json`` and ``left_out.jsonl``), and ``report.html`` whole.
Not re-derivable from the release (facts only the ledger holds): ``grid``, ``review``,
``noise_floor``, ``skin`` (it needs each source's own group from the metadata), ``audit`` and
``cost_usd_total``; ``release.json`` records their file's sha256, and the release's digest
(``verify --expect``) anchors them to a record kept elsewhere.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.release_folder import (
    CONTACT_SHEETS_DIR,
    ITEMS,
    MAX_IMAGE_BYTES,
    REPORT,
    ReleaseFileError,
    ReleaseFolder,
)
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, NEEDS_REVIEW
from counterfactory.validation.attrition import attrition_table, wilson_interval
from counterfactory.validation.editor_stats import editor_stats
from counterfactory.validation.expression_audit import drift_rates
from counterfactory.validation.gates.base import FILLING_VERDICTS, VERDICTS
from counterfactory.validation.report import ReportHeader, contact_sheet_jpeg, contact_sheet_name, report_html
from counterfactory.validation.target_stats import label_consistency

#: the ``stats.json`` sections that are functions of ``items.jsonl`` (and, for ``completeness``,
#: of which sources and strata ``left_out.jsonl`` lists; for ``editors``, of ``noise_floor``)
DERIVED_STATS = ("items", "templates", "reasons", "floor_paths", "attrition", "pass_rates", "completeness", "expression", "labels",
                 "editors")  # fmt: skip


def group_key(condition: Mapping[str, Any]) -> str:
    """``race=Black|gender=female``: a condition in its axes' order."""
    return "|".join(f"{k}={v}" for k, v in condition.items())


def pass_rates(items: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Acceptance per condition group (each axis value, and the full condition), Wilson 95 %."""
    counts: dict[str, list[int]] = {}
    for row in items:
        keys = [f"{k}={v}" for k, v in row["condition"].items()]
        if len(keys) > 1:
            keys.append(group_key(row["condition"]))
        for key in keys:
            slot = counts.setdefault(key, [0, 0])
            slot[0] += row["status"] == ACCEPTED
            slot[1] += 1
    out = {}
    for key, (passed, n) in sorted(counts.items()):
        low, high = wilson_interval(passed, n)
        out[key] = {"n": n, "passed": passed, "rate": passed / n if n else None, "ci_low": low, "ci_high": high}
    return out


def completeness_report(
    rows: Sequence[Mapping[str, Any]], *, failed_sources: bool, short_strata: bool
) -> dict[str, Any]:
    """``stats.json``'s ``completeness``: per condition group the cells, accepted, undecided
    (``needs_review``) and unfilled (``rejected``/``failed``); complete when every cell is
    accepted, no source failed and no stratum is short."""
    per_group: dict[str, Counter] = {}
    for row in rows:
        slot = per_group.setdefault(group_key(row["condition"]), Counter())
        slot["cells"] += 1
        slot[{ACCEPTED: "accepted", NEEDS_REVIEW: "undecided"}.get(row["status"], "unfilled")] += 1
    groups = [
        {
            "group": key,
            "cells": slot["cells"],
            "accepted": slot["accepted"],
            "undecided": slot["undecided"],
            "unfilled": slot["unfilled"],
        }
        for key, slot in per_group.items()
    ]
    complete = bool(groups) and all(g["accepted"] == g["cells"] for g in groups)
    return {"complete": complete and not failed_sources and not short_strata, "per_group": groups}


def floors_by_editor(editor_names: Sequence[str] | None, backend: str, floors: Mapping[str, Any]) -> dict[str, Any]:
    """``stats.json``'s ``noise_floor`` as ``{editor label: {template_id: floor}}``.

    Args:
        editor_names: the labels of a spec's ``editors`` (None: a one-editor spec, whose floors
            are keyed by template and belong to ``backend``).
    """
    if editor_names is None:
        return {backend: dict(floors)}
    out: dict[str, dict[str, Any]] = {}
    for key, floor in floors.items():
        template_id, _, label = key.partition("|editor=")
        out.setdefault(label, {})[template_id.rsplit("|", 1)[0]] = floor
    return out


def derived_stats(
    items: Sequence[Mapping[str, Any]],
    *,
    failed_sources: bool,
    short_strata: bool,
    floors: Mapping[str, Any],
) -> dict[str, Any]:
    """The :data:`DERIVED_STATS` sections of ``stats.json`` from every cell's row.

    Args:
        items: ``items.jsonl`` rows in the release's order, each ``condition`` in its axes' order.
        failed_sources: a source failed (the grid is then incomplete).
        short_strata: a stratum had fewer eligible sources than requested.
        floors: :func:`floors_by_editor` of ``stats.json``'s ``noise_floor``.
    """
    counts = Counter(row["status"] for row in items)
    reasons = Counter(code.split(":")[0] for row in items if row["status"] != ACCEPTED for code in row["reasons"])
    gate_rows = [
        {
            "condition": row["condition"],
            "verdict": row["status"],
            "gates": {name: bool(g.get("passed")) for name, g in (row.get("gates") or {}).items()},
        }
        for row in items
    ]
    templates: dict[tuple[str, Any], bool] = {}
    for row in items:  # one outcome per template and editor, in the release's order
        key = (row["template_id"], row.get("editor_name"))
        templates[key] = templates.get(key, True) and row["status"] in FILLING_VERDICTS
    return {
        "items": {status: counts.get(status, 0) for status in VERDICTS} | {"total": len(items)},
        "templates": {
            "total": len(templates),
            "complete": sum(templates.values()),
            "incomplete": [tid for (tid, _), done in templates.items() if not done],
        },
        "reasons": dict(reasons.most_common()),
        # what each verdict knew of the editor's own re-rendering (validation.judging.floor_path_of)
        "floor_paths": dict(sorted(Counter(row.get("floor_path") or "not measured" for row in items).items())),
        "attrition": attrition_table(gate_rows),
        "pass_rates": pass_rates(items),
        "completeness": completeness_report(items, failed_sources=failed_sources, short_strata=short_strata),
        "expression": drift_rates(items),
        "labels": label_consistency(items),
        "editors": editor_stats(items, floors=floors),
    }


def as_read_back(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` as a release's JSON-lines file gives them back (keys sorted, values as JSON
    holds them), each ``condition`` in the design's axis order: what :func:`derived_stats`
    counts, at publishing and in ``verify`` alike."""
    out = []
    for row in rows:
        row = json.loads(json.dumps(row, sort_keys=True, default=str))
        condition = row.get("condition") or {}
        order = [a for a in axes if a in condition] + [k for k in condition if k not in axes]
        out.append({**row, "condition": {k: condition[k] for k in order}})
    return out


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_bytes().split(b"\n"):
        if line.strip():
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def left_out_cells(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``left_out.jsonl``'s ``cell`` rows for these ``items.jsonl`` rows: every cell not accepted,
    with its status and reasons (as :func:`counterfactory.flows.engine.outcomes.completeness`
    writes them)."""
    return [
        {
            "what": "cell",
            "id": row.get("cell_id"),
            "status": row.get("status"),
            "reason": "; ".join(row.get("reasons") or []) or row.get("status"),
            "group": {"template_id": row.get("template_id"), **(row.get("condition") or {})},
        }
        for row in items
        if row.get("status") != ACCEPTED
    ]


def status_from_review(row: Mapping[str, Any]) -> str | None:
    """The status a row's own review record gives it (None when it records no review): a
    resolved review's outcome, else the gates' verdict it was queued or audited with
    (:func:`counterfactory.manifests.review.apply_reviews`)."""
    review = row.get("review")
    if not isinstance(review, Mapping):
        return None
    return review.get("outcome") if review.get("state") == "resolved" else review.get("gate_verdict")


def check_items_and_left_out(
    items: Sequence[Mapping[str, Any]], left_out: Sequence[Mapping[str, Any]] | None
) -> list[str]:
    """What ``items.jsonl``'s rows say against their own review records and ``left_out.jsonl``:
    each row's status is the one its review record gives, and ``left_out.jsonl`` lists exactly
    the cells ``items.jsonl`` holds unaccepted. A row dropped from ``items.jsonl`` (with its
    image, and ``stats.json`` and ``report.html`` re-derived to match) or a status edited shows."""
    problems = []
    for n, row in enumerate(items, start=1):
        expected = status_from_review(row)
        if expected is not None and row.get("status") != expected:
            problems.append(
                f"items.jsonl row {n} ({row.get('cell_id')}): status is {row.get('status')!r}, but its review "
                f"record gives {expected!r} (edited after sealing?)"
            )
    if left_out is None:
        return problems  # a release without left_out.jsonl (a published one is told it lacks it)
    key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
    held = {key(r): r for r in left_out if r.get("what") == "cell"}
    derived = {key(r): r for r in json.loads(json.dumps(left_out_cells(items), default=str))}
    for k in sorted(set(held) - set(derived))[:10]:
        problems.append(
            f"left_out.jsonl: cell {held[k].get('id')} ({held[k].get('status')}) is not an unaccepted row of "
            "items.jsonl as it is (a row dropped from items.jsonl, or either file edited, after sealing)"
        )
    for k in sorted(set(derived) - set(held))[:10]:
        problems.append(
            f"items.jsonl: cell {derived[k].get('id')} ({derived[k].get('status')}) is missing from left_out.jsonl "
            "as it is (a row dropped from left_out.jsonl, or either file edited, after sealing)"
        )
    return problems


def check_derived(release: str | Path, info: Mapping[str, Any], written: Mapping[str, Any]) -> list[str]:
    """What ``stats.json`` and ``report.html`` say that their release's tables do not; returns
    the problems (empty = both are what this package derives from the tables).

    Args:
        release: the release folder.
        info: its ``release.json``.
        written: its ``spec.yaml``, parsed.
    """
    release = Path(release)
    stats_file, items_file, left_out_file = (release / n for n in ("stats.json", "items.jsonl", "left_out.jsonl"))
    if not (stats_file.is_file() and items_file.is_file()):
        return []
    try:
        stats = json.loads(stats_file.read_text(encoding="utf-8"))
        items = _rows(items_file)
        left_out = _rows(left_out_file) if left_out_file.is_file() else []
    except (UnicodeDecodeError, ValueError):
        return []  # the schema check reports a file that is not JSON
    if not isinstance(stats, dict):
        return []
    header = ReportHeader.of_release(written, info)
    ordered = as_read_back(items, header.axes)
    problems: list[str] = []
    made_by = info.get("counterfactory_version")
    from counterfactory import __version__

    other = f" (or written by counterfactory {made_by}; this is {__version__})" if made_by != __version__ else ""
    try:
        derived = derived_stats(
            ordered,
            failed_sources=any(r.get("what") == "source" and r.get("status") == FAILED for r in left_out),
            short_strata=any(r.get("what") == "stratum" for r in left_out),
            floors=floors_by_editor(header.editor_names, header.backend, stats.get("noise_floor") or {}),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return [
            f"items.jsonl: its rows cannot be counted ({type(exc).__name__}: {str(exc)[:120]}); see the schema check"
        ]
    for key, value in derived.items():
        if json.loads(json.dumps(value, default=str)) != stats.get(key):
            detail = ""
            if key == "items" and isinstance(stats.get("items"), dict):
                detail = "; ".join(
                    f"{status} is {stats['items'].get(status)}, items.jsonl has {n}"
                    for status, n in value.items()
                    if stats["items"].get(status) != n
                )
                detail = f" ({detail})" if detail else ""
            problems.append(
                f"stats.json: {key} is not what items.jsonl gives{detail}; edited after sealing{other}? "
                "Re-publish the release from its run folder"
            )
    for key, expected in (("release", {"name": info.get("name"), "version": info.get("version")}),
                          ("spec_hash", info.get("spec_hash"))):  # fmt: skip
        if stats.get(key) != expected:
            problems.append(f"stats.json: {key} is {stats.get(key)!r}, but release.json says {expected!r}")
    problems += check_items_and_left_out(items, left_out if left_out_file.is_file() else None)
    failed = [(f.get("source_id"), f.get("reason")) for f in stats.get("failed_sources") or [] if isinstance(f, dict)]
    listed = [
        (r.get("id"), r.get("reason")) for r in left_out if r.get("what") == "source" and r.get("status") == FAILED
    ]
    if failed != listed:
        problems.append("stats.json: failed_sources are not the failed sources left_out.jsonl lists")
    problems += check_contact_sheets(release, items, header.axes, published=made_by is not None, other=other)
    report = release / REPORT
    if report.is_file():
        expected_html = report_html(header, items, stats)
        if report.read_bytes() != expected_html.encode("utf-8"):
            problems.append(
                "report.html: not the report this package derives from items.jsonl, stats.json and spec.yaml "
                f"(edited, or a script added, after sealing{other}); re-publish the release from its run folder"
            )
    return problems


def check_contact_sheets(
    release: Path, items: Sequence[Mapping[str, Any]], axes: Sequence[str], *, published: bool, other: str = ""
) -> list[str]:
    """Each template's contact sheet is the JPEG this package derives from ``items.jsonl`` and
    the release's images (:func:`~counterfactory.validation.report.contact_sheet_jpeg`, the
    function ``publish`` writes them with): an edited sheet shows even when ``checksums.sha256``
    and ``release.json`` were regenerated to match. A published release (``published``) holds
    one per template; the images a row names are read through the release's confined reader
    (:class:`~counterfactory.manifests.release_folder.ReleaseFolder`) before any is decoded."""
    folder = ReleaseFolder(release, need=())
    sheets = release / CONTACT_SHEETS_DIR
    if not published and not sheets.is_dir():
        return []
    by_template: dict[str, list[dict[str, Any]]] = {}
    for row in items:
        if isinstance(row.get("template_id"), str):
            by_template.setdefault(row["template_id"], []).append(dict(row))
    problems = []
    for template_id, rows in sorted(by_template.items()):
        relative = f"{CONTACT_SHEETS_DIR}/{contact_sheet_name(template_id)}"
        if not folder.has(relative):
            problems.append(f"{relative}: missing; a release holds one contact sheet per template of {ITEMS}")
            continue
        try:
            for row in rows:
                for what in ("source", "image"):
                    ref = row.get(what)
                    if isinstance(ref, Mapping):
                        folder.image(ref.get("path"), f"{ITEMS} cell {row.get('cell_id')} ({what})")
            expected = contact_sheet_jpeg(release, template_id, rows, list(axes))
            held = folder.read_bytes(relative, MAX_IMAGE_BYTES)
        except ReleaseFileError as exc:
            problems.append(f"{relative}: cannot be re-derived: {exc}")
            continue
        except (KeyError, TypeError, AttributeError, ValueError, OSError) as exc:
            problems.append(f"{relative}: cannot be re-derived from {ITEMS} ({type(exc).__name__}); see the row checks")
            continue
        if held != expected:
            problems.append(
                f"{relative}: not the contact sheet this package derives from {ITEMS} and the images (edited after "
                f"sealing{other}, or drawn by another Pillow version); re-publish the release from its run folder"
            )
    return problems
