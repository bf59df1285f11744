"""Synthetic specs for the flow benchmarks: many distinct one-face photos and an instant editor.

Not a benchmark itself; ``orchestration.py``, ``resume.py``, ``focus_scale.py`` and
``workers_scaling.py`` import it. Photos are copies of the bundled one-face photos, scaled to a
given longest side, each made distinct by one pixel (so each is its own source, sha256 and
template) without changing what the face models see.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
#: the bundled photos with exactly one face (two_people.jpg has two)
ONE_FACE = (
    ("astronaut.png", "astronaut", "female"),
    ("grace_hopper.jpg", "naval officer", "female"),
    ("obama_portrait.jpg", "politician", "male"),
    ("biden_portrait.jpg", "politician", "male"),
    ("biden_blue_room.jpg", "politician", "male"),
    ("obama_podium.jpg", "politician", "male"),
    ("obama_letterbox_1080p.jpg", "politician", "male"),
    ("obama_rgba.png", "politician", "male"),
)


def make_photos(folder: Path, count: int, *, side: int, occupations: Sequence[str] | None = None) -> Path:
    """Write ``count`` distinct one-face PNGs of longest side ``side`` px and their metadata.

    Photo ``i`` is bundled photo ``i % 8`` with pixel (0, 0) set from ``i``. With
    ``occupations``, photo ``i`` gets ``occupations[i % len(occupations)]`` (for strata);
    otherwise the bundled photo's own. Returns the metadata file.
    """
    from PIL import Image

    from counterfactory.generation.sources import load_image

    folder.mkdir(parents=True, exist_ok=True)
    bases = []
    for name, occupation, gender in ONE_FACE:
        pixels = load_image(REPO / "assets" / "photos" / name).pixels
        scale = side / max(pixels.shape[:2])
        size = (max(1, round(pixels.shape[1] * scale)), max(1, round(pixels.shape[0] * scale)))
        bases.append((np.asarray(Image.fromarray(pixels).resize(size, Image.LANCZOS)), occupation, gender))
    records = []
    for i in range(count):
        pixels, occupation, gender = bases[i % len(bases)]
        copy = pixels.copy()
        copy[0, 0] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)
        path = folder / f"p{i:05d}.png"
        Image.fromarray(copy).save(path, compress_level=1)
        records.append(
            {
                "id": f"p{i:05d}",
                "path": path.name,
                "licence": "public domain (U.S. government)",
                "occupation": occupations[i % len(occupations)] if occupations else occupation,
                "presented_gender": gender,
            }
        )
    metadata = folder / "metadata.yaml"
    metadata.write_text(yaml.safe_dump({"sources": records}, sort_keys=False))
    return metadata


#: every face gate off: the orchestration (and alignment) alone
NO_GATES = {"face": {"face": None, "identity": None, "expression": None, "locality": None, "skin": None}}


def write_spec(
    path: Path,
    *,
    photos: Path,
    metadata: Path,
    conditions: int,
    templates: int,
    backend: str = "instant",
    gates: dict[str, Any] | None = None,
    align: dict[str, Any] | None = None,
    max_attempts: int = 1,
    name: str = "bench",
) -> Path:
    """A face spec of ``templates`` x ``conditions`` cells (one axis ``race`` with
    ``conditions`` values, one stratum) on the photos of :func:`make_photos`."""
    data: dict[str, Any] = {
        "name": name,
        "sources": {"photos": str(photos), "metadata": str(metadata)},
        "design": {
            "kind": "face",
            "axes": {"race": [f"group{i}" for i in range(conditions)]},
            "strata": [],
            "templates_per_stratum": templates,
        },
        "prompts": {"target_group": "{article} {race} person"},
        "editor": {"backend": backend, "max_attempts": max_attempts},
        "release": {"name": name},
    }
    if gates is not None:
        data["gates"] = gates
    if align is not None:
        data["align"] = align
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def register_instant_editor() -> None:
    """Register the ``instant`` backend: returns a copy of its input at once, costs nothing.

    It reads nothing but the source (``consumes`` is empty), so its attempts differ by condition.
    """
    from pydantic import BaseModel, ConfigDict

    from counterfactory.generation.editors.base import EditResult
    from counterfactory.generation.editors.registry import EDITORS

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class InstantEditor:
        name = "instant"
        batch_size = 1

        def __init__(self, options: Options) -> None:
            self.options = options

        def lineage(self) -> dict[str, Any]:
            return {"backend": self.name}

        def consumes(self, kind: str) -> frozenset[str]:
            return frozenset()

        def prepare(self) -> None:
            return None

        def edit(self, request):
            # a fresh array per call, as a real editor returns
            return EditResult(request.attempt_id, "ok", image=np.array(request.image, copy=True))

        def edit_many(self, requests, journal=None):
            return [self.edit(r) for r in requests]

    EDITORS.register("instant", Options, InstantEditor)


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(script: Path, args: Sequence[str], *, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Run ``script`` with ``args`` in a fresh interpreter; returns (its last stdout line as
    JSON, its stderr)."""
    import json

    merged = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=REPO, capture_output=True, text=True, env=merged, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row.setdefault("process_s", round(time.perf_counter() - started, 2))
    return row, done.stderr


LOCK_ERRORS = re.compile(r"database is locked|database table is locked|SQLITE_BUSY", re.IGNORECASE)
