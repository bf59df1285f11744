"""The pilot loop's pieces for its test and its benchmark (``benchmarks/pilot_from_review.py``):
a study of London people edited by the faulty editor (:mod:`tests.flows.faulty_editor`), and
simulated reviewers voting through the review site's HTTP API.

A simulated reviewer reads each item's truth from the ledger (the faulty editor's
``meta["faulty_class"]``: ``good`` is accepted, any failure rejected with the reason a person
would give) and errs with probability ``error_rate``, drawn from a generator seeded by its name
and the item, so a run of the loop votes the same way every time.
"""

from __future__ import annotations

import csv
import hashlib
import re
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import yaml

import tests.flows.faulty_editor  # noqa: F401 - importing it registers the faulty editor
from counterfactory.manifests.ledger import Ledger

LONDON = Path("/work/shared/photos/london")

#: the reject reason a person gives for each failure class
REASON_OF_CLASS = {
    "expression": "expression_drift",
    "expression_real": "expression_drift",
    "identity_swap": "identity_drift",
    "noop_copy": "other",
    "object_added": "artifact",
    "text_added": "artifact",
    "object_removed": "artifact",
    "body_skin": "off_mask_change",
    "global_colour": "off_mask_change",
    "head_pose": "face_deformation",
    "head_position": "face_deformation",
    "hair": "off_mask_change",
}


def london_people(london: Path = LONDON) -> list[dict[str, str]]:
    with open(london / "london_info.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if (london / "neutral" / f"{row['face_id']}.jpg").is_file()]


def london_study(
    folder: Path, n_sources: int, n_donors: int = 6, side: int = 320, london: Path = LONDON
) -> tuple[Path, list[Path]]:
    """London people scaled to ``side`` px: the first ``n_sources`` (alternating groups) as the
    study's photos with their metadata, the next ``n_donors`` as the editor's donors (other
    people). The metadata states no race, so no cell is a same-group control. Returns
    ``(metadata file, donor paths)``."""
    people = london_people(london)
    by_eth: dict[str, list[dict[str, str]]] = {}
    for row in people:
        by_eth.setdefault(row["face_eth"], []).append(row)
    order = []
    pools = [list(v) for _, v in sorted(by_eth.items())]
    while any(pools):
        for pool in pools:
            if pool:
                order.append(pool.pop(0))
    photos = folder / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    donors_dir = folder / "donors"
    donors_dir.mkdir(exist_ok=True)
    records, donors = [], []
    for i, row in enumerate(order[: n_sources + n_donors]):
        image = cv2.imread(str(london / "neutral" / f"{row['face_id']}.jpg"))
        s = side / max(image.shape[:2])
        image = cv2.resize(image, (round(image.shape[1] * s), round(image.shape[0] * s)), interpolation=cv2.INTER_AREA)
        target = (photos if i < n_sources else donors_dir) / f"london_{row['face_id']}.png"
        cv2.imwrite(str(target), image)
        if i < n_sources:
            records.append(
                {
                    "id": f"london_{row['face_id']}",
                    "path": target.name,
                    "licence": "CC-BY-4.0",
                    "occupation": "volunteer",
                    "presented_gender": row["face_gender"],
                    "extra": {"face_eth": row["face_eth"]},
                }
            )
        else:
            donors.append(target)
    meta = folder / "meta.yaml"
    meta.write_text(yaml.safe_dump({"sources": records}))
    return meta, donors


def write_pilot_spec(
    folder: Path,
    *,
    n_sources: int,
    donors: list[Path],
    version: str = "0.1.0",
    races: tuple[str, ...] = ("Black", "White"),
    genders: tuple[str, ...] = (),
    calibration: str | None = None,
    audit_rate: float = 1.0,
    double_review_rate: float = 0.0,
    seed: int = 3,
    name: str = "pilot",
    photos: str = "photos",
    rates: dict[str, float] | None = None,
) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "sources": {"photos": photos, "metadata": "meta.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": list(races), **({"gender": list(genders)} if genders else {})},
            "strata": ["occupation"],
            "templates_per_stratum": n_sources,
            "seed": 7,
        },
        "prompts": {"face": "face_only_v1"},
        "editor": {
            "backend": "faulty",
            "max_attempts": 1,
            "faulty": {"seed": seed, "donors": [str(p) for p in donors], **({"rates": rates} if rates else {})},
        },
        "review": {
            "audit_accepted_rate": audit_rate,
            "audit_rejected_rate": audit_rate,
            "double_review_rate": double_review_rate,
        },
        "release": {"name": name, "version": version},
    }
    if calibration is not None:
        spec["gates"] = {"calibration": calibration}
    path = folder / f"spec-{version}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def truth(ledger_url: str) -> dict[str, str]:
    """attempt id -> the class the faulty editor made."""
    ledger = Ledger(ledger_url)
    try:
        return {a.attempt_id: (a.meta or {}).get("faulty_class", "") for a in ledger.attempts()}
    finally:
        ledger.close()


def vote_of(
    name: str, attempt_id: str, made: str, error_rate: float, accepted: tuple[str, ...] = ("good",)
) -> tuple[str, str | None]:
    """``(decision, reason)`` of a simulated reviewer who accepts the classes ``accepted`` (a
    lab's own standard: good edits, perhaps more), rejects the others, and errs with
    probability ``error_rate``."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{name}|{attempt_id}".encode()).digest()[:8], "little"))
    good = made in accepted
    if rng.random() < error_rate:
        good = not good
    if good:
        return "accept", None
    return "reject", REASON_OF_CLASS.get(made, "artifact")


def review_all(
    base: str,
    token: str,
    name: str,
    classes: dict[str, str],
    *,
    error_rate: float = 0.05,
    accepted: tuple[str, ...] = ("good",),
) -> int:
    """Sign in with ``token`` and vote on every item the reviewer's queue shows, through the site's
    HTTP API (``/api/item``, ``/api/decisions``); returns the number of votes cast."""
    client = httpx.Client(base_url=base, timeout=120)
    try:
        assert client.post("/login", data={"token": token}).status_code == 303
        votes = 0
        while True:
            answer = client.get("/api/item").json()
            attempt = answer.get("attempt_id")
            if attempt is None:
                return votes
            found = re.search(r'data-attempt="(\w+)" data-ticket="([\w.]+)" data-csrf="(\w+)"', answer["html"])
            assert found, answer["html"][:500]
            decision, reason = vote_of(name, attempt, classes.get(attempt, ""), error_rate, accepted)
            form = {"attempt_id": attempt, "ticket": found.group(2), "csrf": found.group(3), "decision": decision}
            if reason:
                form["reason"] = reason
                if reason == "other":
                    form["note"] = "nothing was changed"
            r = client.post("/api/decisions", data=form)
            assert r.status_code == 200, r.text
            votes += 1
    finally:
        client.close()
