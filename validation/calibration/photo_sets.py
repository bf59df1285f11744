"""Groups of photos the failure corpus is made from, and how each group is split.

A :class:`PhotoSet` names its photos, how many variants per class each photo gets, the size
the photos are scaled to, and how its cases are split between the training split (which sets
thresholds) and the held-out split (which reports figures):

- ``variant``: odd variant indices are held out; held-out cases share photos and people with
  training cases (the bundled photos: four people, too few to split);
- ``person``: every case of a person is in one split, the people balanced between the splits
  within each group the set labels (:func:`person_splits`): held-out figures are about people
  the thresholds never saw.

:func:`london_set` reads the Face Research Lab London Set (``../shared/photos/london``: 82
people, CC BY 4.0, consent for altered forms), each person's neutral photo a source, with the
same person's smiling photo of the same session as the pair behind the corpus's real
expression class (:func:`register_pair` places it in the neutral photo's frame: on the
``.tem`` head outline, ears and neck where both photos have landmarks, else on the face
mesh's rigid points; the set's smiling ``.tem`` files are empty, so the London pairs use the
mesh).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import cv2
import numpy as np

from counterfactory.manifests.errors import CounterfactoryError

SplitBy = Literal["variant", "person"]

#: Psychomorph / WebMorph 189-point template (the London set's ``.tem`` files): points that do
#: not move with a smile. 0, 1 the pupils; 147-155 the top of the head outline (temples over
#: the crown, not the jaw, which drops when the mouth opens); 183, 184 the neck; 185-188 the
#: ears.
TEM_RIGID = (0, 1, *range(147, 156), 183, 184, 185, 186, 187, 188)

#: MediaPipe Face Mesh points that do not move with a smile (eye corners, nose bridge,
#: forehead, temples): the registration when a photo has no ``.tem`` file.
MESH_RIGID = (33, 133, 362, 263, 6, 168, 10, 127, 356, 9)


@dataclass(frozen=True)
class PhotoSet:
    """Photos of one kind for the failure corpus.

    Attributes:
        name: the set's name in records and figures (``bundled``, ``london``).
        paths: source photos.
        per_class: variants per class and photo (good edits
            :data:`~counterfactory.validation.calibration.failures.GOOD_MULTIPLIER` times as many).
        max_side: photos larger than this are scaled down first, pixels.
        split_by: ``variant`` or ``person`` (module docstring).
        people: ``{path: person}``; photos not listed are their own person, bundled photos
            the person :data:`~counterfactory.validation.calibration.base.BUNDLED_FACES` names.
        groups: ``{person: group}`` the person split balances (e.g. self-reported ethnic
            group); figures are also given per group.
        pairs: ``{path: path}``: the same person in another expression, same session: the
            source of the ``expression_real`` class.
        landmarks: ``{path: path}``: a ``.tem`` landmark file of the photo (pairs are
            registered on its rigid points, :data:`TEM_RIGID`).
    """

    name: str
    paths: tuple[Path, ...]
    per_class: int
    max_side: int = 512
    split_by: SplitBy = "variant"
    people: Mapping[Path, str] = field(default_factory=dict)
    groups: Mapping[str, str] = field(default_factory=dict)
    pairs: Mapping[Path, Path] = field(default_factory=dict)
    landmarks: Mapping[Path, Path] = field(default_factory=dict)

    def person_of(self, path: Path) -> str:
        """Who a one-face photo of the set shows: :attr:`people`'s entry, else the person
        :data:`~counterfactory.validation.calibration.base.BUNDLED_FACES` names for a bundled
        one-face photo, else the file's stem (a person no other photo shows)."""
        from counterfactory.validation.calibration.base import BUNDLED_FACES

        path = Path(path)
        if path in self.people:
            return self.people[path]
        bundled = BUNDLED_FACES.get(path.name)
        return bundled[0][0] if bundled is not None and len(bundled) == 1 else path.stem

    def __post_init__(self) -> None:
        if self.per_class < 1:
            raise ValueError(f"photo set {self.name!r}: per_class must be at least 1, got {self.per_class}")
        if self.split_by not in ("variant", "person"):
            raise ValueError(f"photo set {self.name!r}: split_by must be 'variant' or 'person', got {self.split_by!r}")


def person_splits(people: Sequence[str], groups: Mapping[str, str], seed: int) -> dict[str, str]:
    """``{person: "train" | "heldout"}``: the people group by group (people without one form
    their own group), within a group in the order of a hash of ``(seed, person)``, alternating
    along that whole list, so that the splits differ by at most one person in each group and
    in all, and the same seed gives the same split."""
    by_group: dict[str, list[str]] = {}
    for person in sorted(set(people)):
        by_group.setdefault(groups.get(person, ""), []).append(person)
    ordered = [
        person
        for group in sorted(by_group)
        for person in sorted(by_group[group], key=lambda p: hashlib.sha256(f"{seed}|split|{p}".encode()).digest())
    ]
    return {person: ("heldout" if i % 2 else "train") for i, person in enumerate(ordered)}


def read_tem(path: str | Path) -> np.ndarray:
    """``(n, 2)`` float32 points of a Psychomorph ``.tem`` file (a count line, then ``x y``)."""
    lines = Path(path).read_text().split("\n")
    try:
        n = int(lines[0].strip())
        points = np.array([[float(v) for v in line.split()[:2]] for line in lines[1 : n + 1]], np.float32)
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{path}: not a Psychomorph .tem file ({exc})") from exc
    if points.shape != (n, 2):
        raise ValueError(f"{path}: expected {n} points, read {points.shape[0]}")
    return points


def register_pair(
    source: np.ndarray,
    other: np.ndarray,
    source_points: np.ndarray,
    other_points: np.ndarray,
) -> tuple[np.ndarray, dict[str, float]]:
    """``other`` warped into ``source``'s frame by the similarity that maps its rigid points
    onto ``source``'s (least median of squares), and the fit's residual.

    The points are ``(n, 2)`` pixel coordinates of the same landmarks in each image. Returns the
    warped image (``source``'s size, borders replicated) and ``{"scale", "rotation_deg",
    "residual_px"}``."""
    m, _ = cv2.estimateAffinePartial2D(
        other_points.astype(np.float32), source_points.astype(np.float32), method=cv2.LMEDS
    )
    if m is None:
        raise ValueError("the pair's landmarks admit no similarity transform")
    h, w = source.shape[:2]
    warped = cv2.warpAffine(other, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    moved = other_points @ m[:, :2].T + m[:, 2]
    residual = float(np.median(np.linalg.norm(moved - source_points, axis=1)))
    scale = float(np.hypot(m[0, 0], m[1, 0]))
    return warped, {
        "scale": round(scale, 4),
        "rotation_deg": round(float(np.degrees(np.arctan2(m[1, 0], m[0, 0]))), 3),
        "residual_px": round(residual, 3),
    }


class PhotoSetError(CounterfactoryError, FileNotFoundError):
    """A photo set's folder lacks what it is read from (the London set's ``london_info.csv``, or
    any photo of a person it lists); the message names the folder to point at."""


def london_set(
    root: str | Path,
    *,
    people: int | None = None,
    per_class: int = 1,
    max_side: int = 384,
    seed: int = 0,
) -> PhotoSet:
    """The London set's people as a :class:`PhotoSet` split by person, balanced by ethnic group.

    ``root`` holds ``neutral/NNN.jpg``, ``smiling/NNN.jpg``, their ``.tem`` files and
    ``london_info.csv`` (``../shared/photos/london/README.md``). ``people``: the first this
    many people in the order of a hash of ``(seed, id)`` within each ethnic group, taken in
    turn from each group (all when None), so a smaller set keeps every group."""
    root = Path(root)
    info_path = root / "london_info.csv"
    if not info_path.is_file():
        raise PhotoSetError(
            f"{info_path}: not found; point --london at the Face Research Lab London Set folder "
            "(neutral/, smiling/, london_info.csv)"
        )
    with info_path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if (root / "neutral" / f"{r['face_id']}.jpg").is_file()]
    if not rows:
        raise PhotoSetError(f"{root}: no neutral/NNN.jpg photo of a person listed in london_info.csv")
    groups = {f"london_{r['face_id']}": r["face_eth"] for r in rows}
    by_group: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_group.setdefault(r["face_eth"], []).append(r)
    for members in by_group.values():
        members.sort(key=lambda r: hashlib.sha256(f"{seed}|take|{r['face_id']}".encode()).digest())
    chosen: list[dict[str, str]] = []
    depth = 0
    while len(chosen) < (people or len(rows)) and any(depth < len(m) for m in by_group.values()):
        for group in sorted(by_group):
            if depth < len(by_group[group]) and len(chosen) < (people or len(rows)):
                chosen.append(by_group[group][depth])
        depth += 1
    paths, who, pairs, tems = [], {}, {}, {}
    for r in sorted(chosen, key=lambda r: r["face_id"]):
        path = root / "neutral" / f"{r['face_id']}.jpg"
        paths.append(path)
        who[path] = f"london_{r['face_id']}"
        smiling = root / "smiling" / f"{r['face_id']}.jpg"
        if smiling.is_file():
            pairs[path] = smiling
        for p in (path, smiling):
            # the set's smiling .tem files are empty (the source repository's): those pairs
            # are registered on the face mesh's rigid points instead
            if p.with_suffix(".tem").is_file() and p.with_suffix(".tem").stat().st_size > 0:
                tems[p] = p.with_suffix(".tem")
    return PhotoSet(
        name="london",
        paths=tuple(paths),
        per_class=per_class,
        max_side=max_side,
        split_by="person",
        people=who,
        groups={who[p]: groups[who[p]] for p in paths},
        pairs=pairs,
        landmarks=tems,
    )
