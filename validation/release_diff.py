"""What changed between two versions of one study's release.

Items are matched by ``cell_id`` (template x condition, stable across versions). An item is
*added* or *removed* when its cell is in only one version's ``items.jsonl``, and *changed*
when its image sha256 or its verdict differs. Pass rates (accepted / cells) per condition
group come with Wilson 95 % intervals for both versions; a shift is *separated* when the
intervals do not overlap.

Beyond items, ``differences`` lists what else a scorer would want told, each with its
``kind``: ``trials`` (rows added or removed by ``trial_id``, row counts per protocol),
``threshold`` (a gate threshold, whether or not any verdict flipped), ``prompts`` (the trial
prompt bank), ``input`` (a file the spec names, e.g. the biographies, by content), ``spec``
(``spec.yaml``) and ``version`` (the counterfactory version that sealed it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.release_folder import (
    ITEMS,
    RELEASE_JSON,
    TRIALS,
    NotAReleaseError,
    ReleaseFileError,
    ReleaseFolder,
)
from counterfactory.manifests.vocabulary import ACCEPTED
from counterfactory.validation.attrition import wilson_interval


class DiffError(CounterfactoryError, ValueError):
    """Two folders that cannot be compared; the message says why."""


def _load(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    path = Path(path)
    try:
        folder = ReleaseFolder(path, need=(RELEASE_JSON, ITEMS))
        info, rows = folder.info, list(folder.numbered_rows(ITEMS))
    except NotAReleaseError:
        raise DiffError(f"{path}: not a release folder (needs {RELEASE_JSON} and {ITEMS})") from None
    except ReleaseFileError as exc:
        raise DiffError(f"unreadable release ({exc}); run `counterfactory verify {path}`") from None
    out = {}
    for n, row in rows:
        if not isinstance(row.get("cell_id"), str) or not isinstance(row.get("condition"), dict):
            raise DiffError(
                f"{folder.file(ITEMS)} line {n}: no cell_id or condition; run `counterfactory verify {path}`"
            )
        out[row["cell_id"]] = row
    return info, out


def _rates(items: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for row in items.values():
        cond = row["condition"]
        keys = [f"{k}={v}" for k, v in cond.items()]
        if len(keys) > 1:
            keys.append("|".join(f"{k}={v}" for k, v in cond.items()))
        for key in keys:
            slot = counts.setdefault(key, [0, 0])
            slot[0] += row["status"] == ACCEPTED
            slot[1] += 1
    return {k: (p, n) for k, (p, n) in counts.items()}


def _trials(path: Path) -> dict[str, dict[str, Any]]:
    folder = ReleaseFolder(path, need=())
    if not folder.has(TRIALS):
        return {}
    try:
        return {r["trial_id"]: r for r in folder.trials(images=False)}
    except ReleaseFileError as exc:
        raise DiffError(f"unreadable release ({exc}); run `counterfactory verify {path}`") from None


def _thresholds(items: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """``{"<gate>.<threshold>": sorted distinct values}`` over every item's gate results."""
    seen: dict[str, set[str]] = {}
    for row in items.values():
        for gate, result in (row.get("gates") or {}).items():
            for name, value in ((result or {}).get("thresholds") or {}).items():
                seen.setdefault(f"{gate}.{name}", set()).add(json.dumps(value, sort_keys=True))
    return {k: [json.loads(v) for v in sorted(vs)] for k, vs in sorted(seen.items())}


def _input_digest(relative: str | None) -> str | None:
    """An ``inputs/<sha256>.<ext>`` path's sha256."""
    return Path(relative).name.split(".", 1)[0] if relative else None


def _differences(
    path_a: Path,
    path_b: Path,
    info_a: dict[str, Any],
    info_b: dict[str, Any],
    items_a: dict[str, dict[str, Any]],
    items_b: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(kind: str, what: str, a: Any, b: Any, detail: str) -> None:
        out.append({"kind": kind, "what": what, "a": a, "b": b, "detail": detail})

    trials_a, trials_b = _trials(path_a), _trials(path_b)
    if set(trials_a) != set(trials_b):
        added, removed = len(set(trials_b) - set(trials_a)), len(set(trials_a) - set(trials_b))
        add(
            "trials",
            TRIALS,
            len(trials_a),
            len(trials_b),
            f"trials: {len(trials_a)} -> {len(trials_b)} rows ({added} added, {removed} removed)",
        )
        per_a = Counter(t["protocol"] for t in trials_a.values())
        per_b = Counter(t["protocol"] for t in trials_b.values())
        for protocol in sorted(set(per_a) | set(per_b)):
            if per_a[protocol] != per_b[protocol]:
                add(
                    "trials",
                    f"{TRIALS} protocol {protocol}",
                    per_a[protocol],
                    per_b[protocol],
                    f"trials {protocol}: {per_a[protocol]} -> {per_b[protocol]} rows",
                )
    th_a, th_b = _thresholds(items_a), _thresholds(items_b)
    for key in sorted(set(th_a) | set(th_b)):
        if th_a.get(key) != th_b.get(key):
            a, b = th_a.get(key), th_b.get(key)
            add("threshold", key, a, b, f"threshold {key}: {a} -> {b}")
    bank_a, bank_b = info_a.get("trial_bank") or {}, info_b.get("trial_bank") or {}
    if bank_a.get("sha256") != bank_b.get("sha256"):
        add(
            "prompts",
            "trial_bank",
            bank_a.get("prompts"),
            bank_b.get("prompts"),
            f"trial prompt bank: {bank_a.get('prompts')} ({str(bank_a.get('sha256'))[:12]}) -> "
            f"{bank_b.get('prompts')} ({str(bank_b.get('sha256'))[:12]})",
        )
    inputs_a, inputs_b = info_a.get("inputs") or {}, info_b.get("inputs") or {}
    for name in sorted(set(inputs_a) | set(inputs_b)):
        a, b = _input_digest(inputs_a.get(name)), _input_digest(inputs_b.get(name))
        if a != b:
            add("input", name, a, b, f"input {name}: content {str(a)[:12]} -> {str(b)[:12]}")
    if info_a.get("spec_sha256") != info_b.get("spec_sha256"):
        add("spec", "spec.yaml", info_a.get("spec_sha256"), info_b.get("spec_sha256"), "spec.yaml changed")
    va, vb = info_a.get("counterfactory_version"), info_b.get("counterfactory_version")
    if va != vb:
        add("version", "counterfactory_version", va, vb, f"counterfactory {va} -> {vb}")
    return out


def _image(row: dict[str, Any]) -> str | None:
    return (row.get("image") or {}).get("sha256")


def diff_releases(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare release folders ``a`` (older) and ``b`` (newer) of the same study.

    Returns:
        ``{"a", "b", "added": [cell rows], "removed": [...], "changed": [{"cell_id",
        "template_id", "condition", "image": [a, b], "status": [a, b]}], "pass_rates":
        [{"group", "a": rate, "b": rate, "shift", "separated"}], "differences": [{"kind",
        "what", "a", "b", "detail"}], "changes": [detail, ...], "identical": bool}`` where a
        rate is ``{"n", "passed", "rate", "ci_low", "ci_high"}`` (``None`` when the group is
        absent from that version); it validates against ``schemas/diff.schema.json``.

    Raises:
        DiffError: a folder is not a release, or the two are releases of different studies.
    """
    info_a, items_a = _load(Path(a))
    info_b, items_b = _load(Path(b))
    for key in ("name", "spec_name"):
        if info_a.get(key) != info_b.get(key):
            raise DiffError(
                f"{a} and {b} are releases of different studies ({key} {info_a.get(key)!r} vs "
                f"{info_b.get(key)!r}); diff compares versions of one study's release"
            )

    def brief(row: dict[str, Any]) -> dict[str, Any]:
        return {
            "cell_id": row["cell_id"],
            "template_id": row["template_id"],
            "condition": row["condition"],
            "status": row["status"],
            "image": _image(row),
        }

    added = [brief(items_b[c]) for c in sorted(set(items_b) - set(items_a))]
    removed = [brief(items_a[c]) for c in sorted(set(items_a) - set(items_b))]
    changed = []
    for cell in sorted(set(items_a) & set(items_b)):
        ra, rb = items_a[cell], items_b[cell]
        if _image(ra) != _image(rb) or ra["status"] != rb["status"]:
            changed.append(
                {
                    "cell_id": cell,
                    "template_id": ra["template_id"],
                    "condition": ra["condition"],
                    "image": [_image(ra), _image(rb)],
                    "status": [ra["status"], rb["status"]],
                }
            )
    rates_a, rates_b = _rates(items_a), _rates(items_b)

    def rate(pn: tuple[int, int] | None) -> dict[str, Any] | None:
        if pn is None:
            return None
        p, n = pn
        low, high = wilson_interval(p, n)
        return {"n": n, "passed": p, "rate": p / n if n else None, "ci_low": low, "ci_high": high}

    shifts = []
    for group in sorted(set(rates_a) | set(rates_b)):
        ra, rb = rate(rates_a.get(group)), rate(rates_b.get(group))
        shift = None
        separated = False
        if ra and rb and ra["rate"] is not None and rb["rate"] is not None:
            shift = rb["rate"] - ra["rate"]
            separated = ra["ci_high"] < rb["ci_low"] or rb["ci_high"] < ra["ci_low"]
        if ra != rb:
            shifts.append({"group": group, "a": ra, "b": rb, "shift": shift, "separated": separated})
    differences = _differences(Path(a), Path(b), info_a, info_b, items_a, items_b)
    changes = [d["detail"] for d in differences]
    if added or removed or changed:
        changes.insert(0, f"items: {len(added)} added, {len(removed)} removed, {len(changed)} changed")
    return {
        "a": {"path": str(a), "name": info_a.get("name"), "version": info_a.get("version")},
        "b": {"path": str(b), "name": info_b.get("name"), "version": info_b.get("version")},
        "added": added,
        "removed": removed,
        "changed": changed,
        "pass_rates": shifts,
        "differences": differences,
        "changes": changes,
        "identical": not (added or removed or changed or shifts or differences),
    }
