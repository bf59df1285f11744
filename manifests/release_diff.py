"""What changed between two versions of one study's release.

Items are matched by ``cell_id`` (template x condition, stable across versions). An item is
*added* or *removed* when its cell is in only one version's ``items.jsonl``, and *changed*
when its image sha256 or its verdict differs. Pass rates (accepted / cells) per condition
group come with Wilson 95 % intervals for both versions; a shift is *separated* when the
intervals do not overlap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from counterfactory.manifests.release import ITEMS, RELEASE_JSON, read_jsonl
from counterfactory.validation.attrition import wilson_interval


class DiffError(ValueError):
    """Two folders that cannot be compared; the message says why."""


def _load(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    path = Path(path)
    info_path, items_path = path / RELEASE_JSON, path / ITEMS
    if not info_path.is_file() or not items_path.is_file():
        raise DiffError(f"{path}: not a release folder (needs {RELEASE_JSON} and {ITEMS})")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        rows = read_jsonl(items_path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DiffError(f"{path}: unreadable release ({exc}); run `counterfactory verify {path}`") from None
    return info, {r["cell_id"]: r for r in rows}


def _rates(items: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for row in items.values():
        cond = row["condition"]
        keys = [f"{k}={v}" for k, v in cond.items()]
        if len(keys) > 1:
            keys.append("|".join(f"{k}={v}" for k, v in cond.items()))
        for key in keys:
            slot = counts.setdefault(key, [0, 0])
            slot[0] += row["status"] == "accepted"
            slot[1] += 1
    return {k: (p, n) for k, (p, n) in counts.items()}


def _image(row: dict[str, Any]) -> str | None:
    return (row.get("image") or {}).get("sha256")


def diff_releases(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare release folders ``a`` (older) and ``b`` (newer) of the same study.

    Returns:
        ``{"a", "b", "added": [cell rows], "removed": [...], "changed": [{"cell_id",
        "template_id", "condition", "image": [a, b], "status": [a, b]}], "pass_rates":
        [{"group", "a": rate, "b": rate, "shift", "separated"}], "identical": bool}`` where a
        rate is ``{"n", "passed", "rate", "ci_low", "ci_high"}`` (``None`` when the group is
        absent from that version).

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
    return {
        "a": {"path": str(a), "name": info_a.get("name"), "version": info_a.get("version")},
        "b": {"path": str(b), "name": info_b.get("name"), "version": info_b.get("version")},
        "added": added,
        "removed": removed,
        "changed": changed,
        "pass_rates": shifts,
        "identical": not (added or removed or changed or shifts),
    }
