"""Calibrate the gates' thresholds on real photos: the no-op ceiling and the different-person floor.

For every photo, the gates' metrics are measured between the photo and copies of itself that
an editor pipeline should leave unchanged ("no-ops"): JPEG re-encodes, a round trip through
an editor's working resolution, a sub-pixel shift and a small rotation-and-zoom each aligned
back with the inverse transform, and a mirror image (identity, pose and expressions only:
a mirror is not pixel-aligned). Between photos, the identity cosine of different people (the
floor) and of the same person in different photographs is measured, and the pose and AU
differences between any two photographs. From these distributions the suggested thresholds
follow by the rules in :data:`RULES` (each recorded next to its value in the output). With a
failure corpus, :mod:`counterfactory.validation.calibration.corpus_fit` then sets the face-edit thresholds
it covers, and :func:`run_calibration` writes both steps' results.

Re-run (writes ``calibration.json`` and ``calibration.png``)::

    counterfactory calibrate --out assets/calibration [--spec SPEC]

The shipped defaults (:mod:`counterfactory.validation.thresholds`) are this command's output on the
bundled photos.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactory.assets import PHOTOS_DIR
from counterfactory.manifests.store import sha256_file
from counterfactory.validation.backends import load_au_model, load_detector, load_embedder
from counterfactory.validation.backends.sface import OPENCV_SAME_PERSON_COSINE
from counterfactory.validation.calibration.base import BUNDLED_FACES, load_rgb, sig_up, with_progress
from counterfactory.validation.calibration.corpus_fit import corpus_rules, plot_failures, run_failure_corpus
from counterfactory.validation.calibration.photo_sets import PhotoSet
from counterfactory.validation.calibration.skin import RULES as SKIN_RULES
from counterfactory.validation.calibration.skin import calibrate_skin_paths
from counterfactory.validation.faces import FaceObservation, MaskMode, face_mask, get_face_landmarker, nearest_face
from counterfactory.validation.gates.expression import au_changes
from counterfactory.validation.gates.face import pose_change_deg
from counterfactory.validation.gates.identity import cosine_similarity
from counterfactory.validation.metrics.floor import locality_metrics
from counterfactory.validation.thresholds import RECALIBRATE

SCHEMA = "counterfactory.calibration/1"

#: Published reference values the output is compared with (not used to compute it).
PUBLISHED = {
    "focus_diff_face_mean": 0.141,
    "focus_diff_nonface_mean": 0.022,
    "focus_ratio_median": 8.16,
    "opencv_sface_same_person_cosine": OPENCV_SAME_PERSON_COSINE,
}


# ---------------------------------------------------------------------------------------
# the no-op transforms: (name, forward image, whether pixel-aligned after it)


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    ok, buf = cv2.imencode(".jpg", image[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1].copy()


def _editor_resolution_round_trip(image: np.ndarray) -> np.ndarray:
    """Resize to about 1 MP in multiples of 16 (what diffusers editors work at) and back."""
    h, w = image.shape[:2]
    s = math.sqrt(1024 * 1024 / (h * w))
    nh, nw = max(16, round(h * s / 16) * 16), max(16, round(w * s / 16) * 16)
    work = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
    return cv2.resize(work, (w, h), interpolation=cv2.INTER_AREA if s > 1 else cv2.INTER_CUBIC)


def _warp_and_back(image: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Warp by ``matrix`` (what an editor's drift does) then by its inverse (what alignment
    does), bilinear both ways, borders reflected."""
    h, w = image.shape[:2]
    moved = cv2.warpAffine(image, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    inverse = cv2.invertAffineTransform(matrix)
    return cv2.warpAffine(moved, inverse, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


def _shift(image: np.ndarray) -> np.ndarray:
    return _warp_and_back(image, np.float64([[1, 0, 2.5], [0, 1, -1.5]]))


def _rotate_zoom(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return _warp_and_back(image, cv2.getRotationMatrix2D((w / 2, h / 2), 1.5, 1.03))


NOOPS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]] = {
    "jpeg95": (lambda im: _jpeg(im, 95), True),
    "jpeg75": (lambda im: _jpeg(im, 75), True),
    "editor_resize": (_editor_resolution_round_trip, True),
    "shift_aligned": (_shift, True),
    "rotate_zoom_aligned": (_rotate_zoom, True),
    "mirror": (lambda im: np.ascontiguousarray(im[:, ::-1]), False),
}


# ---------------------------------------------------------------------------------------
# measurement


@dataclass
class _Face:
    image: str
    index: int
    person: str
    shot: str
    observation: FaceObservation
    embedding: np.ndarray
    aus: dict[str, float]
    pose: tuple[float, float, float]
    detection_score: float | None


@dataclass
class _Samples:
    values: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def add(self, value: float | None, label: str) -> None:
        if value is not None and math.isfinite(value):
            self.values.append(float(value))
            self.labels.append(label)

    def summary(self) -> dict[str, Any]:
        v = np.asarray(self.values, dtype=np.float64)
        if v.size == 0:
            return {"n": 0}
        q = lambda p: float(np.quantile(v, p))  # noqa: E731
        return {
            "n": int(v.size),
            "min": float(v.min()),
            "p05": q(0.05),
            "median": q(0.5),
            "mean": float(v.mean()),
            "p95": q(0.95),
            "max": float(v.max()),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "values": [round(x, 6) for x in self.values], "labels": self.labels}


def _people(path: Path, n_faces: int) -> tuple[list[tuple[str, str]], str]:
    """((person, shot) per face left to right, where the labels came from)."""
    bundled = BUNDLED_FACES.get(path.name)
    if bundled is not None and path.resolve().parent == PHOTOS_DIR.resolve() and len(bundled) == n_faces:
        return list(bundled), "bundled"
    # a spec source: assumed to show people no other calibration photo shows
    return [(f"{path.stem}#{i}", f"{path.stem}#{i}") for i in range(n_faces)], "assumed_distinct"


def _mirror_observation(face: FaceObservation, width: int) -> FaceObservation:
    """Where ``face`` lands in the mirrored image (only the landmark positions matter here)."""
    lm = face.landmarks.copy()
    lm[:, 0] = width - 1 - lm[:, 0]
    return FaceObservation(landmarks=lm)


def _mirror_pose(pose: tuple[float, float, float]) -> tuple[float, float, float]:
    yaw, pitch, roll = pose
    return -yaw, pitch, -roll


def measure(
    image_paths: list[Path],
    *,
    face_mask_mode: MaskMode = "oval",
    detector: str = "mediapipe",
    embedder: str = "sface",
    au_model: str = "mediapipe",
    progress: bool = True,
) -> dict[str, Any]:
    """Measure the calibration distributions on ``image_paths`` (see the module docstring).

    Returns ``{"images": [...], "distributions": {group: {metric: {summary, values,
    labels}}}, "excluded_pairs": [...]}``.
    """
    landmarker = get_face_landmarker()
    det = load_detector(detector)
    emb = load_embedder(embedder)
    aum = load_au_model(au_model)

    dist: dict[str, dict[str, _Samples]] = {}

    def sample(group: str, metric: str) -> _Samples:
        return dist.setdefault(group, {}).setdefault(metric, _Samples())

    images: list[dict[str, Any]] = []
    faces: list[_Face] = []
    thumbs: list[tuple[str, str, np.ndarray, np.ndarray]] = []  # (file, shot, image, face mask)
    for path in with_progress(list(image_paths), progress, "calibrate"):
        path = Path(path)
        image = load_rgb(path)
        observed = landmarker.detect(image)
        record: dict[str, Any] = {
            "file": path.name,
            "sha256": sha256_file(path),
            "shape": list(image.shape),
            "faces": len(observed),
        }
        images.append(record)
        if not observed:
            record["skipped"] = "no face"
            continue
        detections = det.detect(image)
        record["detection_scores"] = [round(d.score, 4) for d in detections]
        ordered = sorted(observed, key=lambda f: f.box[0])
        people, origin = _people(path, len(ordered))
        record["people"], record["labels"] = [p for p, _ in people], origin
        for i, obs in enumerate(ordered):
            faces.append(
                _Face(
                    image=path.name,
                    index=i,
                    person=people[i][0],
                    shot=people[i][1],
                    observation=obs,
                    embedding=emb.embed(image, obs.keypoints5()),
                    aus=dict(aum.estimate(image, obs)),
                    pose=obs.pose_deg(),
                    detection_score=_matched_score(obs, detections),
                )
            )
        subject = observed[0]  # the largest face, as the gates judge it
        sample("source", "face.detection_score").add(_matched_score(subject, detections), path.name)
        src_emb = emb.embed(image, subject.keypoints5())
        src_aus = aum.estimate(image, subject)
        fmask = face_mask(subject.landmarks, image.shape[:2], mode=face_mask_mode)
        subject_shot = people[next(i for i, f in enumerate(ordered) if f is subject)][1]
        thumbs.append((path.name, subject_shot, *_thumbnail(image, fmask)))
        for name, (transform, aligned) in NOOPS.items():
            label = f"{path.name}:{name}"
            copy = transform(image)
            cand_faces = landmarker.detect(copy)
            if aligned:
                loc = locality_metrics(image, copy, fmask)
                for key in ("diff_face", "diff_nonface", "ratio"):
                    sample("noop", f"locality.{key}").add(loc[key], label)
            if name == "mirror":
                reference = _mirror_observation(subject, image.shape[1])
            else:
                reference = subject
            cand = nearest_face(reference, cand_faces)
            if cand is None:
                sample("noop", "face.lost").add(1.0, label)
                continue
            cand_pose = cand.pose_deg()
            ref_pose = _mirror_pose(subject.pose_deg()) if name == "mirror" else subject.pose_deg()
            change = pose_change_deg(ref_pose, cand_pose)
            sample("noop", "face.pose_change_deg").add(max(abs(c) for c in change), label)
            sample("noop", "face.detection_score").add(_matched_score(cand, det.detect(copy)), label)
            sample("noop", "identity.cosine").add(cosine_similarity(src_emb, emb.embed(copy, cand.keypoints5())), label)
            deltas = au_changes(dict(src_aus), dict(aum.estimate(copy, cand)))
            if deltas:
                sample("noop", "expression.au_change_max").add(max(abs(d) for d in deltas.values()), label)
                sample("noop", "expression.au_change_mean").add(
                    sum(abs(d) for d in deltas.values()) / len(deltas), label
                )

    excluded: list[dict[str, Any]] = []
    for a, b in itertools.combinations(faces, 2):
        if a.shot == b.shot:
            continue  # the same photograph: neither a different person nor a different photo
        label = f"{a.image}#{a.index}|{b.image}#{b.index}"
        cos = cosine_similarity(a.embedding, b.embedding)
        assumed = "#" in a.person or "#" in b.person
        if a.person == b.person:
            sample("same_person", "identity.cosine").add(cos, label)
        elif assumed and cos >= OPENCV_SAME_PERSON_COSINE and embedder == "sface":
            excluded.append(
                {"pair": label, "cosine": round(cos, 4), "why": "unlabelled sources that SFace calls the same person"}
            )
            continue
        else:
            sample("different_person", "identity.cosine").add(cos, label)
        change = pose_change_deg(a.pose, b.pose)
        sample("different_photo", "face.pose_change_deg").add(max(abs(c) for c in change), label)
        deltas = au_changes(a.aus, b.aus)
        if deltas:
            sample("different_photo", "expression.au_change_max").add(max(abs(d) for d in deltas.values()), label)
            sample("different_photo", "expression.au_change_mean").add(
                sum(abs(d) for d in deltas.values()) / len(deltas), label
            )
    for (fa, shot_a, img_a, mask_a), (fb, shot_b, img_b, _) in itertools.permutations(thumbs, 2):
        if shot_a == shot_b:
            continue
        other = cv2.resize(img_b, (img_a.shape[1], img_a.shape[0]), interpolation=cv2.INTER_AREA)
        loc = locality_metrics(img_a, other, mask_a)
        for key in ("diff_face", "diff_nonface"):
            sample("different_photo", f"locality.{key}").add(loc[key], f"{fa}|{fb}")
    return {
        "images": images,
        "distributions": {g: {m: s.to_dict() for m, s in sorted(ms.items())} for g, ms in sorted(dist.items())},
        "excluded_pairs": excluded,
    }


def _thumbnail(image: np.ndarray, mask: np.ndarray, side: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Image and mask scaled to at most ``side`` pixels (the between-photo comparison only
    needs the picture's gist, and keeps memory flat for large spec sets)."""
    h, w = image.shape[:2]
    s = min(1.0, side / max(h, w))
    size = (max(1, round(w * s)), max(1, round(h * s)))
    small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    small_mask = cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST)
    return small, small_mask


def _matched_score(face: FaceObservation, detections) -> float | None:
    """The score of the detection overlapping ``face``'s landmark box most (IoU > 0.2)."""
    x0, y0, x1, y1 = face.box
    best, best_iou = None, 0.2
    for d in detections:
        a0, b0, a1, b1 = d.box
        iw = max(0.0, min(x1, a1) - max(x0, a0))
        ih = max(0.0, min(y1, b1) - max(y0, b0))
        inter = iw * ih
        union = (x1 - x0) * (y1 - y0) + (a1 - a0) * (b1 - b0) - inter
        iou = inter / union if union > 0 else 0.0
        if iou > best_iou:
            best, best_iou = d.score, iou
    return best


# ---------------------------------------------------------------------------------------
# from distributions to thresholds

#: How each suggested threshold follows from the distributions. "no-op ceiling": the worst
#: value any no-op reached; "floor": the best value two different people reached; "midpoint"
#: (the word the rules use): the *geometric mean* of the no-op ceiling and the median over
#: pairs of different photographs (half-way on a log scale between "the same picture" and
#: "an unrelated picture"). With the failure corpus, the face-edit thresholds it covers
#: follow :data:`~counterfactory.validation.calibration.corpus_fit.CORPUS_RULE` instead.
RULES: dict[str, str] = {
    "face.min_detection_score": "lowest detection score of any source face or aligned no-op copy, rounded down to 0.05 (below it: review)",
    "face.max_pose_change_deg": "geometric mean of no-op ceiling and different-photo median of pose change, 2 significant digits up",
    "identity.face.min_cosine": "floor: highest cosine between two different people, rounded up to 0.01",
    "identity.face.max_cosine": "no-op ceiling: lowest cosine of any no-op copy (re-encode, resize, shift, rotate-zoom; not the mirror), rounded down to 0.01; with the failure corpus: none (copies are caught by locality.min_diff_face, and recoloured faces score as copies)",
    "identity.limb.min_cosine": "no-op ceiling (as identity.face.max_cosine): a limb edit must leave the face as a no-op does",
    "expression.max_au_change": "geometric mean of no-op ceiling and different-photo median of the largest AU change, 2 significant digits up",
    "expression.max_mean_au_change": "geometric mean of no-op ceiling and different-photo median of the mean AU change, 2 significant digits up",
    "locality.face.max_diff_nonface": "geometric mean of no-op ceiling and different-photo median of diff_nonface, 2 significant digits up",
    "locality.face.min_diff_face": "no-op ceiling of diff_face (a face changed less than this is a copy), 2 significant digits up",
    "locality.face.min_ratio": "no-op ceiling of diff_face / diff_nonface (the concentration resampling noise alone reaches), rounded up to 0.1",
    "locality.limb.max_diff_outside_edit": "0: composited limb candidates copy every source pixel outside the mask",
    "locality.limb.max_diff_face_drift": "no-op ceiling of diff_face (the face may differ no more than a re-encode makes it), 2 significant digits up",
    "locality.limb.min_diff_inside_edit": "no-op ceiling of diff_face (a limb region changed no more than a re-encode changes it is a copy), 2 significant digits up",
}


def _step_up(x: float, step: float) -> float:
    return round(math.ceil(x / step - 1e-9) * step, 10)


def _step_down(x: float, step: float) -> float:
    return round(math.floor(x / step + 1e-9) * step, 10)


def suggest_thresholds(
    distributions: dict[str, dict[str, dict[str, Any]]],
    *,
    backends: dict[str, str],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Thresholds per edit kind and gate from :func:`measure`'s distributions, by :data:`RULES`."""

    def values(group: str, metric: str) -> np.ndarray:
        v = np.asarray(distributions.get(group, {}).get(metric, {}).get("values", []), dtype=np.float64)
        if v.size == 0:
            raise ValueError(
                f"calibration has no {group} samples of {metric}: give photos with faces "
                "(and at least two different people)"
            )
        return v

    def midpoint(metric: str) -> float:
        return math.sqrt(values("noop", metric).max() * float(np.median(values("different_photo", metric))))

    detection = np.concatenate([values("source", "face.detection_score"), values("noop", "face.detection_score")])
    noop_cos = distributions.get("noop", {}).get("identity.cosine", {})
    cosines = values("noop", "identity.cosine")
    labels = noop_cos.get("labels") or []
    if len(labels) == cosines.size:
        # a mirror image is another picture of the head, not a copy: it is not a no-op for a ceiling
        kept = cosines[[not str(label).endswith(":mirror") for label in labels]]
        cosines = kept if kept.size else cosines
    ceiling = _step_down(float(cosines.min()), 0.01)
    face_gate = {
        "backend": backends["face"],
        "min_detection_score": _step_down(float(detection.min()), 0.05),
        "max_pose_change_deg": sig_up(midpoint("face.pose_change_deg")),
    }
    expression = {
        "backend": backends["expression"],
        "max_au_change": sig_up(midpoint("expression.au_change_max")),
        "max_mean_au_change": sig_up(midpoint("expression.au_change_mean")),
    }
    face_drift = sig_up(float(values("noop", "locality.diff_face").max()))
    return {
        "face": {
            "face": face_gate,
            "identity": {
                "backend": backends["identity"],
                "min_cosine": _step_up(float(values("different_person", "identity.cosine").max()), 0.01),
                "max_cosine": ceiling,
            },
            "expression": dict(expression),
            "locality": {
                "max_diff_nonface": sig_up(midpoint("locality.diff_nonface")),
                "min_diff_face": face_drift,
                "min_ratio": _step_up(float(values("noop", "locality.ratio").max()), 0.1),
            },
        },
        "limb": {
            "face": dict(face_gate),
            "identity": {"backend": backends["identity"], "min_cosine": ceiling},
            "expression": dict(expression),
            "locality": {
                "max_diff_outside_edit": 0.0,
                "max_diff_face_drift": face_drift,
                "min_diff_inside_edit": face_drift,
            },
        },
    }


# ---------------------------------------------------------------------------------------
# plot and entry point


def plot_calibration(result: dict[str, Any], path_png: str | Path) -> Path:
    """Histograms of the calibration distributions with the suggested thresholds marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = result["distributions"]
    face_kind, limb_kind = result["suggested"]["face"], result["suggested"]["limb"]
    panels = [
        (
            "identity.cosine",
            [
                ("noop", "no-op copies"),
                ("same_person", "same person, other photo"),
                ("different_person", "different people"),
            ],
            [
                (face_kind["identity"]["min_cosine"], "face min (floor)", "C3"),
                (limb_kind["identity"]["min_cosine"], "limb min (no-op ceiling)", "C2"),
                (PUBLISHED["opencv_sface_same_person_cosine"], "OpenCV same-person 0.363", "0.5"),
            ],
            False,
        ),
        (
            "face.pose_change_deg",
            [("noop", "no-op copies"), ("different_photo", "different photos")],
            [(face_kind["face"]["max_pose_change_deg"], "max", "C3")],
            False,
        ),
        (
            "face.detection_score",
            [("source", "source faces"), ("noop", "no-op copies")],
            [(face_kind["face"]["min_detection_score"], "min", "C3")],
            False,
        ),
        (
            "expression.au_change_max",
            [("noop", "no-op copies"), ("different_photo", "different photos")],
            [(face_kind["expression"]["max_au_change"], "max", "C3")],
            False,
        ),
        (
            "expression.au_change_mean",
            [("noop", "no-op copies"), ("different_photo", "different photos")],
            [(face_kind["expression"]["max_mean_au_change"], "max", "C3")],
            False,
        ),
        (
            "locality.diff_nonface",
            [("noop", "no-op copies"), ("different_photo", "different photos")],
            [
                (face_kind["locality"]["max_diff_nonface"], "face-edit max", "C3"),
                (PUBLISHED["focus_diff_nonface_mean"], "FOCUS mean 0.022", "0.5"),
            ],
            True,
        ),
        (
            "locality.diff_face",
            [("noop", "no-op copies"), ("different_photo", "different photos")],
            [
                (face_kind["locality"]["min_diff_face"], "face-edit min / limb drift max", "C3"),
                (PUBLISHED["focus_diff_face_mean"], "FOCUS mean 0.141", "0.5"),
            ],
            True,
        ),
        (
            "locality.ratio",
            [("noop", "no-op copies")],
            [
                (face_kind["locality"]["min_ratio"], "min", "C3"),
                (PUBLISHED["focus_ratio_median"], "FOCUS median 8.16", "0.5"),
            ],
            False,
        ),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (metric, groups, lines, log) in zip(axes.ravel(), panels):
        # a threshold that is not judged (None: FOCUS's raw figures on face edits) has no line
        lines = [line for line in lines if line[0] is not None]
        all_values = [v for g, _ in groups for v in d.get(g, {}).get(metric, {}).get("values", [])]
        if not all_values:
            ax.set_visible(False)
            continue
        lo, hi = min(all_values + [x for x, _, _ in lines]), max(all_values + [x for x, _, _ in lines])
        bins = np.geomspace(max(lo, 1e-4), hi * 1.05, 30) if log else np.linspace(lo, hi, 30)
        for group, label in groups:
            v = d.get(group, {}).get(metric, {}).get("values", [])
            if v:
                ax.hist(v, bins=bins, alpha=0.55, label=f"{label} (n={len(v)})")
        for x, label, colour in lines:
            ax.axvline(x, color=colour, linestyle="--" if colour == "0.5" else "-", label=f"{label}: {x:g}")
        if log:
            ax.set_xscale("log")
        ax.set_title(metric)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"counterfactory calibration: {len(result['images'])} photos; backends "
        + ", ".join(f"{k}={v}" for k, v in result["backends"].items())
        + f"; limb: identity min {limb_kind['identity']['min_cosine']:g}"
    )
    fig.tight_layout()
    path = Path(path_png)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_calibration(
    image_paths: list[Path],
    out_dir: Path,
    *,
    progress: bool = True,
    face_mask_mode: MaskMode = "oval",
    backends: dict[str, str] | None = None,
    failures: int = 0,
    seed: int = 0,
    target: float = 0.95,
    photo_sets: Sequence[PhotoSet] = (),
) -> dict[str, Any]:
    """Measure the no-op ceiling and different-person floor on ``image_paths`` and write
    ``out_dir/calibration.json`` (distributions, suggested thresholds, the rules behind them)
    and ``out_dir/calibration.png``; with ``failures`` also build the failure corpus, set the
    face-edit thresholds by :data:`~counterfactory.validation.calibration.corpus_fit.CORPUS_RULE`, and write ``out_dir/failures.png``.

    Args:
        image_paths: photos to calibrate on: the bundled ones (:func:`bundled_photo_paths`)
            and a spec's sources. Bundled photos carry who is in them; any other photo is
            assumed to show people no other photo shows (pairs SFace scores as the same
            person are then left out of the floor and listed under ``excluded_pairs``).
        out_dir: created if missing; files are written to temporary names and renamed.
        progress: show a progress bar.
        face_mask_mode: ``oval`` or ``skin``, the face mask the locality numbers use.
        backends: ``{"face": ..., "identity": ..., "expression": ...}``; the offline
            defaults (``mediapipe``, ``sface``, ``mediapipe``) when None.
        failures: variants per class and photo of the failure corpus
            (:mod:`counterfactory.validation.calibration.failures`); 0: no corpus (no-op rules only).
        seed: the corpus seed.
        target: good-edit acceptance the corpus thresholds aim at on the training split.
        photo_sets: more photos for the failure corpus only, each with its own size and split
            (:func:`~counterfactory.validation.calibration.photo_sets.london_set`: the London set, split by
            person, with real expression pairs).

    Returns:
        The dict written to ``calibration.json``.
    """
    chosen = {"face": "mediapipe", "identity": "sface", "expression": "mediapipe", **(backends or {})}
    paths = [Path(p) for p in image_paths]
    if not paths:
        raise ValueError("calibration needs at least one photo")
    measured = measure(
        paths,
        face_mask_mode=face_mask_mode,
        detector=chosen["face"],
        embedder=chosen["identity"],
        au_model=chosen["expression"],
        progress=progress,
    )
    suggested = suggest_thresholds(measured["distributions"], backends=chosen)
    skin_dist, skin_suggested = calibrate_skin_paths(paths, NOOPS, load_rgb)
    for kind_thresholds in suggested.values():
        kind_thresholds["skin"] = dict(skin_suggested)
    for group, metrics in skin_dist.items():
        for metric, sampled in metrics.items():
            samples = _Samples(list(sampled["values"]), list(sampled["labels"]))
            measured["distributions"].setdefault(group, {})[metric] = samples.to_dict()
    rules = dict(RULES)
    corpus = None
    if failures > 0:
        corpus = run_failure_corpus(
            paths,
            suggested["face"],
            per_class=failures,
            seed=seed,
            target=target,
            face_mask_mode=face_mask_mode,
            progress=progress,
            photo_sets=photo_sets,
        )
        suggested["face"] = corpus["face_gates"]
        rules = corpus_rules(RULES)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "rerun": RECALIBRATE,
        "backends": chosen,
        "face_mask": face_mask_mode,
        "noops": {
            name: ("pixel-aligned" if aligned else "not aligned: identity, pose, AUs only")
            for name, (_, aligned) in NOOPS.items()
        },
        "suggested": suggested,
        "rules": {**rules, **SKIN_RULES},
        "published": PUBLISHED,
        **measured,
    }
    if corpus is not None:
        result["failures"] = corpus
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".calibration.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, out / "calibration.json")
    tmp_png = out / f".calibration.{os.getpid()}.tmp.png"
    plot_calibration(result, tmp_png)
    os.replace(tmp_png, out / "calibration.png")
    if corpus is not None:
        tmp_png = out / f".failures.{os.getpid()}.tmp.png"
        plot_failures(corpus, tmp_png)
        os.replace(tmp_png, out / "failures.png")
    return result
