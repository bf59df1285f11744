"""The dataset card (``README.md``) a release carries on the Hugging Face Hub.

The YAML header is what the Hub parses (``license``, ``pretty_name``, ``task_categories``,
``size_categories``, ``tags``, ``configs`` with their data files and, for gated sets, the
``extra_gated_*`` access form). The body says what the set is, how it was made (editor lineage,
prompts, gates and their thresholds, calibration), the attrition per group with Wilson
intervals, review statistics, known limitations and how to cite it. Everything comes from the
release folder itself, so the card describes exactly the bytes it ships with.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import yaml

from counterfactory.manifests.hub_tables import SPLIT, TableExport
from counterfactory.manifests.licences import PUBLIC_DOMAIN, LicenceDecision, hub_licence_fields
from counterfactory.manifests.trials import PAPERS, protocol_paper
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, NEEDS_REVIEW, REJECTED

#: Axes whose values are protected demographic attributes: a set varying them is gated by default.
SENSITIVE_AXES = frozenset({"race", "ethnicity", "gender", "sex", "age", "skin_tone", "religion", "disability"})
INTENDED_USE = (
    "This dataset holds edited photographs of people that vary {axes}. It is released to measure "
    "and reduce bias in vision and vision-language models. By requesting access you agree to use "
    "it only for that research, not to train or evaluate systems that infer {axes} from "
    "images of people, not to identify or make claims about the people shown, and not to "
    "redistribute the images outside these terms."
)


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket for ``n`` rows."""
    bounds = [
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
    ]
    return next((label for bound, label in bounds if n < bound), "10M<n<100M")


def sensitive_axes(spec: Mapping[str, Any]) -> list[str]:
    """The design's axes that vary a protected attribute. A limb design varies a visible
    disability (a limb difference), so it is gated like a race or gender set."""
    design = spec.get("design") or {}
    axes = design.get("axes") or {}
    found = [axis for axis in axes if axis.lower() in SENSITIVE_AXES]
    if design.get("kind") == "limb" and not found:
        found = ["limb difference"]
    return found


#: Hub task categories the terms allow: generating edits and asking models about images. Never
#: a classification task: the terms forbid systems that infer the varied attributes.
TASK_CATEGORIES = ("image-to-image", "visual-question-answering")
#: what a set made only of public-domain sources is tagged on the Hub: the Public Domain Mark,
#: not CC0 (U.S. government works are public domain by statute, nobody dedicated them under CC0)
PUBLIC_DOMAIN_FIELDS = {
    "license": "other",
    "license_name": "public-domain",
    "license_link": "https://creativecommons.org/publicdomain/mark/1.0/",
}


def card_metadata(
    *,
    release: Mapping[str, Any],
    spec: Mapping[str, Any],
    tables: Sequence[TableExport],
    licence: LicenceDecision,
    gated: bool,
    backends: Sequence[str],
) -> dict[str, Any]:
    """The card's YAML header as a dict (Hub keys, in the Hub's spelling)."""
    kind = (spec.get("design") or {}).get("kind", "face")
    items = next(t for t in tables if t.name == "items")
    has_trials = any(t.name == "trials" and t.rows for t in tables)
    meta: dict[str, Any] = {
        "pretty_name": f"{release['name']} {release['version']}",
        **(PUBLIC_DOMAIN_FIELDS if licence.hub_id == PUBLIC_DOMAIN else hub_licence_fields(licence.hub_id)),
        "task_categories": [c for c in TASK_CATEGORIES if c != "visual-question-answering" or has_trials],
        "size_categories": [size_category(items.rows)],
        "tags": ["counterfactual", "synthetic", "bias-evaluation", "fairness", f"{kind}-edits"]
        + [f"editor-{b}" for b in backends],
        "configs": [
            {
                "config_name": t.name,
                "data_files": [{"split": SPLIT, "path": f"data/{t.name}/{SPLIT}-*.parquet"}],
                **({"default": True} if t.name == "items" else {}),
            }
            for t in tables
        ],
    }
    if gated:
        axes = sensitive_axes(spec) or list((spec.get("design") or {}).get("axes") or {})
        meta |= {
            "extra_gated_heading": f"Request access to {release['name']} {release['version']}",
            "extra_gated_prompt": INTENDED_USE.format(axes=" and ".join(axes) or "people's appearance"),
            "extra_gated_fields": {
                "Name": "text",
                "Affiliation": "text",
                "Intended use": {
                    "type": "select",
                    "options": ["Bias measurement in models", "Bias mitigation research", "Teaching", "Other"],
                },
                "I will use this dataset only for the intended use stated above": "checkbox",
            },
            "extra_gated_button_content": "Agree and request access",
        }
    return meta


def _pct(rate: Mapping[str, Any]) -> str:
    if not rate or rate.get("rate") is None:
        return "n/a"
    return f"{rate['rate']:.0%} [{rate['ci_low']:.0%}, {rate['ci_high']:.0%}] (n={rate['n']})"


def _attrition_section(attrition: Mapping[str, Any]) -> list[str]:
    if not attrition or not attrition.get("groups"):
        return ["No candidates were judged, so there is no attrition to report."]
    gates = [g for g in attrition.get("gates") or [] if g != "overall"]
    header = ["group", "n", "accepted", *gates]
    lines = [
        f"Pass rate per group with {attrition.get('confidence', 0.95):.0%} Wilson score intervals "
        "(E. B. Wilson, JASA 22, 1927). A gate that passes one group far less often than another "
        "changes who is in the set; compare groups before using it.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    all_row = attrition.get("all") or {}
    lines.append(
        "| all | "
        + str((all_row.get("overall") or {}).get("n", ""))
        + " | "
        + " | ".join(_pct(all_row.get(g)) for g in ["overall", *gates])
        + " |"
    )
    for group in attrition["groups"]:
        rates = group.get("gates") or {}
        lines.append(
            f"| {group['label']} | {group['n']} | " + " | ".join(_pct(rates.get(g)) for g in ["overall", *gates]) + " |"
        )
    separated = [d for d in attrition.get("disparity") or [] if d.get("separated")]
    lines.append("")
    if separated:
        lines.append("Groups whose intervals do not overlap (a difference the sample supports):")
        lines += [
            f"- {d['gate']} by {d['axis']}: {d['lowest']} {d['min_rate']:.0%} vs {d['highest']} {d['max_rate']:.0%}"
            for d in separated
        ]
    else:
        lines.append("No gate separates two groups of one axis (every lowest/highest pair of intervals overlaps).")
    return lines


def _share(share: Mapping[str, Any]) -> str:
    if not share or share.get("share") is None:
        return "n/a"
    return f"{share['share']:.0%} [{share['ci_low']:.0%}, {share['ci_high']:.0%}] ({share['k']}/{share['n']})"


def _intended_change_section(stats: Mapping[str, Any]) -> list[str]:
    """Skin-tone shift and perceived-label consistency (``stats["skin"]``, ``stats["labels"]``)."""
    lines: list[str] = []
    skin = stats.get("skin") or {}
    if skin.get("by_condition"):
        lines += [
            "Face skin tone change (ITA°, candidate minus source; Chardon et al. 1991) per condition:",
            "",
            "| condition | n | median | quartiles |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c['label']} | {c['n']} | {c['median']:+.1f} | [{c['q25']:+.1f}, {c['q75']:+.1f}] |"
            for c in skin["by_condition"]
        ]
        lines.append("")
    if skin.get("lightened_by_source_group"):
        lines.append(f"Candidates lightened beyond the gate's tolerance: {_share(skin.get('lightened_all') or {})}")
        lines += [f"- source group {g['group']}: {_share(g)}" for g in skin["lightened_by_source_group"]]
        lines.append("")
    labels = (stats.get("labels") or {}).get("by_condition") or []
    if labels:
        lines += [
            "Perceived label equals the requested one (attribute gate), with coverage:",
            "",
            "| condition | coverage | " + " | ".join(sorted({a for c in labels for a in c["axes"]})) + " | joint |",
        ]
        axes = sorted({a for c in labels for a in c["axes"]})
        lines.append("|" + "---|" * (len(axes) + 3))
        lines += [
            f"| {c['label']} | {_share(c['coverage'])} | "
            + " | ".join(_share(c["axes"].get(a) or {}) for a in axes)
            + f" | {_share(c['joint'])} |"
            for c in labels
        ]
        lines.append("")
    return lines


def _review_section(items: Sequence[Mapping[str, Any]], review: Mapping[str, Any] | None) -> list[str]:
    """Review progress from the items' review records and the release's ``stats["review"]``."""
    statuses = Counter(row.get("status") for row in items)
    records = [row["review"] for row in items if isinstance(row.get("review"), Mapping)]
    outcomes = Counter(
        f"{r.get('state', 'recorded')}" + (f" ({r['outcome']})" if r.get("outcome") else "") for r in records
    )
    lines = [
        f"- items still waiting for a person (`needs_review`): {statuses.get('needs_review', 0)}",
        f"- items with a review record: {len(records)}"
        + (f": {', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}" if outcomes else ""),
    ]
    if not review:
        if statuses.get(NEEDS_REVIEW):
            lines.append(
                "- no review statistics were recorded for this release; `needs_review` items are not in `manifest.jsonl`"
            )
        return lines
    queue = review.get("queue") or {}
    modes = review.get("by_mode") or {}
    lines.append(
        f"- review queue: {queue.get('total', 0)} candidates ({modes.get('queue', 0)} flagged by gates, "
        f"{modes.get('audit', 0)} audit sample): {queue.get('resolved', 0)} decided, {queue.get('disputed', 0)} "
        f"disputed, {queue.get('open', 0)} open; {review.get('decisions', 0)} decisions"
    )
    waiting = (review.get("waiting") or {}).get("by_group") or {}
    if waiting:
        lines.append("- waiting per group: " + ", ".join(f"{k}: {v}" for k, v in waiting.items()))
    agree = review.get("agreement") or {}
    if agree:
        kappa = "n/a" if agree.get("kappa") is None else f"{agree['kappa']:.2f}"
        lines.append(f"- reviewer agreement on {agree.get('pairs', 0)} double-reviewed items: Cohen's kappa {kappa}")
    override = review.get("override") or {}
    for verdict in (ACCEPTED, REJECTED):
        if override.get(verdict):
            lines.append(f"- gate verdict `{verdict}` reversed by people (audit sample): {_pct(override[verdict])}")
    spot = (review.get("spot_the_edit") or {}).get("overall")
    if spot:
        lines.append(
            f"- blinded spot-the-edit: {spot.get('trials', 0)} trials, detection {_pct(spot.get('detection') or {})}, "
            f"localisation {_pct(spot.get('localisation') or {})}"
        )
    return lines


def _thresholds(items: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for row in items:
        for gate, result in (row.get("gates") or {}).items():
            seen.setdefault(gate, {}).update(result.get("thresholds") or {})
    return seen


def _papers(release: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """Keys of :data:`PAPERS` the set follows: its design's paper, then each protocol's."""
    kind = (spec.get("design") or {}).get("kind")
    keys = ["focus"] if kind == "face" else ["inclusivecf"] if kind == "limb" else []
    for protocol in release.get("trials") or {}:
        paper = protocol_paper(protocol)[0]
        if paper and paper not in keys:
            keys.append(paper)
    return keys


def _trials_section(release: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """Each protocol with its unit, its counts per question and its paper, and how the prompt
    bank differs from the papers (``release.json``'s ``trials`` and ``trial_bank``)."""
    trials = release.get("trials") or {}
    if not trials:
        return []
    lines = [
        "## Trials",
        "",
        "`trials` holds one row per query a scoring harness sends (`trial_id` is unique); `images` names "
        "items (or `source:<sha256>` for an original photo) and `image_paths` their files.",
        "",
        "| protocol | rows | unit | per question | paper |",
        "|---|---|---|---|---|",
    ]
    for protocol, entry in trials.items():
        questions = ", ".join(f"{q} {n}" for q, n in sorted((entry.get("questions") or {}).items()))
        paper = entry.get("paper")
        lines.append(
            f"| {protocol} | {entry.get('rows', 0)} | {entry.get('unit', '')} | {questions} | "
            f"{PAPERS.get(paper, '-').split(',')[0] if paper else '-'} |"
        )
    bank = release.get("trial_bank") or {}
    lines.append("")
    if bank:
        lines.append(
            f"Prompt bank: `{bank.get('prompts')}` (sha256 `{str(bank.get('sha256'))[:12]}...`, in `release/inputs/`)."
        )
        differences = bank.get("differences") or []
        if bank.get("follows_papers"):
            lines.append(
                "It uses the papers' groups, options, wordings, counts and control shares; where a paper gives no "
                "prompt text, the bank says so and the wording is counterfactory's."
            )
        elif differences:
            lines += ["", "Deviations of this bank from the papers:", ""]
            lines += [f"- {d}" for d in differences]
        texts = bank.get("paper_text") or {}
        if texts:
            lines += ["", "Where each wording comes from:", ""]
            lines += [f"- `{protocol}`: {text}" for protocol, text in texts.items()]
    lines.append("")
    return lines


def release_caveats(backends: Iterable[str | None], caveat_of: Callable[[str], str | None] | None) -> list[str]:
    """What the editor backends that made a release's items declare it must say first
    (``caveat_of(backend)``: ``release_caveat`` on a backend's options, as the demo ``classical``
    editor's, looked up by the layer that knows the editors); a backend this installation does
    not know declares nothing, and without ``caveat_of`` none does."""
    caveats = []
    for name in sorted(b for b in set(backends) if b):
        caveat = caveat_of(name) if caveat_of is not None else None
        if caveat:
            caveats.append(caveat)
    return caveats


def card_body(
    *,
    release: Mapping[str, Any],
    spec: Mapping[str, Any],
    stats: Mapping[str, Any],
    items: Sequence[Mapping[str, Any]],
    tables: Sequence[TableExport],
    licence: LicenceDecision,
    repo_id: str,
    calibration_rules: Mapping[str, str] | None = None,
    caveat_of: Callable[[str], str | None] | None = None,
) -> str:
    """The card's Markdown body (everything after the YAML header); ``caveat_of(backend)`` is
    what an editor backend declares a release of its edits must say first (:func:`release_caveats`)."""
    name, version = release["name"], release["version"]
    design = spec.get("design") or {}
    axes = design.get("axes") or {}
    counts = stats.get("items") or {}
    lines = [f"# {name} {version}", "", str(release.get("description") or spec.get("description") or "").strip(), ""]

    lines += ["## What this set is", ""]
    lines.append(
        f"Counterfactual image stimuli made with counterfactory: every source photo is edited once per "
        f"condition ({design.get('kind', 'face')} edits over "
        + ", ".join(f"{axis} = {', '.join(map(str, values))}" for axis, values in axes.items())
        + "), aligned back onto the source and judged by automatic gates."
    )
    lines += [
        "",
        f"- cells: {counts.get('total', len(items))} "
        f"(accepted {counts.get(ACCEPTED, 0)}, needs review {counts.get(NEEDS_REVIEW, 0)}, "
        f"rejected {counts.get(REJECTED, 0)}, failed {counts.get(FAILED, 0)})",
        f"- templates (source photos): {(stats.get('templates') or {}).get('total', '?')}, "
        f"sources left out: {len(stats.get('failed_sources') or [])}",
        "",
        "| config | rows | image columns | columns |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{t.name}` | {t.rows} | {', '.join(t.image_columns) or '-'} | {len(t.columns)} |" for t in tables]
    lines += [
        "",
        "`items` has every cell with its final `status` (nothing is dropped): filter on "
        "`status == 'accepted'` for the released stimuli. `source` and `counterfactual` are images; "
        "`condition_*`, `gender_match`, `template_id`, `reasons` and the `gate_*` metrics are columns.",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'items = load_dataset("{repo_id}", "items", split="{SPLIT}", revision="{version}")',
        'accepted = items.filter(lambda row: row["status"] == "accepted")',
        "```",
        "",
        f"The release folder itself (manifest, items, spec, stats, report, images, checksums) is under "
        f"`release/`; `counterfactory release pull {repo_id}@{version} DIR` restores it and "
        "`counterfactory verify DIR` re-hashes every file.",
        "",
    ]

    lines += _trials_section(release, spec)
    lines += ["## How it was made", "", "### Editor", ""]
    lineages = Counter(json.dumps(row["editor"].get("lineage"), sort_keys=True) for row in items if row.get("editor"))
    if lineages:
        for lineage, n in lineages.most_common():
            lines.append(f"- {n} candidates: `{lineage}`")
    else:
        lines.append("- no edit was made")
    prompts = Counter(row["editor"].get("prompt") for row in items if row.get("editor"))
    lines += [
        "",
        f"### Prompts ({len(prompts)} distinct; template `{(spec.get('prompts') or {}).get(design.get('kind', 'face'))}`)",
        "",
    ]
    for prompt, n in prompts.most_common(8):
        lines.append(f"- ({n}x) {prompt}")
    if len(prompts) > 8:
        lines.append(f"- ... and {len(prompts) - 8} more, every one in `items.jsonl` (`editor.prompt`)")
    lines += ["", "### Gates and thresholds", ""]
    thresholds = _thresholds(items)
    if thresholds:
        lines += ["| gate | thresholds |", "|---|---|"]
        for gate, values in sorted(thresholds.items()):
            lines.append(f"| {gate} | " + ", ".join(f"`{k}={v}`" for k, v in sorted(values.items())) + " |")
    else:
        lines.append("No gate ran.")
    lines += [
        "",
        "### Calibration",
        "",
        "Thresholds the spec leaves out come from counterfactory's shipped calibration "
        "(`counterfactory calibrate`), measured on no-op copies and on pairs of different people:",
        "",
    ]
    lines += [f"- `{k}`: {v}" for k, v in sorted((calibration_rules or {}).items())] or ["- (not recorded)"]
    lines += ["", f"Spec hash: `{stats.get('spec_hash', '')}`; the full spec is `release/spec.yaml`.", ""]

    lines += ["## Attrition per group", "", *_attrition_section(stats.get("attrition") or {}), ""]
    intended = _intended_change_section(stats)
    if intended:
        lines += ["## Did the edit do what was asked", "", *intended]
    lines += ["## Review", "", *_review_section(items, stats.get("review")), ""]
    if licence.hub_id == PUBLIC_DOMAIN:
        lines += [
            "## Licence",
            "",
            "Every source photo is in the public domain (for example works of the U.S. federal government, "
            "17 U.S.C. 105), so the set carries no licence conditions: it is marked with the Creative Commons "
            "Public Domain Mark, not released under CC0 (nobody dedicated these works under CC0). Public domain "
            "covers copyright only: the people shown keep their rights of privacy and publicity, and the intended-"
            "use terms of this card still apply.",
            "",
        ]
    else:
        lines += ["## Licence", "", f"Released as `{licence.hub_id}`, the strictest of its sources' licences:", ""]
    lines += [f"- `{hub_id}`: {', '.join(ids)}" for hub_id, ids in sorted(licence.sources_by_licence.items())]
    lines += ["", "## Limitations", ""]
    limitations = [
        "Condition labels name the edit that was asked for, not how people perceive the result; "
        "validate perceived attributes with human raters before drawing conclusions.",
        "Automatic gates catch failed edits (no face, identity drift, expression change, edits "
        "outside the region) but not every artefact; the attrition table shows how unevenly they act.",
        "Editors carry their own biases (for example, lightening skin for some groups); the set inherits them.",
        "The source photos show real, identifiable people; never use them to make claims about them.",
    ]
    backends = {row["editor"].get("backend") for row in items if row.get("editor")}
    limitations[:0] = release_caveats(backends, caveat_of)
    incomplete = (stats.get("templates") or {}).get("incomplete") or []
    if incomplete:
        limitations.append(f"Templates with cells that were not accepted: {', '.join(map(str, incomplete))}.")
    for failed in stats.get("failed_sources") or []:
        limitations.append(f"Source `{failed.get('source_id')}` was left out: {failed.get('reason')}.")
    lines += [f"- {text}" for text in limitations]
    papers = _papers(release, spec)
    if papers:
        lines += ["", "This set follows the designs and protocols of:", ""]
        lines += [f"- {PAPERS[p]}" for p in papers]
    key = "".join(ch if ch.isalnum() else "_" for ch in f"{name}_{version}")
    created = str(release.get("created_at", ""))[:4]
    lines += [
        "",
        "## How to cite",
        "",
        "```bibtex",
        f"@misc{{{key},",
        f"  title = {{{{{name}}}: counterfactual image stimuli, version {version}}},",
        f"  year = {{{created}}},",
        "  howpublished = {\\url{https://huggingface.co/datasets/" + repo_id + "}},",
        f"  note = {{Revision {version}; made with counterfactory}}",
        "}",
        "```",
        "",
    ]
    return "\n".join(lines)


def render_card(metadata: Mapping[str, Any], body: str) -> str:
    """``README.md`` text: the YAML header between ``---`` lines, then the body."""
    header = yaml.safe_dump(dict(metadata), sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{header}---\n\n{body}"
