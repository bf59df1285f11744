"""A small sealed release built from the bundled real photos, shaped as ``flows.engine.release`` writes one.

Running the demo flow takes a minute; the Hub tests need a release in a second. Every JSON file
matches its schema in ``manifests/schemas/`` (``verify`` checks them). Rows follow
``counterfactory.flows.engine.release.build_items`` (item, condition, status, image, source, editor, gates, review),
images are the real photos with a condition-specific tint in one box, saved as PNG under
their sha256, so pixel checks have real photographs to compare.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.manifests.release import ReleaseStage, write_json, write_jsonl
from counterfactory.manifests.release_verify import table_record
from counterfactory.manifests.store import sha256_file
from counterfactory.manifests.trials import TrialsConfig, bank_record, build_trials, trial_summary
from counterfactory.validation.release_derived import as_read_back, derived_stats
from counterfactory.validation.target_stats import skin_tone_stats

PHOTOS = {"astronaut": "astronaut.png", "grace_hopper": "grace_hopper.jpg"}
DEFAULT_LICENCES = {"astronaut": "public domain (NASA)", "grace_hopper": "public domain (U.S. Navy)"}
#: face ITA change (degrees) per source and condition index; below -8 counts as lightened
ITA_CHANGE = {"astronaut": [-5.0, -15.0, 0.0], "grace_hopper": [-3.0, -9.0, 0.0]}
CONDITIONS = [
    ({"race": "Black", "gender": "female"}, "accepted"),
    ({"race": "White", "gender": "male"}, "rejected"),
    ({"race": "East Asian", "gender": "female"}, "failed"),
]


def make_release(
    root: Path,
    *,
    name: str = "study",
    version: str = "1.0.0",
    licences: dict[str, str | None] | None = None,
    trials: bool = True,
    tint: int = 60,
) -> Path:
    """Seal a release under ``root/releases/name/version`` and return its folder.

    ``licences`` maps source id -> metadata licence text; ``tint`` changes the edited pixels
    (two releases with different tints have different content).
    """
    licences = DEFAULT_LICENCES if licences is None else licences
    stage = ReleaseStage(root / "releases", name, version)
    scratch = stage.dir.parent / f".{version}.images"
    scratch.mkdir(exist_ok=True)
    items, derived_rows = [], []
    for sid, filename in PHOTOS.items():
        photo = PHOTOS_DIR / filename
        sha = sha256_file(photo)
        src_rel = stage.add_file(f"sources/{sha}{photo.suffix.lower()}", photo)
        with Image.open(photo) as im:
            rgb = np.asarray(im.convert("RGB")).copy()
        h, w = rgb.shape[:2]
        for k, (condition, status) in enumerate(CONDITIONS):
            image = None
            if status != "failed":
                edited = rgb.copy()
                box = edited[h // 4 : h // 2, w // 4 : w // 2].astype(np.int16)
                box[..., k] += tint
                edited[h // 4 : h // 2, w // 4 : w // 2] = np.clip(box, 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(edited).save(buf, format="PNG")
                digest = hashlib.sha256(buf.getvalue()).hexdigest()
                (scratch / f"{digest}.png").write_bytes(buf.getvalue())
                image = {"sha256": digest, "path": stage.add_file(f"images/{digest}.png", scratch / f"{digest}.png")}
            passed = status == "accepted"
            cell_id = f"{sid}|race={condition['race']}|gender={condition['gender']}"
            item_id = hashlib.sha256(cell_id.encode()).hexdigest()[:16] if status != "failed" else None
            items.append(
                {
                    "item_id": item_id,
                    "cell_id": cell_id,
                    "template_id": sid,
                    "kind": "face",
                    "condition": condition,
                    "gender_match": condition["gender"] == "female",
                    "status": status,
                    "reasons": [] if passed else (["identity_low_cosine"] if image else ["editor_error: timeout"]),
                    "attempts": 1 if passed else 2,
                    "image": image,
                    "source": {
                        "id": sid,
                        "sha256": sha,
                        "path": src_rel,
                        "licence": licences.get(sid),
                        "occupation": "astronaut" if sid == "astronaut" else "naval officer",
                        "context": "studio portrait",
                        "presented_gender": "female",
                    },
                    "editor": None
                    if image is None
                    else {
                        "backend": "classical",
                        "model": None,
                        "revision": None,
                        "lineage": {"backend": "classical", "strength": 0.55, "version": 1},
                        "prompt": f"Edit only the person's face so that they appear to be a {condition['race']} person.",
                        "seed": k,
                        "attempt_no": 1,
                        "cost_usd": 0.0,
                    },
                    "alignment": None if image is None else {"ok": True, "residual_px": 0.03, "shift_px": [0.0, 0.0]},
                    "gates": {}
                    if image is None
                    else {
                        "identity": {
                            "metrics": {"cosine": 0.91 if passed else 0.12, "embedding_dim": 128},
                            "passed": passed,
                            "reasons": [] if passed else ["identity_low_cosine"],
                            "review": [],
                            "thresholds": {"backend": "sface", "min_cosine": 0.25, "max_cosine": 0.995},
                        },
                        "skin": {
                            "metrics": {
                                "face_ita_change_deg": ITA_CHANGE[sid][k],
                                "lightened": ITA_CHANGE[sid][k] < -8,
                            },
                            "passed": True,
                            "reasons": [],
                            "review": [],
                            "thresholds": {"max_lightening_deg": 8.0},
                        },
                        "attribute": {
                            "metrics": {"match_race": passed, "match_gender": True},
                            "passed": passed,
                            "reasons": [] if passed else ["attribute_mismatch"],
                            "review": [],
                            "thresholds": {"backend": "fairface"},
                        },
                    },
                    "review": {
                        "gate_verdict": "accepted",
                        "mode": "audit",
                        "required": 1,
                        "state": "resolved",
                        "outcome": "accepted",
                        "reason": None,
                        "decisions": [],
                    }
                    if passed and sid == "astronaut"
                    else None,
                    "expression": None,
                }
            )
            if passed and trials:
                # a robustness variant (derived.jsonl): the accepted image mirrored
                mirrored = io.BytesIO()
                Image.fromarray(edited[:, ::-1]).save(mirrored, format="PNG")
                digest = hashlib.sha256(mirrored.getvalue()).hexdigest()
                (scratch / f"{digest}.png").write_bytes(mirrored.getvalue())
                derived_rows.append(
                    {
                        "item_id": f"{item_id}-mirror",
                        "parent_item_id": item_id,
                        "template_id": sid,
                        "transform": {"kind": "mirror"},
                        "image": {
                            "sha256": digest,
                            "path": stage.add_file(f"images/{digest}.png", scratch / f"{digest}.png"),
                        },
                    }
                )
    for p in scratch.iterdir():
        p.unlink()
    scratch.rmdir()
    write_jsonl(stage.dir / "manifest.jsonl", [r for r in items if r["status"] == "accepted"])
    write_jsonl(stage.dir / "items.jsonl", items)
    if trials:
        # the factory's own trial bank: MCQ on each accepted item and on its mirrored variant
        manifest = [r for r in items if r["status"] == "accepted"]
        trial_rows = build_trials(manifest, TrialsConfig(protocols=["mcq"]), derived=derived_rows)
        write_jsonl(stage.dir / "trials.jsonl", trial_rows)
        write_jsonl(stage.dir / "derived.jsonl", derived_rows)
    else:
        # as publish writes them for a spec without trial protocols or variants: present, empty
        write_jsonl(stage.dir / "trials.jsonl", [])
        write_jsonl(stage.dir / "derived.jsonl", [])
    spec = {
        "name": name,
        "description": "Test release from the bundled photos.",
        "design": {"kind": "face", "axes": {"race": ["Black", "White", "East Asian"], "gender": ["female", "male"]}},
        "prompts": {"face": "face_only_v1"},
        "release": {"name": name, "version": version, "description": "Test release.", "licence": "see sources"},
    }
    if trials:
        spec["trials"] = {"protocols": ["mcq"]}
    (stage.dir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    # the sections verify re-derives from items.jsonl come from the code publish uses
    write_json(
        stage.dir / "stats.json",
        {
            **derived_stats(
                as_read_back(items, ["race", "gender"]),
                failed_sources=False,
                short_strata=False,
                floors={"classical": {}},
            ),
            "failed_sources": [],
            "spec_hash": hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest(),
            "skin": skin_tone_stats(items, {sid: "White" for sid in PHOTOS}),
            "release": {"name": name, "version": version},
            "grid": {},
            # shaped as validation.review_stats.release_review_stats writes it
            "review": {
                "waiting": {"total": 0, "by_group": {}},
                "queue": {"total": 1, "open": 0, "disputed": 0, "resolved": 1},
                "by_mode": {"queue": 0, "audit": 1},
                "decisions": 2,
                "agreement": {"pairs": 1, "agree": 1, "kappa": None, "kappa_per_reason": {}},
                "override": {
                    "accepted": {"n": 1, "passed": 0, "rate": 0.0, "ci_low": 0.0, "ci_high": 0.7935},
                    "rejected": {"n": 0, "passed": 0, "rate": None, "ci_low": 0.0, "ci_high": 1.0},
                },
                "spot_the_edit": {"overall": {"trials": 0, "detection": {"n": 0}, "localisation": {"n": 0}}},
            },
        },
    )
    write_json(
        stage.dir / "release.json",
        {
            "name": name,
            "version": version,
            "description": "Test release.",
            "created_at": "2026-12-01T00:00:00+00:00",
            "spec_name": name,
            "spec_hash": hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest(),
            "spec_sha256": hashlib.sha256((stage.dir / "spec.yaml").read_bytes()).hexdigest(),
            "complete": False,
            "files": {},
            "trials": trial_summary(trial_rows) if trials else {},
            "trial_bank": bank_record(TrialsConfig()),
            "tables": {
                name: table_record(stage.dir, name)
                for name in ("manifest.jsonl", "items.jsonl", "trials.jsonl", "derived.jsonl")
            },
        },
    )
    return stage.seal().path
