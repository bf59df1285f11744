"""A seeded, labelled corpus of what image editors get wrong, made from real photos.

Each case is a source photo and an "editor output" made from it: a *good* face-only edit, or
a good edit with one failure on top, re-rendered through a real latent autoencoder (TAEF2,
as a diffusion editor's decoder re-synthesises every pixel), then editor jitter and
re-encoding, as a diffusion editor returns it (a 1-3 px shift, a 0.5-2 % zoom about the centre, a resize to about 1 MP in
multiples of 16, JPEG at quality 85-95). The gates must accept the good edits and catch
(reject, or send to review) every failure class.

Good edits change only the edit region FOCUS's prompt names (:data:`~counterfactory.validation.calibration.corpus_edits.CORPUS_REGION`: face, neck
to the clothing line, ears, forehead to the hairline), as a study asks for them (issue 34):

- ``skin_tone``: the region's skin lighter or darker by 8-15 L* (:data:`~counterfactory.validation.calibration.corpus_edits.GOOD_L_RANGE`), a*b*
  moved by up to 5;
- ``colour_transfer``: the region's CIELAB hue and spread moved to another person's face
  (Reinhard et al., "Color Transfer between Images", 2001), its lightness by 8-15 L* either way;
- half of them also a ``feature_morph``: nose width, lip fullness and jaw width moved part of
  the way toward the proportions of a person of another group (:func:`~counterfactory.validation.calibration.corpus_edits.face_proportions`), each
  factor within 0.85-1.15, with smooth local warps inside the face.

Failure classes, each on top of a good edit (``CLASSES`` describes them):

- ``expression``: mouth corners lifted (smile) or lowered (frown) by 0.07-0.14 inter-ocular
  distances, or brows raised by 0.08-0.15;
- ``expression_real``: the same person photographed smiling in the same session (a photo set's
  ``pairs``: the London set), placed in the source's frame on the head outline, ears and neck
  (:func:`~counterfactory.validation.calibration.photo_sets.register_pair`), its edit region pasted into the
  source (everything outside it stays the source's, so registration is not what tells it), then
  a good edit: a real expression change, which no synthetic warp reproduces exactly; made only
  where a pair exists;
- ``identity_swap``: another person's face of similar skin lightness (never the same person), aligned on the
  five face-recognition keypoints, colour-matched and blended into the oval;
- ``noop_copy``: the source with jitter and re-encoding only: the editor did nothing;
- ``object_added``: a patch of another photo, 2-5 % of the image, pasted away from the face;
- ``text_added``: a line of text, 1-3 % of the image, written away from the face;
- ``object_removed``: the most textured region away from the face (2-5 % of the image)
  painted over by inpainting (Telea, 2004), as an editor erasing an object does;
- the three local failures are made only where they are visible (a mean CIELAB change of at
  least :data:`~counterfactory.validation.calibration.corpus_edits.MIN_VISIBLE_DELTA_E` over their own pixels, a few placements tried); a photo
  with nothing visible to erase, or only patches like its wall, gets none of that class;
- "away from the face" means outside the edit region too (the visible neck down to the
  clothing line, grown by :data:`~counterfactory.validation.calibration.corpus_edits.LOCAL_FAILURE_REGION_MARGIN` face sizes): a change inside it
  is one the prompt allows, not a locality failure;
- ``body_skin``: the good edit's skin change applied to the person's skin outside the edit
  region too (chest, shoulders, hands, arms): the body skin the locality gate measures, found
  on the unedited photo; photos with less than 0.4 % of it (a portrait in a T-shirt, whose
  visible neck belongs to the region) get none of that class;
- ``global_colour``: a colour cast, a white-balance shift, or a contrast change of the whole
  image (8-20 grey levels, or contrast x0.85-0.9 / x1.12-1.2);
- ``head_pose``: the head (face oval grown by half the face size) rotated in the image plane
  by 9-16 degrees about the chin;
- ``head_position``: the head moved by 0.2-0.35 face sizes, the background behind inpainted;
- ``hair``: the hair around the head (the person outside the grown face oval and the edit
  region, above the eyes) made lighter, darker or another hue, whichever of them is visible
  first (black hair made darker is not). The design does NOT allow hair changes: like FOCUS's prompt, which asks
  the editor to keep hairstyle and everything but the face's demographic cues, it varies
  only the face; hair lies outside the face mask and is measured as non-face.

Every class is made ``per_class`` times per photo (good edits :data:`GOOD_MULTIPLIER` times
as often) with its own seed. The held-out split, which
:mod:`counterfactory.validation.calibration.corpus_fit` never uses to pick thresholds, is either the odd
variant indices (held-out cases share photos with the training split, never parameters or
jitter) or, for a :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet` split by person,
every case of half the people (balanced per group). Only photos with exactly one face are used: a face design refuses other sources. Sources are scaled to at most ``max_side`` pixels first (the gates' cost grows with
the pixel count; the measures are size-free).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactory.generation.masks import feather
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.calibration.corpus_edits import (
    CORPUS_REGION,
    _blend,
    _body_skin,
    _expression,
    _global_colour,
    _hair,
    _head_pose,
    _head_position,
    _identity_swap,
    _object_added,
    _object_removed,
    _text_added,
    editor_jitter,
    face_proportions,
    good_edit,
)
from counterfactory.validation.calibration.photo_sets import (
    MESH_RIGID,
    TEM_RIGID,
    PhotoSet,
    person_splits,
    read_tem,
    register_pair,
)
from counterfactory.validation.faces import (
    FaceObservation,
    face_mask,
    get_face_landmarker,
    region_mask,
)
from counterfactory.validation.metrics.pixels import to_lab
from counterfactory.validation.segment import get_person_segmenter, work_stride

GOOD = "good"
#: Every class of the corpus and what it is.
CLASSES: dict[str, str] = {
    GOOD: "face-only edit: the skin of face, neck and ears lighter or darker by 8-15 L*, by a tone shift or a colour transfer, half with a morph toward another group",
    "expression": "good edit + smile, frown or raised brows",
    "expression_real": "good edit of the same person's own smiling photo, same session, registered",
    "identity_swap": "good edit + another person's face pasted in",
    "noop_copy": "the source unchanged (jitter and re-encoding only)",
    "object_added": "good edit + a pasted object away from the face",
    "text_added": "good edit + text written away from the face",
    "object_removed": "good edit + a textured region painted over",
    "body_skin": "good edit + the same skin change on skin outside the region (chest, shoulders, hands, arms)",
    "global_colour": "good edit + colour cast, white balance or contrast change",
    "head_pose": "good edit + head rotated in the image plane",
    "head_position": "good edit + head moved",
    "hair": "good edit + hair recoloured (not allowed by the design)",
}
FAILURE_CLASSES = tuple(c for c in CLASSES if c != GOOD)
#: Good edits are made this many times more often than each failure: every gate's threshold
#: rests on their spread, and acceptance is judged on them.
GOOD_MULTIPLIER = 4


@dataclass(frozen=True)
class Case:
    """One labelled corpus pair.

    Attributes:
        case_id: ``photo:class:index``, unique and stable.
        photo: the source file's name.
        label: a key of :data:`CLASSES`.
        split: ``train`` (threshold rules see it) or ``heldout`` (they never do).
        source: ``(H, W, 3)`` uint8 RGB, the source as the factory would hold it.
        output: ``(h, w, 3)`` uint8 RGB as an editor returns it (other size, jittered, re-encoded).
        face_mask: ``(H, W)`` uint8 {0, 255} face oval of ``source``.
        face_size_px: the source face's size, pixels.
        params: what was done, for the record (JSON-ready).
    """

    case_id: str
    photo: str
    label: str
    split: str
    source: np.ndarray
    output: np.ndarray
    face_mask: np.ndarray
    face_size_px: float
    params: dict[str, Any] = field(default_factory=dict)
    #: the :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet` the photo comes from
    photo_set: str = "bundled"
    person: str = ""
    group: str = ""
    #: ``(H, W)`` uint8 {0, 255}: the edit region the good edit changes (:data:`~counterfactory.validation.calibration.corpus_edits.CORPUS_REGION`:
    #: face, neck, ears and facial hair, as FOCUS's prompt names them); None: the oval
    region: np.ndarray | None = None
    #: the good edit's direction of skin lightness: ``lighter``, ``darker`` or ``""``
    direction: str = ""


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def split_of(index: int) -> str:
    """``train`` for even variant indices, ``heldout`` for odd ones."""
    return "heldout" if index % 2 else "train"


# ---------------------------------------------------------------------------------------
# the corpus


@dataclass
class _Photo:
    name: str
    person: str
    image: np.ndarray
    face: FaceObservation
    oval: np.ndarray
    face_lab: np.ndarray  # (2, 3): mean and std of the face's CIELAB
    group: str = ""
    #: the same person in another expression, in this photo's frame: (image, face, oval, registration)
    pair: tuple[np.ndarray, FaceObservation, np.ndarray, dict[str, float]] | None = None
    #: the edit region (:data:`~counterfactory.validation.calibration.corpus_edits.CORPUS_REGION`), drawn with the person and the photo
    region: np.ndarray | None = None
    #: :func:`~counterfactory.validation.calibration.corpus_edits.face_proportions`
    shape: np.ndarray | None = None


def _scaled(image: np.ndarray, max_side: int) -> tuple[np.ndarray, float]:
    h, w = image.shape[:2]
    s = min(1.0, max_side / max(h, w))
    if s < 1.0:
        image = cv2.resize(image, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
    return image, s


def _paired(photo_set: PhotoSet, path: Path, image: np.ndarray, face: FaceObservation, s: float):
    """The set's other-expression photo of ``path``, registered into ``image``'s frame, or None."""
    other_path = photo_set.pairs.get(path)
    if other_path is None:
        return None
    other, s_other = _scaled(load_rgb(other_path), photo_set.max_side)
    landmarker = get_face_landmarker()
    tem, tem_other = photo_set.landmarks.get(path), photo_set.landmarks.get(other_path)
    if tem is not None and tem_other is not None:
        points = read_tem(tem)[list(TEM_RIGID)] * s
        points_other = read_tem(tem_other)[list(TEM_RIGID)] * s_other
    else:
        found = landmarker.detect(other)
        if len(found) != 1:
            return None
        points = face.landmarks[list(MESH_RIGID), :2]
        points_other = found[0].landmarks[list(MESH_RIGID), :2]
    warped, registration = register_pair(image, other, points, points_other)
    faces = landmarker.detect(warped)
    if len(faces) != 1:
        return None
    return warped, faces[0], face_mask(faces[0].landmarks, warped.shape[:2], mode="oval"), registration


def _load_photos(paths: list[Path], max_side: int, photo_set: PhotoSet | None = None) -> list[_Photo]:
    landmarker = get_face_landmarker()
    photos = []
    for path in paths:
        image, s = _scaled(load_rgb(path), max_side)
        faces = landmarker.detect(image)
        if len(faces) != 1:
            # a face design takes sources with exactly one face (others fail as sources)
            continue
        face = faces[0]
        oval = face_mask(face.landmarks, image.shape[:2], mode="oval")
        person = (photo_set or PhotoSet("", (), 1)).person_of(Path(path))
        lab = to_lab(image)[oval > 0]
        k = work_stride(image.shape)
        segmented = get_person_segmenter().segment(np.ascontiguousarray(image[::k, ::k]))
        region = region_mask(face.landmarks, image.shape[:2], CORPUS_REGION, person=segmented, image=image)
        photos.append(
            _Photo(
                Path(path).name,
                person,
                image,
                face,
                oval,
                np.stack([lab.mean(0), lab.std(0)]),
                group=(photo_set.groups.get(person, "") if photo_set is not None else ""),
                pair=_paired(photo_set, Path(path), image, face, s) if photo_set is not None else None,
                region=region,
                shape=face_proportions(face),
            )
        )
    _tone_groups(photos)
    return photos


def _tone_groups(photos: list[_Photo]) -> None:
    """Photos whose set states no group get their face's skin-lightness tertile within the
    set (``tone_1`` darkest .. ``tone_3``), so figures per group cover every photo."""
    unstated = [p for p in photos if not p.group]
    if len(unstated) < 3:
        for p in unstated:
            p.group = "tone_unknown"
        return
    lightness = np.array([p.face_lab[0, 0] for p in unstated])
    cuts = np.quantile(lightness, [1 / 3, 2 / 3])
    for p, value in zip(unstated, lightness, strict=True):
        p.group = f"tone_{1 + int(np.searchsorted(cuts, value, side='right'))}"


def build_corpus(
    paths: list[Path],
    *,
    per_class: int = 4,
    seed: int = 0,
    max_side: int = 512,
    splits: tuple[str, ...] = ("train", "heldout"),
    classes: tuple[str, ...] | None = None,
    rerender: bool = True,
) -> Iterator[Case]:
    """Yield the corpus cases photo by photo, class by class (see the module docstring),
    held out by variant (:func:`build_set_corpus` for a photo set split by person).

    Args:
        paths: source photos; each needs exactly one face, as a face design's sources do
            (others, such as ``two_people.jpg``, are skipped). Identity
            swaps take their donor from another photo of another person, so at least two
            people must be present for that class.
        per_class: variants per class and photo (good edits: :data:`GOOD_MULTIPLIER` times as
            many); odd indices are held out.
        seed: the corpus seed; the same seed gives byte-identical cases.
        max_side: sources larger than this are scaled down first, pixels.
        splits: which splits to yield.
        classes: which classes to make (all of :data:`CLASSES` by default).
        rerender: pass every case (the no-op copies too) through the TAEF2 latent autoencoder
            (:mod:`counterfactory.generation.rerender`) at its own size before the jitter, as
            a diffusion editor's decoder re-synthesises every pixel it returns.

    A failure that cannot be made on a photo (no room away from the face for an object, no
    skin visible outside the head, no photo of the person's other expression) is skipped for
    that photo.
    """
    photo_set = PhotoSet("bundled", tuple(Path(p) for p in paths), per_class, max_side)
    yield from build_set_corpus(photo_set, seed=seed, splits=splits, classes=classes, rerender=rerender)


def build_set_corpus(
    photo_set: PhotoSet,
    *,
    seed: int = 0,
    splits: tuple[str, ...] = ("train", "heldout"),
    classes: tuple[str, ...] | None = None,
    rerender: bool = True,
    variants: int | None = None,
) -> Iterator[Case]:
    """:func:`build_corpus` over one :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet`:
    its photos, variants per class, size cap, split (by variant or by person) and pairs.
    Donors (identity swaps, colour transfers, pasted objects) are other people of the set.
    ``variants``: how many of each class per photo (the first ones, with their seeds), instead of
    the set's ``per_class`` (times :data:`GOOD_MULTIPLIER` for good edits)."""
    photos = _load_photos(list(photo_set.paths), photo_set.max_side, photo_set)
    by_person = (
        person_splits([p.person for p in photos], {p.person: p.group for p in photos}, seed)
        if photo_set.split_by == "person"
        else None
    )
    wanted = classes or tuple(CLASSES)
    for photo in photos:
        others = [p for p in photos if p.person != photo.person]
        for label in wanted:
            count = photo_set.per_class * (GOOD_MULTIPLIER if label == GOOD else 1)
            for index in range(count if variants is None else variants):
                split = by_person[photo.person] if by_person is not None else split_of(index)
                if split not in splits:
                    continue
                rng = np.random.default_rng(_seed(seed, photo.name, label, index))
                donor = others[int(rng.integers(0, len(others)))] if others else None
                if label == "identity_swap" and others:
                    # a donor of similar skin lightness: the identity gate, not the tone, decides
                    near = sorted(others, key=lambda p: abs(p.face_lab[0, 0] - photo.face_lab[0, 0]))[:3]
                    donor = near[int(rng.integers(0, len(near)))]
                case = _make_case(
                    photo, label, index, split, rng, donor, seed, rerender, _shape_donor(photo, others, rng)
                )
                if case is not None:
                    yield dataclasses.replace(
                        case,
                        photo_set=photo_set.name,
                        person=photo.person,
                        group=photo.group,
                        region=photo.region,
                        direction=case.params.get("direction", ""),
                    )


def _shape_donor(photo: _Photo, others: list[_Photo], rng: np.random.Generator) -> np.ndarray | None:
    """The face proportions a good edit's morph moves toward: a person of another group
    (stated, or another skin-tone tertile) when the set has one, else another person."""
    pool = [p for p in others if p.group != photo.group] or others
    if not pool:
        return None
    return pool[int(rng.integers(0, len(pool)))].shape


#: the label of a photo's noise-floor case (:func:`build_floors`): not a corpus class
FLOOR = "floor"


def build_floors(
    paths: list[Path], *, seed: int = 0, max_side: int = 512, rerender: bool = True, photo_set: PhotoSet | None = None
) -> Iterator[Case]:
    """One noise-floor case per one-face photo: the source unchanged, re-rendered and jittered
    with its own seed, as an editor answers the request "return this photo unchanged".

    The corpus judges every case of a photo relative to it, as a run judges every cell of a
    template relative to the editor's floor request for that template. With ``photo_set``,
    its photos and size cap replace ``paths`` and ``max_side``.
    """
    if photo_set is not None:
        paths, max_side = list(photo_set.paths), photo_set.max_side
    name = photo_set.name if photo_set is not None else "bundled"
    for photo in _load_photos([Path(p) for p in paths], max_side):
        rng = np.random.default_rng(_seed(seed, photo.name, FLOOR, 0))
        case = _make_case(photo, "noop_copy", 0, FLOOR, rng, None, seed, rerender)
        yield dataclasses.replace(
            case, case_id=f"{photo.name}:{FLOOR}", label=FLOOR, photo_set=name, region=photo.region
        )


def _make_case(
    photo: _Photo,
    label: str,
    index: int,
    split: str,
    rng,
    donor: _Photo | None,
    seed: int,
    rerender: bool = True,
    shape_donor: np.ndarray | None = None,
) -> Case | None:
    image, face, oval = photo.image, photo.face, photo.oval
    params: dict[str, Any] = {}
    if label == "noop_copy":
        edited = image
    elif label == "expression_real":
        if photo.pair is None:
            return None
        pair_image, pair_face, pair_oval, registration = photo.pair
        # the smiling face, registered on the rigid points, in the neutral photo: everything
        # outside the edit region stays the neutral photo's (the sitter's shoulders and the
        # lighting move between two shots), so the expression, not the registration, decides
        where = photo.region if photo.region is not None else oval
        composite = _blend(image, pair_image, feather(where, max(2.0, 0.05 * face.size_px)))
        edited, params = good_edit(
            composite, face, oval, rng, donor.face_lab if donor is not None else None, photo.region, shape_donor
        )
        params["registration"] = registration
    else:
        donor_lab = donor.face_lab if donor is not None else None
        edited, params = good_edit(image, face, oval, rng, donor_lab, photo.region, shape_donor)
        failure = None
        if label == "expression":
            failure = _expression(edited, face, oval, rng)
        elif label == "identity_swap":
            if donor is None:
                return None
            failure = _identity_swap(edited, face, oval, rng, (donor.image, donor.face, donor.name))
        elif label == "object_added":
            pool = donor.image if donor is not None else image[::-1, ::-1]
            failure = _object_added(edited, face, oval, rng, pool, photo.region)
        elif label == "text_added":
            failure = _text_added(edited, face, oval, rng, photo.region)
        elif label == "object_removed":
            failure = _object_removed(edited, face, oval, rng, photo.region)
        elif label == "body_skin":
            failure = _body_skin(edited, face, oval, rng, params, photo.region, image)
        elif label == "global_colour":
            failure = _global_colour(edited, face, oval, rng)
        elif label == "head_pose":
            failure = _head_pose(edited, face, oval, rng)
        elif label == "head_position":
            failure = _head_position(edited, face, oval, rng)
        elif label == "hair":
            failure = _hair(edited, face, oval, rng, photo.region)
        elif label != GOOD:
            raise ValueError(f"unknown corpus class {label!r}; known: {', '.join(CLASSES)}")
        if failure is not None:
            edited, extra = failure
            if edited is None:
                return None
            params.update(extra)
    if rerender:
        from counterfactory.generation.rerender import rerender_like

        edited = rerender_like(edited, edited.shape)
        params["rerendered"] = "taef2"
    output, jitter = editor_jitter(edited, rng)
    params["jitter"] = jitter
    return Case(
        case_id=f"{photo.name}:{label}:{index}",
        photo=photo.name,
        label=label,
        split=split,
        source=image,
        output=output,
        face_mask=oval,
        face_size_px=face.size_px,
        params=params,
    )
