"""A release's statistics and audits: ``stats.json``'s counts, the noise floors, the gate audit
and the expression audit (faces detected again on the released images). Plain functions, no Prefect.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from counterfactory.flows.engine.execute import judge_key
from counterfactory.flows.engine.run_folder import Workspace
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.editors import make_editor
from counterfactory.generation.editors.base import hooks_of
from counterfactory.generation.sampling import Grid, grid_summary
from counterfactory.generation.sources import (
    FailedSource,
    PreparedSource,
    load_image,
)
from counterfactory.manifests.release import (
    ReleaseStage,
)
from counterfactory.validation.expression_audit import expression_label, modal_label
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.judging import (
    FLOOR_VERDICT,
    SKIPPED_WHY,
    SOURCE_FREE_GATES,
    SOURCE_GATES_SKIPPED,
    no_source_mode,
)
from counterfactory.validation.release_derived import as_read_back, derived_stats, floors_by_editor
from counterfactory.validation.target_stats import (
    focus_comparison,
)


def audit_stats(
    spec: Spec, items: Sequence[dict[str, Any]], manifest: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """stats.json ``audit`` of an imported set (a backend whose options declare
    ``audits_imported_set``, as the ``import`` backend's do; None for every other spec): ``focus``, the set's QC figures beside FOCUS's published ones
    (:func:`~counterfactory.validation.target_stats.focus_comparison`); and for a set judged
    without source photos ``skipped`` (gate -> items it was not run on), why, and whether a pass
    of the remaining gates is accepted."""
    if not hooks_of(spec.editor.options()).audits_imported_set:
        return None
    audit: dict[str, Any] = {"focus": focus_comparison(items, manifest)}
    accept = no_source_mode(spec)
    if accept is None:
        return audit
    skipped: Counter[str] = Counter()
    for item in items:
        skipped.update(item.get("skipped_gates") or [])
    return {
        **audit,
        "no_source": True,
        "skipped": dict(sorted(skipped.items())),
        "why": SKIPPED_WHY,
        "ran": list(SOURCE_FREE_GATES),
        "verdict": "accepted on the remaining gates"
        if accept
        else f"needs_review ({SOURCE_GATES_SKIPPED}) when the remaining gates pass",
    }


def audit_expressions(
    spec: Spec, items: list[dict[str, Any]], prepared: Sequence[PreparedSource], stage: ReleaseStage
) -> None:
    """Label every imaged face item SMILE/NEUTRAL/SERIOUS and mark drift from its template's
    modal label (in place, ``row["expression"]``). Limb designs are not audited."""
    if spec.design.kind != "face":
        return

    landmarker = get_face_landmarker()
    by_id = {p.id: p for p in prepared}
    by_template: dict[str, list[tuple[dict[str, Any], str, dict[str, float]]]] = {}
    for row in items:
        if row["image"] is None:
            continue
        faces = landmarker.detect(load_image(stage.dir / row["image"]["path"]).pixels)
        if not faces:
            continue
        label, scores = expression_label(faces[0].blendshapes)
        by_template.setdefault(row["template_id"], []).append((row, label, scores))
    for template_id, labelled in by_template.items():
        source_faces = landmarker.detect(by_id[template_id].source.pixels)
        source_label = expression_label(source_faces[0].blendshapes)[0] if source_faces else None
        template_label = modal_label([label for _, label, _ in labelled], tie_break=source_label)
        for row, label, scores in labelled:
            row["expression"] = {
                "label": label,
                "template_label": template_label,
                "consistent": label == template_label,
                "smile": round(scores["smile"], 4),
                "frown": round(scores["frown"], 4),
            }


def noise_floor_stats(spec: Spec, ws: Workspace, prepared: Sequence[PreparedSource], grid: Grid) -> dict[str, Any]:
    """Per template (and editor), what the editor's noise-floor request measured (``{template_id:
    {attempt_id, image_sha256, reasons, metrics}}``; with ``editors`` the keys are the floors' cell
    ids, ``<template>|floor|editor=<label>``), judged with this spec's settings; empty when the spec
    judges without a floor. The floor's own reasons are what a copy earns (face unchanged).

    Each floor is found by the attempt id the run planned for it
    (:func:`~counterfactory.flows.engine.template.plan_noise_floor`), so a floor an earlier spec made with
    the same editor (its candidate recorded under that spec's cell id) is found too, and one made
    by another editor configuration is not.
    """
    from counterfactory.flows.engine.execute import uses_noise_floor
    from counterfactory.flows.engine.template import plan_noise_floor
    from counterfactory.validation.gates.locality import FLOOR_RELATIVE

    if not uses_noise_floor(spec):
        return {}
    jkey = judge_key(spec)
    planned: dict[str, str] = {}  # attempt id -> the floor's key in stats
    templates = {t.source_id for t in grid.templates}
    prepared = [p for p in prepared if p.id in templates]
    for view in spec.editor_views():
        editor = make_editor(view.editor.backend, view.editor.options())
        lineage = editor.lineage()
        for p in prepared:
            plan = plan_noise_floor(view, p, editor, lineage)
            planned[plan.attempt_id] = plan.cell.cell_id if spec.editors is not None else p.id
    out: dict[str, Any] = {}
    for aid, c in ws.ledger.candidates_by_id(list(planned)).items():
        if c.judge_key != jkey or c.verdict != FLOOR_VERDICT:
            continue
        m = (c.gates.get("locality") or {}).get("metrics") or {}
        keys = (*FLOOR_RELATIVE, "diff_face", "diff_nonface", "nonface_change")
        out[planned[aid]] = {
            "attempt_id": c.attempt_id,
            "image_sha256": c.image_sha256,
            "reasons": list(c.reasons),
            "metrics": {k: m.get(k) for k in keys if k in m},
        }
    return dict(sorted(out.items()))


def build_stats(
    spec: Spec,
    items: Sequence[dict[str, Any]],
    failed: Sequence[FailedSource],
    grid: Grid,
    *,
    total_cost_usd: float,
    floors: dict[str, Any],
) -> dict[str, Any]:
    """``stats.json`` but its ``review``, ``skin`` and ``audit``: the sections ``verify``
    re-derives from ``items.jsonl`` (:func:`~counterfactory.validation.release_derived.derived_stats`)
    and the ledger's facts (failed sources, grid, cost, noise floors ``floors``). What the run
    that sealed it spent (its editor calls) is not in it: a release is a function of its inputs,
    and the run's own summary prints that count."""
    names = [e.name for e in spec.editors] if spec.editors is not None else None
    return {
        "release": {"name": spec.release.name, "version": spec.release.version},
        "spec_hash": spec.spec_hash(),
        "failed_sources": [{"source_id": f.id, "path": f.path.name, "reason": f.reason} for f in failed],
        "grid": grid_summary(grid),
        "cost_usd_total": round(total_cost_usd, 4),
        "noise_floor": floors,
        **derived_stats(
            as_read_back(items, list(spec.design.axes)),
            failed_sources=bool(failed),
            short_strata=bool(grid.shortfalls),
            floors=floors_by_editor(names, spec.editor.backend, floors),
        ),
    }


def _own_group(spec: Spec, meta: dict[str, Any]) -> str | None:
    """The source's own race as its metadata records it (the skin gate's ``source_fields``
    say which field), for the lightened-share-per-source-group table; None if unrecorded."""
    skin = spec.gates.for_kind(spec.design.kind).skin
    field = (skin.source_fields if skin is not None else {}).get("race", "race")
    value = meta.get(field)
    if value is None:
        value = (meta.get("extra") or {}).get(field)
    return None if value is None else str(value)
