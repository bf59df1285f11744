"""A faulty editor for the pilot loop's tests: seeded, it returns good edits and each failure
class of the failure corpus at known rates per group, re-rendered through TAEF2 and jittered.

A test-side plug-in (registered on import, as :mod:`tests.flows.plugin_editor` is), not a
``generation/editors`` backend: what it makes is the calibration corpus's cases
(:func:`counterfactory.validation.calibration.failures._make_case`), which a user's study has
no use for, and its truth (which class each output is) is what a simulated reviewer reads
from the ledger (``meta["faulty_class"]``) to vote. ``backend: faulty`` in a spec selects it.

Per attempt, with a generator seeded by ``(seed, attempt id)``: a class is drawn by
``rates`` (class -> weight; ``group_rates["axis=value"]`` replaces the weights of the cells of
that condition); the source is read as the corpus reads a photo (landmarks, oval, the prompt's
edit region with the person segmented, its skin colour and proportions); the case is made on it
with a donor of ``donors`` (other people's photos: colour transfers, identity swaps, pasted
objects), re-rendered and jittered. A class that cannot be made on the photo (no body skin
visible, no room for an object away from the face, no smiling photo of the person) is a good
edit, recorded as ``wanted``. A request without a condition (the noise floor) is the source
re-rendered and jittered, as the corpus's floor case.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.editors.base import EditJournal, EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS

#: the default weights: two good edits in three, the rest spread over the failure classes a
#: run can make on a single photo (``expression_real`` needs a second photo of the person)
DEFAULT_RATES = {
    "good": 0.62,
    "expression": 0.04,
    "identity_swap": 0.04,
    "noop_copy": 0.04,
    "object_added": 0.04,
    "text_added": 0.04,
    "object_removed": 0.03,
    "body_skin": 0.04,
    "global_colour": 0.03,
    "head_pose": 0.03,
    "head_position": 0.02,
    "hair": 0.03,
}


class FaultyOptions(BaseModel):
    """``editor.faulty`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0)
    rates: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_RATES))
    group_rates: dict[str, dict[str, float]] = Field(default_factory=dict)
    #: photos of other people (identity swaps, colour transfers, pasted objects)
    donors: list[Path] = Field(default_factory=list)
    donor_side: int = Field(384, ge=64)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def read_photo(image: np.ndarray, name: str):
    """``image`` as the failure corpus reads a photo (a ``failures._Photo``), or None without
    exactly one face."""
    from counterfactory.validation.calibration.corpus_edits import CORPUS_REGION, face_proportions
    from counterfactory.validation.calibration.failures import _Photo
    from counterfactory.validation.faces import face_mask, get_face_landmarker, region_mask
    from counterfactory.validation.metrics.pixels import to_lab
    from counterfactory.validation.segment import get_person_segmenter, work_stride

    faces = get_face_landmarker().detect(image)
    if len(faces) != 1:
        return None
    face = faces[0]
    oval = face_mask(face.landmarks, image.shape[:2], mode="oval")
    lab = to_lab(image)[oval > 0]
    k = work_stride(image.shape)
    person = get_person_segmenter().segment(np.ascontiguousarray(image[::k, ::k]))
    region = region_mask(face.landmarks, image.shape[:2], CORPUS_REGION, person=person, image=image)
    return _Photo(
        name,
        name,
        image,
        face,
        oval,
        np.stack([lab.mean(0), lab.std(0)]),
        group="",
        region=region,
        shape=face_proportions(face),
    )


class FaultyEditor:
    name = "faulty"

    def __init__(self, options: FaultyOptions) -> None:
        self.options = options
        self.calls = 0
        self._donors: list | None = None

    def lineage(self) -> dict[str, Any]:
        o = self.options
        return {
            "backend": self.name,
            "seed": o.seed,
            "rates": dict(sorted(o.rates.items())),
            "group_rates": {g: dict(sorted(r.items())) for g, r in sorted(o.group_rates.items())},
            "donors": len(o.donors),
        }

    def consumes(self, kind: str) -> frozenset[str]:
        return frozenset({"prompt", "seed"})

    def prepare(self) -> None:
        return None

    def donors(self) -> list:
        if self._donors is None:
            from counterfactory.validation.calibration.base import load_rgb
            from counterfactory.validation.calibration.failures import _scaled

            found = []
            for path in self.options.donors:
                image, _ = _scaled(load_rgb(path), self.options.donor_side)
                photo = read_photo(image, Path(path).stem)
                if photo is not None:
                    found.append(photo)
            self._donors = found
        return self._donors

    def draw(self, request: EditRequest, rng: np.random.Generator) -> str:
        """The class of this attempt's output, by its condition's rates."""
        weights = dict(self.options.rates)
        for axis, value in sorted(request.condition.items()):
            weights.update(self.options.group_rates.get(f"{axis}={value}", {}))
        names = sorted(k for k, w in weights.items() if w > 0)
        p = np.array([weights[k] for k in names], float)
        return str(names[int(rng.choice(len(names), p=p / p.sum()))])

    def edit(self, request: EditRequest) -> EditResult:
        from counterfactory.validation.calibration.failures import _make_case

        self.calls += 1
        rng = np.random.default_rng(_seed(self.options.seed, request.attempt_id))
        photo = read_photo(np.ascontiguousarray(request.image), request.attempt_id[:12])
        if photo is None:
            return EditResult(request.attempt_id, "failed", reason="faulty: no single face in the source")
        if not request.condition:  # the noise floor: the photo unchanged, re-rendered and jittered
            case = _make_case(photo, "noop_copy", 0, "floor", rng, None, self.options.seed)
            return EditResult(request.attempt_id, "ok", image=case.output, metadata={"faulty_class": "floor"})
        wanted = self.draw(request, rng)
        donors = self.donors()
        donor = donors[int(rng.integers(0, len(donors)))] if donors else None
        if wanted == "identity_swap" and donors:
            near = sorted(donors, key=lambda p: abs(p.face_lab[0, 0] - photo.face_lab[0, 0]))[:3]
            donor = near[int(rng.integers(0, len(near)))]
        shape_donor = donor.shape if donor is not None else None
        case = _make_case(photo, wanted, 0, "pilot", rng, donor, self.options.seed, True, shape_donor)
        made = wanted
        if case is None:
            made = "good"
            case = _make_case(photo, "good", 0, "pilot", rng, donor, self.options.seed, True, shape_donor)
        meta = {"faulty_class": made, "direction": case.params.get("direction", "")}
        if made != wanted:
            meta["wanted"] = wanted
        return EditResult(request.attempt_id, "ok", image=case.output, metadata=meta)

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return [self.edit(r) for r in requests]


EDITORS.register("faulty", FaultyOptions, FaultyEditor)
