"""Fit the face-edit thresholds on the failure corpus: good edits kept, failures caught.

The corpus (:mod:`counterfactory.validation.calibration.failures`) is built from the calibration photos;
every case is aligned and judged as a run judges it, above its photo's noise floor. The
training split's good edits set each threshold by :data:`CORPUS_RULE`, and the held-out split
is judged with the chosen thresholds to report good-edit acceptance and, per failure class,
the share caught. :func:`counterfactory.validation.calibration.calibrate.run_calibration` runs this step
when asked for a corpus (``counterfactory calibrate --failures N``) and writes its result
into ``calibration.json`` and ``failures.png``.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, NEEDS_REVIEW, REJECTED, VERDICTS
from counterfactory.validation.backends.sface import OPENCV_SAME_PERSON_COSINE
from counterfactory.validation.calibration.base import sig_down, sig_up, with_progress
from counterfactory.validation.calibration.corpus_edits import CORPUS_REGION
from counterfactory.validation.calibration.failures import CLASSES, GOOD, build_floors, build_set_corpus
from counterfactory.validation.calibration.photo_sets import PhotoSet
from counterfactory.validation.faces import MaskMode
from counterfactory.validation.gates.locality import (
    FLOOR_CONTEXT,
    FLOOR_IMAGE,
    FLOOR_RELATIVE,
    PATH_THRESHOLDS,
    FloorContext,
)
from counterfactory.validation.metrics.pixels import MIN_CHANGE_AREA_FRAC

#: Thresholds the failure corpus sets: ``(gate, threshold, metric, bound)``; ``bound`` is
#: ``max`` (reject above) or ``min`` (reject below).
CORPUS_THRESHOLDS: tuple[tuple[str, str, str, str], ...] = (
    # a darker (or lighter) face scores lower with the detector than its source: the review
    # floor is fitted on the good edits, not left at the lowest score of an unedited photo
    ("face", "min_detection_score", "face.detection_score", "min"),
    ("face", "max_pose_change_deg", "face.pose_change_deg", "max"),
    ("face", "max_position_change", "face.position_change", "max"),
    ("face", "max_scale_change", "face.scale_change", "max"),
    ("identity", "min_cosine", "identity.cosine", "min"),
    ("expression", "max_au_change", "expression.au_change_max", "max"),
    ("expression", "max_mean_au_change", "expression.au_change_mean", "max"),
    ("expression", "max_mouth_corner_change_iod", "expression.mouth_corner_change_iod", "max"),
    ("expression", "max_brow_change_iod", "expression.brow_change_iod", "max"),
    ("expression", "max_mouth_open_change_iod", "expression.mouth_open_change_iod", "max"),
    ("expression", "max_mouth_corner_shift_iod", "expression.mouth_corner_shift_iod", "max"),
    # judged above the photo's noise floor (the editor's "unchanged" output), as runs judge them
    ("locality", "max_changed_share", "locality.changed_share_above_floor", "max"),
    ("locality", "max_global_shift", "locality.global_shift_above_floor", "max"),
    ("locality", "max_global_gain_change", "locality.global_gain_change_above_floor", "max"),
    ("locality", "max_body_skin_delta_e", "locality.body_skin_delta_e_above_floor", "max"),
    ("locality", "max_hair_delta_e", "locality.hair_delta_e_above_floor", "max"),
    ("locality", "max_largest_change_share", "locality.largest_change_share_above_floor", "max"),
    # per pixel against the floor output itself: what the editor's re-rendering never changes
    ("locality", "max_excess_share", "locality.excess_share", "max"),
    # a copy re-rendered is still a copy: its band-limited face change is no more than the
    # floor output's, the decoder's alone (sent to review)
    ("locality", "min_face_change", "locality.face_change_above_floor", "min"),
)

#: The judging paths (:data:`~counterfactory.validation.gates.locality.FLOOR_PATHS`): every
#: corpus case is judged on each, and each path's locality thresholds are fitted on its own
#: measures. ``request``: above the photo's floor case (the rows above); ``cohort``: above the
#: median of the photo's other cases of the split (leave one out), the face as measured;
#: ``none``: every measure as measured.
PATHS = ("request", "cohort", "none")
PATH_LOCALITY: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "request": tuple(row for row in CORPUS_THRESHOLDS if row[0] == "locality"),
    # the request path's rows, the face as measured (the others' faces are edited too)
    "cohort": tuple(
        (gate, name, "locality.face_change" if name == "min_face_change" else metric, bound)
        for gate, name, metric, bound in CORPUS_THRESHOLDS
        if gate == "locality"
    ),
    "none": (
        ("locality", "max_changed_share", "locality.changed_share", "max"),
        ("locality", "max_global_shift", "locality.global_shift", "max"),
        ("locality", "max_global_gain_change", "locality.global_gain_change", "max"),
        ("locality", "max_body_skin_delta_e", "locality.body_skin_delta_e", "max"),
        ("locality", "max_hair_delta_e", "locality.hair_delta_e", "max"),
        ("locality", "max_largest_change_share", "locality.largest_change_share", "max"),
        ("locality", "min_face_change", "locality.face_change", "min"),
    ),
}
#: the locality config key of each path's own thresholds (the request path's are top-level)
PATH_CONFIG_KEY = {"cohort": "cohort", "none": "no_floor"}

#: The gates the failure corpus judges (the others judge against a requested condition).
#: FOCUS's raw locality figures: recorded, never judged on corpus-calibrated face edits
FOCUS_RAW_THRESHOLDS = ("max_diff_nonface", "min_ratio")
CORPUS_GATES = tuple(dict.fromkeys(gate for gate, _, _, _ in CORPUS_THRESHOLDS))

#: Safety factor between the good edits' extreme and the threshold: the training split's
#: good edits are a sample, and the held-out ones reach past its extreme.
CORPUS_MARGIN = 1.5
#: The resolution of a metric, below which a threshold means nothing: a global shift is the
#: largest of twelve medians (three channels, the whole region and its three lightness thirds)
#: of a difference between two 8-bit images each rounded to a grey level, so it is resolved to
#: two grey levels, not one (a re-rendering decoder answers a darker face with a frame about
#: two levels darker in one channel's darkest third: London 137's darker good edits, 0.0053-0.0076
#: against the floor output, where the corpus's smallest colour cast is 0.0098); a share of coherent areas is 0 or at least one smallest area
#: (:data:`~counterfactory.validation.metrics.pixels.MIN_CHANGE_AREA_FRAC`), so a bound at one
#: area rejects any area at all (zero tolerance, not a fitted limit): its bound is never below
#: two areas. The largest area of per-pixel change is resolved to one smallest coherent area: the
#: training split's good edits reach a few dozen pixels at most (0.0004 of the region: specks a
#: decoder leaves on a patterned shirt or a plant), which a bound fitted that fine would call an
#: object as soon as another variant of the same photo left a few more.
METRIC_RESOLUTION = {
    "locality.global_shift_above_floor": 2.0 / 255.0,
    "locality.global_shift": 2.0 / 255.0,
    "locality.excess_share": 2 * MIN_CHANGE_AREA_FRAC,
    "locality.largest_change_share": MIN_CHANGE_AREA_FRAC,
    "locality.largest_change_share_above_floor": MIN_CHANGE_AREA_FRAC,
}

#: The rule, in words, written into ``calibration.json`` and the README.
CORPUS_RULE = (
    "each corpus threshold starts from the good-edit quantile of its metric on the training split that leaves "
    "(1 - target) / m of the good edits outside it (m = the number of corpus thresholds, so that together they "
    f"keep good-edit acceptance >= target), widened by a factor {CORPUS_MARGIN} (upper bounds multiplied, lower "
    "bounds divided) and never finer than the metric's resolution (two grey levels for global_shift, two smallest "
    "areas for excess_share, one smallest area for largest_change_share), rounded "
    "outward to 2 significant digits, fitted on each photo set's good edits alone and the loosest of those "
    "kept (a study's photos may be like any of the sets), each judging path (floor request, cohort floor, none) "
    "fitted on its own measures; identity.min_cosine is fitted the same way with OpenCV's documented SFace "
    "same-person operating point (0.363) as its lower bound"
)

#: Metrics kept per corpus case in ``calibration.json`` (besides verdict and reasons).
CORPUS_METRICS = tuple(m for _, _, m, _ in CORPUS_THRESHOLDS) + (
    "locality.face_change",
    "locality.diff_face",
    "locality.diff_nonface",
    "locality.ratio",
    "locality.band_ratio",
    "locality.changed_share",
    "locality.global_shift",
    "locality.global_gain_change",
    "locality.body_skin_delta_e",
    "locality.hair_delta_e",
    "locality.largest_change_share",
    "locality.focus_diff_face",
    "locality.focus_diff_nonface",
    "locality.focus_ratio",
    "locality.excess_share",
    "locality.floor_members",
    "locality.nonface_change",
)


def corpus_rules(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the no-op rules, :data:`counterfactory.validation.calibration.calibrate.RULES`) with the
    face-edit thresholds the failure corpus sets described by :data:`CORPUS_RULE`."""
    rules = dict(base)
    for gate, name, metric, bound in CORPUS_THRESHOLDS:
        rules[f"{gate}.face.{name}"] = f"failure corpus: {bound} bound on {metric}, " + CORPUS_RULE.split(";")[0]
    rules["identity.face.min_cosine"] += "; " + CORPUS_RULE.split("; ")[-1]
    rules["identity.face.max_cosine"] = "none: copies are caught by locality.min_diff_face (review)"
    for name in FOCUS_RAW_THRESHOLDS:
        rules[f"locality.face.{name}"] = (
            "none: FOCUS's raw figure, recorded for comparison; re-rendering alone moves it (band-limited "
            "changed_share, global_shift and global_gain_change judge locality)"
        )
    return rules


def noise_floor_metrics(record: dict[str, Any]) -> dict[str, float] | None:
    """The :data:`~counterfactory.validation.gates.locality.FLOOR_RELATIVE` measures of a
    noise-floor record (:func:`measure_case` of the editor's "unchanged" output), or None
    when it could not be measured (registration failed)."""
    metrics = record.get("metrics") or {}
    floor = {k: metrics[f"locality.{k}"] for k in FLOOR_RELATIVE if f"locality.{k}" in metrics}
    return floor or None


def measure_case(case, stack, floor: dict[str, Any] | None = None, *, keep_image: bool = False) -> dict[str, Any]:
    """Align one corpus case as the factory does and judge it with ``stack``.

    ``floor``: the photo's noise floor, ``{metric: value}`` with the floor output registered
    to the source under :data:`~counterfactory.validation.gates.locality.FLOOR_IMAGE` and its
    :class:`~counterfactory.validation.gates.locality.FloorContext` (as a run hands a template's
    floor to its cells). ``keep_image``: also return the registered
    output under ``"image"`` (a floor case's, for the cases judged against it; None when it
    could not be registered).

    Returns ``{case, photo, label, split, verdict, reasons, metrics}`` (metrics: the
    :data:`CORPUS_METRICS` that could be measured).
    """
    record: dict[str, Any] = {"case": case.case_id, "photo": case.photo, "label": case.label, "split": case.split}
    if case.photo_set != "bundled":
        record.update(photo_set=case.photo_set, person=case.person, group=case.group)
    alignment = _align(case)
    if keep_image:
        record["image"] = alignment.image if alignment.ok else None
    if not alignment.ok:
        record.update(verdict=REJECTED, reasons=[alignment.reason.split(":")[0]], metrics={})
        return record
    record.update(_judged(case, alignment, stack, _request_extras(floor)))
    return record


def _align(case):
    from counterfactory.generation.align import align_candidate

    mask = case.region if case.region is not None else case.face_mask
    return align_candidate(case.source, case.output, mask=mask, kind="face", face_size_px=case.face_size_px)


def _request_extras(floor: dict[str, Any] | None) -> dict[str, Any] | None:
    if not floor:
        return None
    return {"noise_floor": floor, FLOOR_IMAGE: floor.get(FLOOR_IMAGE), FLOOR_CONTEXT: floor.get(FLOOR_CONTEXT)}


def _judged(case, alignment, stack, extras: dict[str, Any] | None) -> dict[str, Any]:
    """``{verdict, reasons, metrics}`` of an aligned case judged by ``stack`` with ``extras``."""
    judgement = stack.evaluate(
        case.source,
        alignment.image,
        covered=alignment.covered,
        raw_candidate=alignment.raw,
        unregistered=case.output,
        extras=extras,
    )
    metrics = judgement.metrics
    return {
        "verdict": judgement.verdict,
        "reasons": list(judgement.reasons),
        "metrics": {
            k: round(float(metrics[k]), 6)
            for k in CORPUS_METRICS
            if isinstance(metrics.get(k), (int, float)) and not isinstance(metrics.get(k), bool)
        },
    }


def measure_photo_cases(cases: list, stack, floor: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Align every case of one photo (and split) once and judge each on the three paths
    (:data:`PATHS`): ``request`` against the photo's floor case, ``cohort`` against the median
    of the other cases' registered outputs (:func:`~counterfactory.validation.cohort.cohort_floors`),
    ``none`` with nothing. Returns one record per case as :func:`measure_case` does (its
    top-level verdict, reasons and metrics are the request path's), with ``paths``:
    ``{path: {verdict, reasons, metrics}}``."""
    from counterfactory.validation.cohort import cohort_floors
    from counterfactory.validation.gates.locality import FLOOR_WORK_IMAGE
    from counterfactory.validation.segment import work_stride

    alignments = [_align(c) for c in cases]
    # one photo's cases share its source, and so its working grid
    k = work_stride(cases[0].source.shape) if cases else 1
    grids = [a.image[::k, ::k] if a.ok else None for a in alignments]
    floors = cohort_floors(grids)
    records = []
    for case, alignment, cohort in zip(cases, alignments, floors, strict=True):
        record: dict[str, Any] = {"case": case.case_id, "photo": case.photo, "label": case.label, "split": case.split}
        if case.photo_set != "bundled":
            record.update(photo_set=case.photo_set, person=case.person)
        record.update(group=case.group, direction=case.direction)
        if not alignment.ok:
            failed = {"verdict": REJECTED, "reasons": [alignment.reason.split(":")[0]], "metrics": {}}
            record.update(failed, paths={p: dict(failed) for p in PATHS})
            records.append(record)
            continue
        cohort_extras = (
            {"noise_floor": {"path": "cohort", "members": cohort.members}, FLOOR_WORK_IMAGE: cohort.image}
            if cohort is not None
            else None
        )
        paths = {
            "request": _judged(case, alignment, stack, _request_extras(floor)),
            "cohort": _judged(case, alignment, stack, cohort_extras),
            "none": _judged(case, alignment, stack, None),
        }
        record.update(paths["request"], paths=paths)
        records.append(record)
    return records


def measure_floor(case, stack) -> dict[str, Any] | None:
    """A photo's noise floor from its floor case (:func:`~counterfactory.validation.calibration.failures.build_floors`):
    :func:`noise_floor_metrics` of its record with the registered floor output under
    :data:`~counterfactory.validation.gates.locality.FLOOR_IMAGE`; None when it could not be
    measured."""
    record = measure_case(case, stack, keep_image=True)
    floor = noise_floor_metrics(record)
    if floor is None or record.get("image") is None:
        return floor
    # the floor's context: what the locality gate derives from its image, once for the photo's cases
    return {**floor, FLOOR_IMAGE: record["image"], FLOOR_CONTEXT: FloorContext(record["image"])}


def corpus_thresholds(
    train: list[dict[str, Any]],
    *,
    target: float,
    rows: tuple[tuple[str, str, str, str], ...] = CORPUS_THRESHOLDS,
    path: str | None = None,
) -> dict[str, dict[str, float]]:
    """``{gate: {threshold: value}}`` from the training split's good edits, by :data:`CORPUS_RULE`.

    Each photo set (``record["photo_set"]``, ``"bundled"`` when absent) is fitted on its own
    good edits and the loosest value kept. Pooled, a small set's tail is outvoted: on the London
    run of 2026-12-04 all 164 of the London set's good edits scored an ``excess_share`` of 0, the
    pooled quantile fell between the bundled set's two largest and rejected 3 of its 36 held-out
    good edits."""
    good = [r for r in train if r["label"] == "good"]
    if path is not None:
        good = [{**r, "metrics": ((r.get("paths") or {}).get(path) or {}).get("metrics", {})} for r in good]
    if not good:
        raise ValueError("the failure corpus has no good edits in its training split: give photos with faces")
    share = (1.0 - target) / len(CORPUS_THRESHOLDS)
    by_set: dict[str, list[dict[str, Any]]] = {}
    for r in good:
        by_set.setdefault(r.get("photo_set", "bundled"), []).append(r)
    out: dict[str, dict[str, float]] = {}
    for gate, name, metric, bound in rows:
        fits = []
        for records in by_set.values():
            v = np.asarray([r["metrics"][metric] for r in records if metric in r["metrics"]], dtype=np.float64)
            if v.size == 0:
                continue
            if bound == "max":
                q = float(np.quantile(v, 1.0 - share)) * CORPUS_MARGIN
                fits.append(sig_up(max(q, METRIC_RESOLUTION.get(metric, 0.0))))
            else:
                fits.append(sig_down(float(np.quantile(v, share)) / CORPUS_MARGIN))
        if not fits:
            raise ValueError(f"no good edit measured {metric}; the corpus is too small")
        value = max(fits) if bound == "max" else min(fits)
        if name == "min_cosine":
            # the vendor's operating point is a lower bound: an edit SFace still calls the same
            # person is never rejected, and one the corpus says is another head is
            value = max(value, OPENCV_SAME_PERSON_COSINE)
        out.setdefault(gate, {})[name] = value
    return out


def _measuring_config(base: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Face-kind gate settings that measure every corpus metric (body skin needs its threshold set)."""
    cfg = copy.deepcopy(base)
    cfg.setdefault("locality", {})["max_body_skin_delta_e"] = 1e9
    return cfg


def _stack(face_gates: dict[str, dict[str, Any]], face_mask_mode: MaskMode):
    from counterfactory.validation.gate_stack import GatesConfig, GateStack
    from counterfactory.validation.gates.registry import GATES

    # the corpus judges issue 9's gates; the skin-tone and target-attribute gates (and any
    # plug-in) judge a change against the requested condition, which a corpus case does not have
    others = {g: None for g in GATES.names() if g not in CORPUS_GATES}
    gates = {**copy.deepcopy(face_gates), **others, "kind": "face"}
    # the region the corpus's edits change is the one FOCUS's prompt names, as a run of it judges
    return GateStack.from_config(GatesConfig(face_mask=face_mask_mode, face=gates), "face", region=CORPUS_REGION)


def _rates(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per class: n, accepted / review / rejected counts, and the rate that matters (good:
    accepted; failures: caught = rejected or needs_review)."""
    out: dict[str, dict[str, Any]] = {}
    for label in CLASSES:
        rs = [r for r in records if r["label"] == label]
        if not rs:
            continue
        counts = {v: sum(r["verdict"] == v for r in rs) for v in VERDICTS}
        if label == GOOD:
            rate = counts[ACCEPTED] / len(rs)
        else:
            rate = (counts["rejected"] + counts["needs_review"]) / len(rs)
        reasons: dict[str, int] = {}
        for r in rs:
            for code in r["reasons"]:
                reasons[code] = reasons.get(code, 0) + 1
        out[label] = {
            "n": len(rs),
            **counts,
            ("acceptance" if label == GOOD else "caught"): round(rate, 4),
            "reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        }
    return out


def run_failure_corpus(
    image_paths: list[Path],
    base_face_gates: dict[str, dict[str, Any]],
    *,
    per_class: int = 4,
    seed: int = 0,
    target: float = 0.95,
    max_side: int = 512,
    face_mask_mode: MaskMode = "oval",
    progress: bool = True,
    classes: tuple[str, ...] | None = None,
    photo_sets: Sequence[PhotoSet] = (),
) -> dict[str, Any]:
    """Build the failure corpus, pick the corpus thresholds on its training split, and judge
    its held-out split with them.

    Args:
        image_paths: source photos (:func:`~counterfactory.validation.calibration.failures.build_corpus`).
        base_face_gates: face-kind gate settings the corpus does not set (backends, detection
            score, ``min_diff_face``), as in ``suggested["face"]``.
        per_class, seed, max_side: corpus size, seed and source size cap.
        target: good-edit acceptance the thresholds aim at on the training split, in (0, 1).
        classes: a subset of the corpus classes (all by default; ``good`` must be among them).
        photo_sets: more photos, each :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet`
            with its own variants per class, size and split (the London set: split by
            person, with real expression pairs); ``image_paths`` are the ``bundled`` set,
            held out by variant.

    Returns: ``{"config", "rule", "thresholds", "heldout": per-class rates,
    "good_acceptance_heldout", "min_caught_heldout", "cases": [records]}``; held-out verdicts
    come from the gate stack built with the chosen thresholds, exactly as a run judges.
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target acceptance must be in (0, 1), got {target}")
    measuring = _stack(_measuring_config(base_face_gates), face_mask_mode)
    # each photo's noise floor: its "unchanged" output, measured like any case; every case of
    # the photo is judged relative to it, as a run judges a template's cells
    sets = [PhotoSet("bundled", tuple(Path(p) for p in image_paths), per_class, max_side), *photo_sets]
    sets = [s for s in sets if s.paths]
    if len({s.name for s in sets}) != len(sets):
        raise ValueError(f"photo sets need distinct names, got {[s.name for s in sets]}")
    floor_cases = itertools.chain.from_iterable(build_floors([], seed=seed, photo_set=s) for s in sets)
    floors = {
        f"{c.photo_set}/{c.photo}": measure_floor(c, measuring)
        for c in with_progress(floor_cases, progress, "noise floors", unit="photo")
    }

    def measured(split: str, stack) -> list:
        # streamed photo by photo: a photo's cases are measured together (the cohort path
        # judges each against the others) and their images dropped once they are
        cases = itertools.chain.from_iterable(
            build_set_corpus(s, seed=seed, splits=(split,), classes=classes) for s in sets
        )
        out: list[dict[str, Any]] = []
        for _, group in itertools.groupby(
            with_progress(cases, progress, f"corpus {split.replace('heldout', 'held-out')}", unit="case"),
            key=lambda c: (c.photo_set, c.photo),
        ):
            group = list(group)
            out.extend(measure_photo_cases(group, stack, floors.get(f"{group[0].photo_set}/{group[0].photo}")))
        return out

    train = measured("train", measuring)
    chosen = corpus_thresholds(train, target=target)
    face_gates = copy.deepcopy(base_face_gates)
    for gate, values in chosen.items():
        face_gates.setdefault(gate, {}).update(values)
    # each judging path's own locality limits, fitted on its own measures of the same cases
    for path in ("cohort", "none"):
        fitted = corpus_thresholds(train, target=target, rows=PATH_LOCALITY[path], path=path)["locality"]
        own = {name: fitted.get(name) for name in PATH_THRESHOLDS}
        chosen.setdefault("paths", {})[path] = own
        face_gates["locality"][PATH_CONFIG_KEY[path]] = own
    # copies are caught by locality.min_diff_face (review); a cosine ceiling would also send
    # strongly recoloured faces to review, which SFace scores as copies by design
    face_gates["identity"]["max_cosine"] = None
    # FOCUS's raw figures (mean difference outside the face, face/non-face ratio) are kept in
    # every record for comparison, not judged: a latent autoencoder's re-rendering alone moves
    # diff_nonface past a no-op ceiling (grace_hopper 0.0176, FOCUS's own mean 0.022); the
    # band-limited measures above tell re-rendering from content change
    face_gates.setdefault("locality", {}).update({k: None for k in FOCUS_RAW_THRESHOLDS})
    judging = _stack(face_gates, face_mask_mode)
    heldout = measured("heldout", judging)
    rates = _rates(heldout)
    by_set = {s.name: _rates([r for r in heldout if r.get("photo_set", "bundled") == s.name]) for s in sets}
    groups = sorted({r["group"] for r in heldout if r.get("group")})
    by_group = {
        g: {
            label: {k: v[k] for k in ("n", "acceptance", "caught") if k in v}
            for label, v in _rates([r for r in heldout if r.get("group") == g]).items()
        }
        for g in groups
    }
    by_path = {path: path_figures(heldout, path) for path in PATHS}
    caught = [v["caught"] for k, v in rates.items() if k != GOOD]
    good = [r["metrics"] for r in train + heldout if r["label"] == GOOD]

    def stat(key: str, fn) -> float | None:
        v = [m[key] for m in good if key in m]
        return round(float(fn(v)), 6) if v else None

    # FOCUS measured its 480 edits without registration at the source's size: the same
    # figures for the corpus's good edits, and the registered ones beside them
    focus = {
        "n": len(good),
        "focus_diff_face_mean": stat("locality.focus_diff_face", np.mean),
        "focus_diff_nonface_mean": stat("locality.focus_diff_nonface", np.mean),
        "focus_ratio_median": stat("locality.focus_ratio", np.median),
        "registered_diff_face_mean": stat("locality.diff_face", np.mean),
        "registered_diff_nonface_mean": stat("locality.diff_nonface", np.mean),
        "registered_ratio_median": stat("locality.ratio", np.median),
    }
    return {
        "config": {
            "per_class": per_class,
            "seed": seed,
            "target": target,
            "max_side": max_side,
            "photo_sets": {
                s.name: {
                    "photos": len(s.paths),
                    "people": len({s.person_of(p) for p in s.paths}),
                    "per_class": s.per_class,
                    "max_side": s.max_side,
                    "split_by": s.split_by,
                    "pairs": len(s.pairs),
                }
                for s in sets
            },
        },
        "classes": CLASSES,
        "rule": CORPUS_RULE,
        "thresholds": chosen,
        "face_gates": face_gates,
        "heldout": rates,
        "heldout_by_set": by_set,
        "heldout_by_group": by_group,
        "heldout_by_path": by_path,
        "good_acceptance_heldout": rates.get(GOOD, {}).get("acceptance"),
        "min_caught_heldout": min(caught) if caught else None,
        "good_edits_locality": focus,
        # the floors' measures (their registered images stay out of the JSON)
        "noise_floors": {k: _without_image(v) for k, v in floors.items()},
        "cases": train + heldout,
    }


def on_path(records: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """``records`` with their verdict, reasons and metrics as judged on ``path``."""
    out = []
    for r in records:
        judged = (r.get("paths") or {}).get(path)
        out.append({**r, **judged} if judged else r)
    return out


def _share(hits: int, n: int) -> float | None:
    return round(hits / n, 4) if n else None


def path_figures(heldout: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """What one judging path does on the held-out split: per class (:func:`_rates`), good-edit
    acceptance per group (stated, or skin-tone tertile) and per direction of the edit (lighter,
    darker) with the largest gap between groups, the failure classes' lowest catch rate, the
    share of identity swaps the identity gate itself caught and of real smiles the expression
    gate itself caught (not registration), and where good edits and swaps overlap on the
    identity cosine per group."""
    records = on_path(heldout, path)
    rates = _rates(records)
    good = [r for r in records if r["label"] == GOOD]

    def acceptance(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"n": len(rs), "acceptance": _share(sum(r["verdict"] == ACCEPTED for r in rs), len(rs))}

    groups = {
        g: acceptance([r for r in good if r.get("group") == g]) for g in sorted({r.get("group", "") for r in good})
    }
    directions = {d: acceptance([r for r in good if r.get("direction") == d]) for d in ("lighter", "darker") if d}
    known = [v["acceptance"] for v in groups.values() if v["acceptance"] is not None]
    swaps = [r for r in records if r["label"] == "identity_swap"]
    smiles = [r for r in records if r["label"] == "expression_real"]
    overlap: dict[str, Any] = {}
    for g in sorted({r.get("group", "") for r in swaps}):
        good_cos = [
            r["metrics"]["identity.cosine"] for r in good if r.get("group") == g and "identity.cosine" in r["metrics"]
        ]
        swap_cos = [
            r["metrics"]["identity.cosine"] for r in swaps if r.get("group") == g and "identity.cosine" in r["metrics"]
        ]
        overlap[g] = {
            "good_min": round(min(good_cos), 4) if good_cos else None,
            "swap_max": round(max(swap_cos), 4) if swap_cos else None,
            "swaps_above_good_min": sum(c >= min(good_cos) for c in swap_cos) if good_cos else None,
        }
    failures = [v["caught"] for k, v in rates.items() if k != GOOD]
    return {
        "classes": rates,
        "good_by_group": groups,
        "good_by_direction": directions,
        "largest_group_gap": round(max(known) - min(known), 4) if known else None,
        "min_caught": min(failures) if failures else None,
        "identity_swaps_caught_by_identity": _share(
            sum(any(c.startswith("identity_") for c in r["reasons"]) for r in swaps), len(swaps)
        ),
        "real_smiles_caught_by_expression": _share(
            sum(any(c.startswith("expression_") for c in r["reasons"]) for r in smiles), len(smiles)
        ),
        "identity_overlap_by_group": overlap,
    }


def _without_image(floor: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if floor is None else {k: v for k, v in floor.items() if k not in (FLOOR_IMAGE, FLOOR_CONTEXT)}


def plot_failures(corpus: dict[str, Any], path_png: str | Path) -> Path:
    """One panel per corpus metric: every case's value by class (training dots grey, held-out
    coloured by verdict), the chosen threshold as a red line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(corpus["classes"])
    cases = corpus["cases"]
    panels = CORPUS_THRESHOLDS
    cols = 4
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows))
    colours = {ACCEPTED: "C2", NEEDS_REVIEW: "C1", REJECTED: "C3", FAILED: "k"}
    for ax, (gate, name, metric, bound) in zip(axes.ravel(), panels):
        for i, label in enumerate(labels):
            for r in cases:
                if r["label"] != label or metric not in r["metrics"]:
                    continue
                jitter = (hash(r["case"]) % 1000) / 1000 * 0.5 - 0.25
                colour = "0.6" if r["split"] == "train" else colours.get(r["verdict"], "k")
                ax.plot(i + jitter, r["metrics"][metric], ".", color=colour, ms=4)
        ax.axhline(corpus["thresholds"][gate][name], color="C3", lw=1)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{metric} ({bound} {corpus['thresholds'][gate][name]:g})", fontsize=9)
        if metric in ("locality.changed_share", "locality.diff_nonface", "locality.global_shift"):
            ax.set_yscale("symlog", linthresh=1e-3)
    for ax in axes.ravel()[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"failure corpus: grey = training split, held-out coloured by verdict "
        f"(green accepted, orange review, red rejected); held-out good acceptance "
        f"{corpus['good_acceptance_heldout']:.1%}, lowest failure catch {corpus['min_caught_heldout']:.1%}"
    )
    fig.tight_layout()
    path = Path(path_png)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
