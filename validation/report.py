"""The release report: per-status counts, failures, attrition, and contact sheets.

A contact sheet shows, for one template, the source and then every condition's final
candidate, labelled, as in the FOCUS paper's figure 3. The frame colour is the verdict:
green accepted, amber needs review, red rejected, grey failed (no image); under the verdict,
the gates' reason codes (which gate caught what: ``locality_changed_share_above_max``, ...).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from counterfactory.manifests.release_folder import CONTACT_SHEETS_DIR, REPORT
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, NEEDS_REVIEW, REJECTED
from counterfactory.validation.editor_stats import editors_html
from counterfactory.validation.gates.base import FILLING_VERDICTS, VERDICTS
from counterfactory.validation.gates.locality import FLOOR_RELATIVE
from counterfactory.validation.reasons import docs_anchor, explain
from counterfactory.validation.review_stats import review_html
from counterfactory.validation.target_stats import focus_html, target_html

VERDICT_COLOURS = {
    ACCEPTED: (46, 160, 67),
    NEEDS_REVIEW: (230, 162, 20),
    REJECTED: (207, 34, 46),
    FAILED: (128, 128, 128),
    "source": (40, 40, 40),
}
THUMB_H = 220
LABEL_H = 56
PAD = 8


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the bitmap font
        return ImageFont.load_default()


def _thumb(path: Path | None, height: int) -> Image.Image:
    if path is None or not path.exists():
        tile = Image.new("RGB", (int(height * 0.8), height), (235, 235, 235))
        ImageDraw.Draw(tile).text((10, height // 2 - 8), "no image", fill=(90, 90, 90), font=_font(14))
        return tile
    with Image.open(path) as im:
        im = im.convert("RGB")
        width = max(1, round(im.width * height / im.height))
        return im.resize((width, height), Image.Resampling.LANCZOS)


def _fit(text: str, font: ImageFont.ImageFont, width: int) -> str:
    """``text``, shortened with an ellipsis until it is at most ``width`` pixels wide."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def condition_label(condition: dict[str, str], axes: Sequence[str] = ()) -> str:
    """``"Black · female"``: the condition's values in the design's axis order."""
    order = [a for a in axes if a in condition] + [k for k in condition if k not in axes]
    return " · ".join(str(condition[k]) for k in order)


def contact_sheet(
    release_dir: Path, template_id: str, rows: Sequence[dict[str, Any]], axes: Sequence[str] = ()
) -> Image.Image:
    """One row of tiles: the source, then each cell's final candidate with its label."""
    source_path = release_dir / rows[0]["source"]["path"]
    tiles = [(_thumb(source_path, THUMB_H), f"source: {template_id}", "source", "")]
    for row in rows:
        image = row.get("image")
        path = release_dir / image["path"] if image else None
        codes = ", ".join(dict.fromkeys(str(c).split(":")[0] for c in row.get("reasons") or ()))
        tiles.append((_thumb(path, THUMB_H), condition_label(row["condition"], axes), row["status"], codes))
    width = sum(t[0].width for t in tiles) + PAD * (len(tiles) + 1) + 6 * len(tiles)
    sheet = Image.new("RGB", (width, THUMB_H + LABEL_H + 2 * PAD + 6), "white")
    draw = ImageDraw.Draw(sheet)
    font = _font(14)
    x = PAD
    for tile, label, status, codes in tiles:
        colour = VERDICT_COLOURS.get(status, (0, 0, 0))
        draw.rectangle([x, PAD, x + tile.width + 5, PAD + tile.height + 5], fill=colour)
        sheet.paste(tile, (x + 3, PAD + 3))
        draw.text((x + 3, PAD + THUMB_H + 10), _fit(label, font, tile.width), fill=(20, 20, 20), font=font)
        draw.text((x + 3, PAD + THUMB_H + 26), status.replace("_", " "), fill=colour, font=_font(12))
        if codes:
            draw.text((x + 3, PAD + THUMB_H + 41), _fit(codes, _font(10), tile.width), fill=colour, font=_font(10))
        x += tile.width + 6 + PAD
    return sheet


def contact_sheet_name(template_id: str) -> str:
    """A template's contact sheet's file name under ``contact_sheets/``."""
    return f"{template_id}.jpg"


def contact_sheet_jpeg(
    release_dir: Path, template_id: str, rows: Sequence[dict[str, Any]], axes: Sequence[str] = ()
) -> bytes:
    """A template's contact sheet (:func:`contact_sheet`) as the JPEG bytes a release holds:
    ``publish`` writes these, and ``verify`` derives them again from ``items.jsonl`` and the
    images and compares (an edited sheet shows even when the checksums were regenerated)."""
    import io

    buffer = io.BytesIO()
    contact_sheet(release_dir, template_id, rows, axes).save(buffer, format="JPEG", quality=88)
    return buffer.getvalue()


@dataclass(frozen=True)
class ReportHeader:
    """What ``report.html`` shows of the spec: the release's name and version (as published,
    ``--version`` included), the descriptions, the design and the editors."""

    name: str
    version: str
    description: str
    kind: str
    axes: tuple[str, ...]
    editor_names: tuple[str, ...] | None
    backend: str

    @classmethod
    def of_spec(cls, spec: Any) -> ReportHeader:
        return cls(
            name=spec.release.name,
            version=spec.release.version,
            description=spec.description or spec.release.description,
            kind=spec.design.kind,
            axes=tuple(spec.design.axes),
            editor_names=tuple(e.name for e in spec.editors) if spec.editors is not None else None,
            backend=spec.editor.backend,
        )

    @classmethod
    def of_release(cls, written: Mapping[str, Any], info: Mapping[str, Any]) -> ReportHeader:
        """From a release's ``spec.yaml`` (parsed, as written) and its ``release.json``."""
        from counterfactory.manifests.spec import EditorConfig

        design = written.get("design") or {}
        editors = written.get("editors")
        editor = written.get("editor") or {}
        return cls(
            name=str(info.get("name")),
            version=str(info.get("version")),
            description=str(written.get("description") or info.get("description") or ""),
            kind=str(design.get("kind")),
            axes=tuple(design.get("axes") or ()),
            editor_names=tuple(str(e.get("name")) for e in editors) if isinstance(editors, list) else None,
            backend=str(editor.get("backend") or EditorConfig.model_fields["backend"].default),
        )


def write_report(release_dir: Path, *, spec: Any, items: Sequence[dict[str, Any]], stats: dict[str, Any]) -> Path:
    """Write ``contact_sheets/*.jpg`` and ``report.html`` (:func:`report_html`) into ``release_dir``.

    ``stats`` is passed as ``stats.json`` holds it (read back), so that ``verify`` derives the
    same page from the file.
    """
    by_template: dict[str, list[dict[str, Any]]] = {}
    for row in items:
        by_template.setdefault(row["template_id"], []).append(row)
    sheets_dir = release_dir / CONTACT_SHEETS_DIR
    sheets_dir.mkdir(exist_ok=True)
    for template_id, rows in sorted(by_template.items()):
        (sheets_dir / contact_sheet_name(template_id)).write_bytes(
            contact_sheet_jpeg(release_dir, template_id, rows, list(spec.design.axes))
        )
    path = release_dir / REPORT
    path.write_text(report_html(ReportHeader.of_spec(spec), items, stats), encoding="utf-8")
    return path


def report_html(header: ReportHeader, items: Sequence[Mapping[str, Any]], stats: Mapping[str, Any]) -> str:
    """``report.html``'s text: a function of the spec's header, the items and ``stats.json``
    (``verify`` derives it again and compares)."""
    by_template: dict[str, list[Mapping[str, Any]]] = {}
    for row in items:
        by_template.setdefault(row["template_id"], []).append(row)
    sheet_html = []
    for template_id, rows in sorted(by_template.items()):
        name = contact_sheet_name(template_id)
        filled = sum(r["status"] in FILLING_VERDICTS for r in rows)
        sheet_html.append(
            f"<section><h3>{html.escape(template_id)} <small>{filled}/{len(rows)} cells filled</small></h3>"
            f'<img src="contact_sheets/{html.escape(name)}" alt="contact sheet {html.escape(template_id)}"></section>'
        )
    counts = stats["items"]
    count_cells = "".join(
        f'<td style="color:rgb{VERDICT_COLOURS.get(k, (0, 0, 0))}">{counts.get(k, 0)}</td>' for k in VERDICTS
    )
    failed_rows = (
        "".join(
            f"<tr><td>{html.escape(f['source_id'])}</td><td>{html.escape(Path(f['path']).name)}</td>"
            f"<td>{html.escape(f['reason'])}</td></tr>"
            for f in stats["failed_sources"]
        )
        or '<tr><td colspan="3">none</td></tr>'
    )
    reason_rows = (
        "".join(
            f"<tr><td><code>{html.escape(code)}</code></td><td>{n}</td><td>{html.escape(explain(code) or '')}</td>"
            f"<td><code>{html.escape(docs_anchor(code))}</code></td></tr>"
            for code, n in stats["reasons"].items()
        )
        or '<tr><td colspan="4">none</td></tr>'
    )
    left_out = [r for r in items if r["status"] != ACCEPTED]
    left_rows = (
        "".join(
            f"<tr><td>{html.escape(str(r['template_id']))}</td>"
            f"<td>{html.escape(condition_label(r.get('condition') or {}, header.axes))}</td>"
            f'<td style="color:rgb{VERDICT_COLOURS.get(r["status"], (0, 0, 0))}">{html.escape(r["status"])}</td>'
            f"<td>{html.escape(', '.join(r.get('reasons') or []))}</td></tr>"
            for r in left_out
        )
        or '<tr><td colspan="4">none: every cell of the grid is in the manifest</td></tr>'
    )
    waiting = counts.get(NEEDS_REVIEW, 0)
    next_steps = [
        f"<li><b>{waiting} item(s) wait for people.</b> From the run folder (the one holding "
        "<code>releases/</code>): <code>counterfactory review add-reviewer YOUR_NAME --out RUN_FOLDER</code>, "
        "then <code>counterfactory review serve RUN_FOLDER</code> and sign in at the address it prints; "
        "the next <code>counterfactory publish RUN_FOLDER --version X.Y.Z</code> carries the decisions "
        "(zero editor calls).</li>"
        if waiting
        else "<li>Nothing waits for review.</li>",
        f"<li><b>{len(left_out)} cell(s) are not in the manifest</b>: listed below under "
        '<a href="#left-out">Left out</a> (and in <code>left_out.jsonl</code>), each with its reasons, '
        'explained under <a href="#reasons">Reasons</a>.</li>'
        if left_out
        else "<li>Every cell of the grid is in the manifest.</li>",
        "<li>Check a copy of this release: <code>counterfactory verify RELEASE_FOLDER --expect DIGEST</code>; ask "
        "models its trials and score them: <code>counterfactory ask</code>, <code>counterfactory score</code>.</li>",
    ]
    grid = stats.get("grid", {})
    strata_rows = "".join(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            html.escape(", ".join(f"{k}={v}" for k, v in s["stratum"].items())),
            s["available"],
            s["requested"],
            s["selected"],
        )
        for s in grid.get("strata", [])
    )
    excluded_rows = (
        "".join(
            f"<tr><td>{html.escape(e['source_id'])}</td><td>{html.escape(e['reason'])}</td></tr>"
            for e in grid.get("excluded", [])
        )
        or '<tr><td colspan="2">none</td></tr>'
    )
    completeness = stats.get("completeness", {})
    group_rows = "".join(
        f"<tr><td>{html.escape(g['group'])}</td><td>{g['cells']}</td><td>{g['accepted']}</td>"
        f"<td>{g['undecided']}</td><td>{g['unfilled']}</td></tr>"
        for g in completeness.get("per_group", [])
    )
    expression = stats.get("expression", {})
    floor = stats.get("noise_floor") or {}

    def num(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, (int, float)) else "-"

    floor_keys = (*FLOOR_RELATIVE, "diff_nonface")
    floor_rows = (
        "".join(
            f"<tr><td>{html.escape(tid)}</td>"
            + "".join(f"<td>{num(f['metrics'].get(k))}</td>" for k in floor_keys)
            + f"<td><code>{html.escape(str(f['attempt_id'])[:12])}</code></td></tr>"
            for tid, f in floor.items()
        )
        or f'<tr><td colspan="{len(floor_keys) + 2}">no noise-floor request (limb design, or gates.noise_floor off)</td></tr>'
    )
    floor_head = "".join(f"<th>{k}</th>" for k in floor_keys)
    path_rows = (
        "".join(
            f"<tr><td>{html.escape(str(k))}</td><td>{v}</td></tr>" for k, v in (stats.get("floor_paths") or {}).items()
        )
        or '<tr><td colspan="2">-</td></tr>'
    )

    def drift(rate: dict[str, Any]) -> str:
        if not rate or not rate.get("n"):
            return "no labelled variants"
        return f"{rate['drifted']}/{rate['n']} ({rate['rate']:.0%}, 95 % CI {rate['ci_low']:.0%}-{rate['ci_high']:.0%})"

    drift_rows = "".join(
        f"<tr><td>{html.escape(g['axis'])}={html.escape(g['group'])}</td><td>{drift(g)}</td></tr>"
        for g in expression.get("per_group", [])
    )
    names = header.editor_names
    editors_named = (
        f"editor <code>{html.escape(header.backend)}</code>"
        if names is None
        else "editors " + ", ".join(f"<code>{html.escape(n)}</code>" for n in names) + " (the grid once per editor)"
    )
    audit = stats.get("audit") or {}
    audit_html = ""
    if audit.get("no_source"):
        skipped_rows = (
            "".join(f"<tr><td><code>{html.escape(g)}</code></td><td>{n}</td></tr>" for g, n in audit["skipped"].items())
            or '<tr><td colspan="2">none</td></tr>'
        )
        audit_html = f"""<h2>Gates skipped</h2>
<p id="skipped-why">This set has no source photos (editor.import.no_source), so these gates were not run on
any item: {html.escape(audit["why"])}. Only {html.escape(", ".join(audit["ran"]))} judged the candidates alone
(no registration). Each item lists its <code>skipped_gates</code>; an item that passed the remaining gates is
{html.escape(audit["verdict"])}.</p>
<table id="skipped-gates"><tr><th>gate skipped</th><th>items</th></tr>{skipped_rows}</table>
"""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(header.name)} {html.escape(header.version)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; margin: .5rem 0 1.5rem; }}
td, th {{ border: 1px solid #ccc; padding: .3rem .6rem; text-align: left; }}
section img {{ max-width: 100%; border: 1px solid #ddd; }}
small {{ color: #666; font-weight: normal; }}
</style></head><body>
<h1>{html.escape(header.name)} <small>{html.escape(header.version)}</small></h1>
<p>{html.escape(header.description)}</p>
<p>Design: {html.escape(header.kind)} edits, {editors_named},
spec sha256 <code>{html.escape(stats["spec_hash"][:16])}</code>.</p>
<h2>What next</h2>
<ul id="next">{"".join(next_steps)}</ul>
<h2>Items by status</h2>
<table id="status-counts"><tr><th>accepted</th><th>needs review</th><th>rejected</th><th>failed</th><th>total</th></tr>
<tr>{count_cells}<td>{counts.get("total", 0)}</td></tr></table>
<p>Templates: {stats["templates"]["complete"]} of {stats["templates"]["total"]} complete.</p>
{audit_html}{focus_html(audit.get("focus"))}<h2>Completeness</h2>
<p>{
        "Complete: every cell accepted."
        if completeness.get("complete")
        else "Incomplete: what was left out, and why, is in left_out.jsonl."
    }</p>
<table id="completeness"><tr><th>group</th><th>cells</th><th>accepted</th><th>undecided (needs review)</th>
<th>unfilled (rejected, failed)</th></tr>{group_rows}</table>
{editors_html(stats.get("editors"))}<h2>Editor noise floor</h2>
<p>Per template, the editor's output for "return this photo unchanged", measured like a candidate:
its re-rendering of the photo. The cells' changed share, gain, body-skin change, hair change,
largest area of change and face change (a cell whose face changed no more than here is a copy, sent to review) are judged above these values (each item's <code>floor_*</code> and <code>*_above_floor</code> fields),
and each cell's output is compared with this output itself: its global shift is measured against it, and
pixel by pixel, <code>excess_share</code> is the share away from the edit region that the cell alone changed.</p>
<table id="noise-floor"><tr><th>template</th>{floor_head}<th>attempt</th></tr>{floor_rows}</table>
<h3>What each verdict was judged against</h3>
<p>Items by the floor that judged them (each item's <code>floor_path</code>): <em>request</em>, the editor's output
for "return this photo unchanged" above; <em>cohort</em>, the median of the same source's other outputs (each
output left out of its own), which show the editor's re-rendering of what none of them changed; <em>none</em>,
a lone output judged by limits fitted on re-rendered edits without a floor.</p>
<table id="floor-paths"><tr><th>judged against</th><th>items</th></tr>{path_rows}</table>
<h2>Expression drift</h2>
<p>Variants whose SMILE / NEUTRAL / SERIOUS label differs from their template's modal label:
{drift(expression.get("overall", {}))}.</p>
<table id="expression-drift"><tr><th>group</th><th>drifted</th></tr>{drift_rows}</table>
<h2>Grid</h2>
<p>{grid.get("n_templates", 0)} templates x {grid.get("n_conditions", 0)} conditions = {grid.get("n_cells", 0)} cells
(seed {grid.get("seed")}).</p>
<table id="strata"><tr><th>stratum</th><th>available</th><th>requested</th><th>selected</th></tr>{strata_rows}</table>
<table id="excluded"><tr><th>source left out of the grid</th><th>why</th></tr>{excluded_rows}</table>
<h2>Failed sources</h2>
<table id="failed-sources"><tr><th>source</th><th>file</th><th>reason</th></tr>{failed_rows}</table>
<h2>Reasons (rejected, needs review, failed)</h2>
<table id="reasons"><tr><th>reason</th><th>items</th><th>what it means</th><th>documented at</th></tr>{
        reason_rows
    }</table>
<h2>Left out</h2>
<table id="left-out"><tr><th>template</th><th>condition</th><th>status</th><th>reasons</th></tr>{left_rows}</table>
<h2>Pass rates by group (Wilson 95 % intervals)</h2>
<img src="attrition.png" alt="pass rates by condition group" style="max-width: 100%">
{target_html(stats.get("skin"), stats.get("labels"))}
{review_html(stats.get("review"))}
<h2>Contact sheets</h2>
{"".join(sheet_html)}
</body></html>
"""
    return page
