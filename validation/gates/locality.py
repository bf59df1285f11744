"""Locality gate: did the pixels change only where the study varies them?

FOCUS's measure: the mean absolute pixel difference, with pixels in [0, 1] and averaged over
the three channels, inside the face mask (``diff_face``) and outside it (``diff_nonface``),
and their ratio. Over FOCUS's 480 edits: mean diff_face 0.141, mean diff_nonface 0.022,
median ratio 8.16. Limb cells (InclusiveCFImageBias) keep every pixel outside the limb mask:
``diff_outside_edit`` is 0 after compositing, and the face (outside the limb mask) must not
drift (``diff_face_drift``).

The face mask is the source's MediaPipe face mesh, drawn as the full oval or as skin without
hair, eyes, brows and lips (``gates.face_mask``); the choice is recorded as ``mask_mode``.
What ``skin`` mode cuts out of the face (eyes, brows, lips, upper forehead) is neither face
nor non-face for the ratio: FOCUS's split is the face against everything *outside the oval*,
so ``diff_nonface`` is always measured outside the oval.

Means over a large area hide local and global failures, so face edits are also judged by:

- ``changed_share``: the share of pixels away from the face (outside the oval grown by
  :data:`FACE_MARGIN_FRAC` of the face size, and :data:`BORDER_FRAC` in from the image edge,
  where registration resamples) whose smoothed difference exceeds :data:`LOCAL_CHANGE_LEVEL`.
  An added or removed object or text is local and large; noise is neither after smoothing.
- ``global_shift`` and ``global_gain_change``: the largest per-channel median signed
  difference, and the largest per-channel change of spread (std ratio minus 1), outside the
  face: a colour cast, white balance or contrast change moves these, resampling noise does not.
- ``body_skin_delta_e``: CIELAB colour difference (CIE76, of the mean change) over the
  person's skin outside the head (the selfie segmenter's person minus the grown oval, pixels
  whose source colour is close to the face's skin): skin lightened on neck and hands.
- ``hair_delta_e``: the same over the person's pixels around the head above the eyes, outside
  the edit region and not skin: hair (or a hat, a headscarf) recoloured.
- ``largest_change_share``: the share of the pixels away from the face (and
  :data:`~counterfactory.validation.metrics.pixels.LARGEST_CHANGE_BORDER_FRAC` in from the image
  edge) changed in the largest connected area where the candidate differs from the source by
  more than 20 grey levels per pixel
  (:func:`~counterfactory.validation.metrics.pixels.largest_change_share`): a re-rendering
  changes texture a little everywhere, a pasted object, text or an erased patch changes one
  place a lot. It tells a lone pair's local failures (no floor) where every total overlaps.

- ``excess_share`` (with the editor's noise-floor output, ``pair.extras[FLOOR_IMAGE]``): the
  share of pixels away from the face, in connected areas, where the candidate differs from
  the source by :data:`EXCESS_LEVEL` more than the same editor's "return this photo
  unchanged" output does nearby (:func:`excess_change`). The floor output carries the
  editor's own re-rendering of this very photo, so what remains is what the candidate alone
  changed: thin text and small objects the band limit spreads too thin, a patch pasted on a
  plain wall, an erased one.

When the caller hands the registered output before compositing (``raw_candidate``) and the
editor's output as returned (``unregistered``), the same figures are reported for the raw
edit (``raw_*``) and FOCUS-comparable ones (``focus_diff_face``, ``focus_diff_nonface``,
``focus_ratio``: the unregistered output resized to the source's size, no registration), so a
release can be set beside FOCUS's 0.141 / 0.022 / 8.16.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.faces import face_mask as draw_face_mask
from counterfactory.validation.gates.base import GateResult, PairContext, SourceAnalysis, finite_or_none
from counterfactory.validation.gates.registry import GATES
from counterfactory.validation.gates.rules import Rule, evaluate
from counterfactory.validation.gates.skin import CONTROL_CONDITIONS, is_control
from counterfactory.validation.metrics.floor import (
    AGAINST_FLOOR,
    FloorGrid,
    LocalitySource,
    against_floor,
    face_measures,
    locality_metrics,
    prepare_floor,
    prepare_locality_source,
    source_padding,
)
from counterfactory.validation.metrics.pixels import (
    BAND_FRAC,
    EXCESS_LEVEL,
    LARGEST_CHANGE_LEVEL,
    LOCAL_CHANGE_LEVEL,
    MIN_CHANGE_AREA_FRAC,
    RATIO_FLOOR,
    binary_mask,
    excess_share,
    lowpass,
    matched_diff,
    resize_to,
)


class LocalityGateConfig(BaseModel):
    """Locality thresholds (``gates.<kind>.locality`` in the spec); None: not judged.

    All differences are mean absolute pixel differences in [0, 1] averaged over channels.
    """

    #: settings added after specs were first hashed: left out of a spec's canonical form while
    #: unset, so a spec hashes as before they existed (``Spec.canonical``)
    canonical_unset: ClassVar[tuple[str, ...]] = (
        "max_excess_share",
        "cohort",
        "no_floor",
        "max_hair_delta_e",
        "max_largest_change_share",
        "control_conditions",
    )

    model_config = ConfigDict(extra="forbid")

    max_diff_nonface: float | None = Field(None, ge=0.0, le=1.0, description="face edits: outside the face")
    min_diff_face: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="face edits: below this the face is unchanged (sent to review); judged only without a noise floor",
    )
    min_ratio: float | None = Field(None, ge=0.0, description="face edits: diff_face / diff_nonface")
    max_diff_outside_edit: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: outside the limb mask (0 after compositing)"
    )
    max_diff_face_drift: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: inside the face, outside the limb mask"
    )
    min_diff_inside_edit: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: below this the limb region is unchanged (not an edit)"
    )
    control_conditions: list[dict[str, str]] | None = Field(
        None,
        description=(
            "limb edits: the conditions of a same-cue control, whose unchanged limb region goes to review "
            "instead of being rejected (None: the default, [{cue: kept}]; []: none)"
        ),
    )
    max_changed_share: float | None = Field(
        None, ge=0.0, le=1.0, description="face edits: share of pixels away from the face changed visibly"
    )
    max_global_shift: float | None = Field(
        None, ge=0.0, le=1.0, description="face edits: largest per-channel median signed change outside the face"
    )
    max_global_gain_change: float | None = Field(
        None, ge=0.0, description="face edits: largest per-channel |std ratio - 1| outside the face"
    )
    max_body_skin_delta_e: float | None = Field(
        None, ge=0.0, description="face edits: CIELAB change of the person's skin outside the head"
    )
    max_hair_delta_e: float | None = Field(
        None, ge=0.0, description="face edits: CIELAB change of the person's pixels around the head above the eyes"
    )
    max_largest_change_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "face edits: share of the pixels away from the face changed by more than 20 grey levels in the "
            "largest connected area (an object, text, an erased patch)"
        ),
    )
    min_face_change: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "face edits: band-limited face change (above the noise floor's, with one) below this: unchanged "
            "(sent to review)"
        ),
    )
    min_band_ratio: float | None = Field(
        None, ge=0.0, description="face edits: band-limited face change / band-limited change away from the face"
    )
    max_excess_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "face edits: share of pixels away from the face changed beyond the editor's own 'unchanged' output "
            "(judged only with a noise floor image)"
        ),
    )
    cohort: LocalityPathConfig | None = Field(
        None, description="face edits: the thresholds judged above a cohort floor (the same source's other candidates)"
    )
    no_floor: LocalityPathConfig | None = Field(
        None, description="face edits: the thresholds of a lone pair with no floor (measures as measured)"
    )


#: The locality thresholds that depend on what the editor alone did, and so on the judging
#: path: judged above a floor (``request``, ``cohort``) or as measured (``none``).
PATH_THRESHOLDS = (
    "min_diff_face",
    "max_changed_share",
    "max_global_shift",
    "max_global_gain_change",
    "max_body_skin_delta_e",
    "min_face_change",
    "max_excess_share",
    "max_hair_delta_e",
    "max_largest_change_share",
)
#: The three ways a verdict knows what the editor alone did (``floor_path`` on every item):
#: the run's "return this photo unchanged" request, the other candidates of the same source
#: (:func:`~counterfactory.validation.cohort.cohort_floors`), or nothing (a lone pair).
FLOOR_PATHS = ("request", "cohort", "none")


class LocalityPathConfig(BaseModel):
    """The path-dependent locality thresholds (:data:`PATH_THRESHOLDS`) of one judging path
    other than the floor request (``gates.face.locality.cohort`` / ``.no_floor``). When a path's
    set is given it replaces the top-level values of those thresholds for that path (None: not
    judged); when it is absent the top-level values hold.

    ``cohort``: judged above the other candidates of the same source (their median, leave one
    out); ``face_change`` is then judged as measured (the others' faces are edited too).
    ``no_floor``: a lone pair, every measure as measured, limits fitted on re-rendered cases
    without a floor."""

    model_config = ConfigDict(extra="forbid")

    min_diff_face: float | None = Field(None, ge=0.0, le=1.0)
    max_changed_share: float | None = Field(None, ge=0.0, le=1.0)
    max_global_shift: float | None = Field(None, ge=0.0, le=1.0)
    max_global_gain_change: float | None = Field(None, ge=0.0)
    max_body_skin_delta_e: float | None = Field(None, ge=0.0)
    min_face_change: float | None = Field(None, ge=0.0, le=1.0)
    max_excess_share: float | None = Field(None, ge=0.0, le=1.0)
    max_hair_delta_e: float | None = Field(None, ge=0.0)
    max_largest_change_share: float | None = Field(None, ge=0.0, le=1.0)


#: The measures judged relative to the editor's noise floor (:func:`noise_floor_of`): the
#: four upper bounds, and the face change a copy would show (``min_face_change``).
FLOOR_RELATIVE = (
    "changed_share",
    "global_shift",
    "global_gain_change",
    "body_skin_delta_e",
    "face_change",
    "hair_delta_e",
    "largest_change_share",
)


def noise_floor_of(pair: PairContext) -> dict | None:
    """The editor's noise floor for this pair's source, when the caller has one: the locality
    metrics of the editor's output for the request "return this photo unchanged"
    (``pair.extras["noise_floor"]``, a ``{metric: value}`` mapping), else None.

    Every editor that decodes through a latent autoencoder re-synthesises the whole image, and
    how much that moves each measure depends on the photo (fine fabric, text and flags move
    ``changed_share``; a colour bias of the decoder moves ``global_shift``). With a floor, the
    :data:`FLOOR_RELATIVE` measures are judged as their excess over it (``<metric>_above_floor``,
    recorded beside ``floor_<metric>``), so the limits hold for a new editor without
    recalibration; without one they are judged as measured. That holds for ``face_change`` too:
    the decoder alone moves a copy's band-limited face change by about 0.016 on a
    finely textured face (``obama_partial_face.jpg`` through TAEF2), more than a small good
    edit of a smooth face shows in all, so a copy is told from an edit by how far its face
    changed beyond the editor's own copy of the photo.
    """
    floor = (pair.extras or {}).get("noise_floor")
    return dict(floor) if floor else None


#: ``pair.extras`` key of the editor's floor output itself: ``(H, W, 3)`` uint8, registered to
#: the source like the candidate (the floor candidate's aligned image)
FLOOR_IMAGE = "noise_floor_image"


#: ``pair.extras`` key of a cohort floor (:mod:`counterfactory.validation.cohort`): its image
#: on the pair's working grid, ``(h, w, 3)`` uint8 (``source[::stride, ::stride]``'s shape)
FLOOR_WORK_IMAGE = "noise_floor_work_image"


def floor_work_image_of(pair: PairContext) -> np.ndarray | None:
    """The floor output on the working grid (``pair.extras[FLOOR_WORK_IMAGE]``), or None when
    the caller has none or it is not the working grid's shape."""
    image = (pair.extras or {}).get(FLOOR_WORK_IMAGE)
    if image is None or getattr(image, "shape", None) != pair.work_source.shape:
        return None
    return image


#: ``pair.extras`` key of a template's :class:`FloorContext` (optional): what the locality gate
#: derives from the floor output is then made once for all the template's cells
FLOOR_CONTEXT = "noise_floor_context"


class FloorContext:
    """One template's floor output and what the locality gate derives from it on its source's
    working grid (:class:`~counterfactory.validation.metrics.floor.FloorGrid`: the floor's
    low-pass, the padded source and the floor's grown difference), made by the first cell that
    needs it and read by the others.

    The caller that judges a template's cells against one floor output
    (:class:`~counterfactory.flows.engine.judge.TemplateJudge`) makes one per template and hands
    it to every cell under ``extras[FLOOR_CONTEXT]``, beside the image under
    ``extras[FLOOR_IMAGE]``; it serves a pair only when that image is :attr:`image` itself and the
    pair has its source's analysis (whose key names the source). Thread-safe: cells of one
    template judged at once wait for one computation; other templates hold their own context.
    Without one, every cell derives the same values itself (the figures are the same).
    """

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self._lock = threading.Lock()
        self._grid: tuple[tuple[Any, ...], FloorGrid] | None = None

    def grid(self, key: tuple[Any, ...], build: Callable[[], FloorGrid]) -> FloorGrid:
        """The :class:`FloorGrid` made for ``key`` (the source and its grid), ``build()`` on the
        first call or when the key changed."""
        with self._lock:
            if self._grid is None or self._grid[0] != key:
                self._grid = (key, build())
            return self._grid[1]


def floor_grid(
    pair: PairContext,
    prepared: LocalitySource,
    floor_image: np.ndarray,
    stride: int,
    floor_diff: np.ndarray | None = None,
    floor_low: np.ndarray | None = None,
) -> FloorGrid:
    """The :class:`~counterfactory.validation.metrics.floor.FloorGrid` of ``floor_image`` against
    ``pair``'s source: from the template's :class:`FloorContext` when the pair carries one for
    this very image, else made here."""

    def build() -> FloorGrid:
        return prepare_floor(
            prepared, pair.work_source, floor_image, stride, floor_diff=floor_diff, floor_low=floor_low
        )

    context = (pair.extras or {}).get(FLOOR_CONTEXT)
    if not isinstance(context, FloorContext) or context.image is not floor_image or pair.analysis is None:
        return build()
    return context.grid((pair.analysis.key, stride, pair.work_source.shape), build)


def floor_image_of(pair: PairContext) -> np.ndarray | None:
    """The floor output (``pair.extras[FLOOR_IMAGE]``), or None when the caller has none or it
    is not the source's shape."""
    image = (pair.extras or {}).get(FLOOR_IMAGE)
    if image is None or getattr(image, "shape", None) != pair.source.shape:
        return None
    return image


def locality_gate(
    pair: PairContext,
    *,
    max_diff_nonface: float | None = None,
    min_diff_face: float | None = None,
    min_ratio: float | None = None,
    max_diff_outside_edit: float | None = None,
    max_diff_face_drift: float | None = None,
    max_changed_share: float | None = None,
    max_global_shift: float | None = None,
    max_global_gain_change: float | None = None,
    max_body_skin_delta_e: float | None = None,
    min_diff_inside_edit: float | None = None,
    min_face_change: float | None = None,
    min_band_ratio: float | None = None,
    max_excess_share: float | None = None,
    max_hair_delta_e: float | None = None,
    max_largest_change_share: float | None = None,
    cohort: Mapping[str, Any] | None = None,
    no_floor: Mapping[str, Any] | None = None,
    control_conditions: list[dict[str, str]] | None = None,
) -> GateResult:
    """Judge where ``pair.candidate`` differs from ``pair.source``.

    The decision is :data:`LOCALITY_RULES` (printed in the docs and the release's report),
    applied by :func:`~counterfactory.validation.gates.rules.evaluate` to
    :func:`locality_measures`. Face edits are rejected for change away from the face (totals,
    changed share, colour cast, contrast, body skin, hair, largest compact change, excess over
    the floor) or change not concentrated in the face (ratios); a face that did not change goes
    to review (``locality_face_unchanged``, its ratio then noise and not judged). Limb edits are
    rejected for change outside the limb mask, face drift, or a limb region that did not change
    (a treatment that copies its source there is not an edit).

    A same-cue control (``pair.extras["condition"]`` one of ``control_conditions``, default
    ``[{cue: kept}]``, as the skin gate reads it) asks for the region re-synthesised with its cue
    kept: its interior barely changing is what a control is, so ``min_diff_inside_edit`` does
    not reject it. Nor is it skipped: that threshold is the no-op ceiling (a region changed no
    more than a re-encode changes it), so below it the gate cannot tell a faithful
    re-synthesis from a copy the editor returned untouched, and a copy does not serve the
    control's purpose (InclusiveCFImageBias's control carries the same inpainting as its
    treatment, to rule out inpainting residue). Such a control goes to review with
    ``locality_limb_unchanged``, and a person decides; above the ceiling it passes as before.
    Every other limb threshold judges a control as a treatment.

    The judging path (``floor_path``, :data:`FLOOR_PATHS`) is ``request`` with a floor request's
    measures (``pair.extras["noise_floor"]``), ``cohort`` with a cohort floor (its image on the
    working grid, ``pair.extras[FLOOR_WORK_IMAGE]``, whose measures are taken here as a floor
    request's are), else ``none``. ``cohort`` / ``no_floor`` (:class:`LocalityPathConfig`) replace
    the :data:`PATH_THRESHOLDS` on their path when given.
    """
    # the keyword arguments are the config's thresholds: taken by name, in the record's order
    given = dict(locals())
    values = {k: given[k] for k in _THRESHOLD_ORDER}
    floor = noise_floor_of(pair)
    path = "none" if floor is None else str(floor.get("path", "request"))
    thresholds = locality_thresholds(path, cohort, no_floor, **values)
    metrics, judged = locality_measures(pair, floor, path, thresholds, control_conditions)
    reasons, review = evaluate(LOCALITY_RULES, judged, thresholds, path=path, kind=pair.kind)
    return GateResult("locality", not reasons, metrics, reasons, review, thresholds)


def locality_thresholds(
    path: str, cohort: Mapping[str, Any] | None, no_floor: Mapping[str, Any] | None, **values: float | None
) -> dict[str, Any]:
    """The thresholds judged on ``path`` (``cohort`` / ``no_floor`` replace the
    :data:`PATH_THRESHOLDS` on their path when given), with the fixed measuring levels."""
    chosen = {"cohort": cohort, "none": no_floor}.get(path)
    if chosen is not None:
        values.update({k: chosen.get(k) for k in PATH_THRESHOLDS})
    return {
        **{k: values[k] for k in _THRESHOLD_ORDER},
        "ratio_floor": RATIO_FLOOR,
        "local_change_level": LOCAL_CHANGE_LEVEL,
        "band_frac": BAND_FRAC,
        "min_change_area_frac": MIN_CHANGE_AREA_FRAC,
        "excess_level": EXCESS_LEVEL,
        "largest_change_level": LARGEST_CHANGE_LEVEL,
    }


#: the order of the thresholds in a result's record
_THRESHOLD_ORDER = (
    "max_diff_nonface",
    "min_diff_face",
    "min_ratio",
    "max_diff_outside_edit",
    "max_diff_face_drift",
    "max_changed_share",
    "max_global_shift",
    "max_global_gain_change",
    "max_body_skin_delta_e",
    "min_diff_inside_edit",
    "min_face_change",
    "min_band_ratio",
    "max_excess_share",
    "max_hair_delta_e",
    "max_largest_change_share",
)
#: the thresholds that judge a limb edit; any of them set asks for the edit mask
LIMB_THRESHOLDS = ("max_diff_outside_edit", "max_diff_face_drift", "min_diff_inside_edit")
#: the thresholds that judge a face edit (every other one); any of them set asks for the face's measures
FACE_THRESHOLDS = tuple(t for t in _THRESHOLD_ORDER if t not in LIMB_THRESHOLDS)

#: the floor-relative upper bounds: (measure, threshold, reason), judged above the floor with one
_FLOOR_BOUNDS = (
    ("changed_share", "max_changed_share", "locality_changed_share_above_max"),
    ("global_shift", "max_global_shift", "locality_global_shift_above_max"),
    ("global_gain_change", "max_global_gain_change", "locality_global_gain_above_max"),
    ("body_skin_delta_e", "max_body_skin_delta_e", "locality_body_skin_above_max"),
    ("hair_delta_e", "max_hair_delta_e", "locality_hair_above_max"),
    ("largest_change_share", "max_largest_change_share", "locality_largest_change_above_max"),
)
_NO_FACE = ("locality_no_face_mask",)
_NO_MASK = ("locality_edit_mask_shape_mismatch", "locality_no_edit_mask")

#: The locality gate's decision, in order. Measures named ``*_judged`` are what
#: :func:`locality_measures` judges (above the floor with one, else as measured; recorded as
#: ``<metric>`` / ``<metric>_above_floor``); ``diff_face_without_floor`` is ``diff_face`` when
#: no floor gives a face change (FOCUS's raw diff_face tells a copy only where nothing
#: re-renders the pixels), ``face_measured`` / ``edit_mask_usable`` / ``edit_mask_shape_ok``
#: whether the masks could be used, ``is_control`` a same-cue control (``control_conditions``).
LOCALITY_RULES: tuple[Rule, ...] = (
    Rule("edit_mask_shape_ok", "false", None, "locality_edit_mask_shape_mismatch"),
    Rule("face_measured", "false", FACE_THRESHOLDS, "locality_no_face_mask"),
    Rule("diff_nonface", "above", "max_diff_nonface", "locality_nonface_diff_above_max", unless=_NO_FACE),
    *(Rule(f"{m}_judged", "above", t, r, unless=_NO_FACE) for m, t, r in _FLOOR_BOUNDS),
    Rule("excess_share", "above", "max_excess_share", "locality_excess_share_above_max", unless=_NO_FACE),
    Rule(
        "diff_face_without_floor",
        "below",
        "min_diff_face",
        "locality_face_unchanged",
        outcome="review",
        unless=_NO_FACE,
    ),
    Rule(
        "face_change_judged", "below", "min_face_change", "locality_face_unchanged", outcome="review", unless=_NO_FACE
    ),
    Rule(
        "ratio",
        "below",
        "min_ratio",
        "locality_ratio_below_min",
        missing="fire",
        unless=(*_NO_FACE, "locality_face_unchanged"),
    ),
    Rule(
        "band_ratio",
        "below",
        "min_band_ratio",
        "locality_band_ratio_below_min",
        missing="fire",
        unless=(*_NO_FACE, "locality_face_unchanged", "locality_ratio_below_min"),
    ),
    Rule("edit_mask_usable", "false", LIMB_THRESHOLDS, "locality_no_edit_mask", unless=_NO_MASK[:1]),
    Rule(
        "diff_outside_edit", "above", "max_diff_outside_edit", "locality_outside_edit_diff_above_max", unless=_NO_MASK
    ),
    Rule("diff_face_drift", "above", "max_diff_face_drift", "locality_face_drift_above_max", unless=_NO_MASK),
    # a control is asked to keep its cue: an unchanged limb region goes to review, never rejected
    Rule(
        "diff_inside_edit",
        "below",
        "min_diff_inside_edit",
        "locality_limb_unchanged",
        outcome="review",
        when="is_control",
        unless=_NO_MASK,
    ),
    Rule(
        "diff_inside_edit",
        "below",
        "min_diff_inside_edit",
        "locality_limb_unchanged",
        missing="fire",
        unless=(*_NO_MASK, "locality_limb_unchanged"),
    ),
)


def locality_measures(
    pair: PairContext,
    floor: dict | None,
    path: str,
    thresholds: Mapping[str, Any],
    control_conditions: list[dict[str, str]] | None,
) -> tuple[dict, dict]:
    """The locality gate's measures of ``pair``: ``(metrics, judged)``, what a result records
    and what :data:`LOCALITY_RULES` judge (the metrics plus the facts the rules read). No
    decision is taken here; the floor-relative figures are recorded, as ever, when a face
    threshold is set and the face was measured.

    Metrics: :func:`locality_metrics` plus ``mask_mode``; with a source face also
    ``changed_share``, ``global_shift``, ``global_gain_change``, ``body_skin_delta_e``,
    ``body_skin_area_frac``; with ``pair.raw_candidate`` the ``raw_`` versions of the face
    figures; with ``pair.unregistered`` ``focus_diff_face``, ``focus_diff_nonface``,
    ``focus_ratio``.
    Judged figures are those of ``pair.candidate`` (what is released).
    """
    edit_mask = pair.edit_mask
    shape_ok = edit_mask is None or edit_mask.shape[:2] == pair.source.shape[:2]
    edit_mask = binary_mask(edit_mask) if edit_mask is not None and shape_ok else None
    face = pair.source_face
    prepared = pair.source_data("locality")
    if prepared is None and face is not None and pair.face_mask is not None:
        prepared = _prepare(
            pair.work_source, face, pair.face_mask, pair.face_mask_mode, pair.stride, None, pair.edit_region_mask
        )
    oval = prepared.oval if prepared is not None else pair.face_mask
    # the stack draws face masks as {0, 255} already; only caller-given edit masks are coerced
    m = locality_metrics(pair.source, pair.candidate, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
    metrics: dict = {"mask_mode": pair.face_mask_mode, **({"floor_path": path} if pair.kind == "face" else {}), **m}
    floor, against = _face_measures(pair, prepared, floor, path, metrics)
    _raw_and_focus_measures(pair, prepared, edit_mask, oval, metrics)
    face_measured = m["diff_face"] is not None and m["diff_nonface"] is not None
    judged = dict(metrics)
    if face_measured and any(thresholds.get(t) is not None for t in FACE_THRESHOLDS):
        judged.update(_above_floor(metrics, floor, against))
    controls = CONTROL_CONDITIONS if control_conditions is None else control_conditions
    judged.update(
        edit_mask_shape_ok=shape_ok,
        edit_mask_usable=edit_mask is not None,
        face_measured=face_measured,
        is_control=is_control(pair.extras.get("condition"), None, source_fields={}, control_conditions=list(controls)),
    )
    return metrics, judged


def _above_floor(metrics: dict, floor: dict | None, against: dict | None) -> dict:
    """The floor-relative measures as judged: ``<metric>_judged``, their excess over the
    floor where there is one (recorded in ``metrics`` as ``floor_<metric>`` and
    ``<metric>_above_floor``), else as measured; and ``diff_face_without_floor``."""
    judged: dict = {}
    for key, _, _ in _FLOOR_BOUNDS:
        value = metrics.get(key)
        base = None if floor is None else finite_or_none(floor.get(key))
        if value is not None and base is not None:
            # judged above the editor's own re-rendering of this photo: against its
            # output itself where the pair has it, else as the measures' difference
            metrics[f"floor_{key}"] = base
            direct = against.get(key) if key in AGAINST_FLOOR and against is not None else None
            value = metrics[f"{key}_above_floor"] = direct if direct is not None else value - base
        judged[f"{key}_judged"] = value
    face_change = metrics.get("face_change")
    floor_face = None if floor is None else finite_or_none(floor.get("face_change"))
    if face_change is not None and floor_face is not None:
        metrics["floor_face_change"] = floor_face
        face_change = metrics["face_change_above_floor"] = face_change - floor_face
    judged["face_change_judged"] = face_change
    # with the editor's floor, the face change above it tells a copy (a subtle good edit's
    # re-rendered face differs by less than 0.02 on its own, a copy's by up to 0.026)
    judged["diff_face_without_floor"] = metrics["diff_face"] if floor_face is None else None
    return {**metrics, **judged}


def _face_measures(
    pair: PairContext, prepared: LocalitySource | None, floor: dict | None, path: str, metrics: dict
) -> tuple[dict | None, dict | None]:
    """The face measures (and ``excess_share`` against the floor image) into ``metrics``;
    returns the floor's measures (a cohort's taken here) and the candidate's against the floor
    image, when there is one."""
    if prepared is None:
        return floor, None
    against: dict[str, float | None] | None = None
    floor_image, stride = floor_image_of(pair), pair.stride
    work_floor = floor_work_image_of(pair)
    if floor_image is None and work_floor is not None:
        floor_image, stride = work_floor, 1
    # the source padded once per source: the candidate's per-pixel difference from it serves
    # its largest area of change and its excess over the floor (taken once, handed to both)
    padded = source_padding(prepared, pair.work_source)
    matched = padded is not None and prepared.inner_region is not None and floor_image is not None
    cand_diff = matched_diff(padded, pair.work_candidate) if matched else None
    # the candidate's low-pass serves its face measures and its shift against the floor
    cand_low = lowpass(pair.work_candidate)
    metrics.update(
        face_measures(
            prepared,
            pair.work_source,
            pair.work_candidate,
            work_covered=pair.work_covered,
            candidate_low=cand_low,
            candidate_diff=cand_diff,
        )
    )
    floor_diff = floor_low = None
    if path == "cohort" and work_floor is not None:
        # the cohort's floor is measured here as a floor request's output is when it is
        # judged, except its face: the other candidates' faces are edited too; its low-pass
        # and per-pixel difference serve those measures and its grid below (taken once)
        if matched and floor_image is work_floor:
            floor_diff = matched_diff(padded, work_floor)
        floor_low = lowpass(work_floor)
        measured = face_measures(
            prepared,
            pair.work_source,
            work_floor,
            work_covered=pair.work_covered,
            candidate_low=floor_low,
            candidate_diff=floor_diff,
        )
        floor = {**floor, **{k: measured[k] for k in FLOOR_RELATIVE if k != "face_change"}}
        metrics["floor_members"] = floor.get("members")
    if floor_image is not None:
        grid = floor_grid(
            pair, prepared, floor_image, stride, floor_diff, floor_low if floor_image is work_floor else None
        )
        against = against_floor(
            prepared, None, pair.work_candidate, pair.work_covered, candidate_low=cand_low, floor_low=grid.low
        )
        region = prepared.work_region
        if pair.work_covered is not None:
            region = np.where(pair.work_covered, region, np.uint8(0))
        metrics["excess_share"] = finite_or_none(
            excess_share(pair.work_source, pair.work_candidate, None, region, side=grid.side, candidate_diff=cand_diff)
        )
    return floor, against


def _raw_and_focus_measures(
    pair: PairContext, prepared: LocalitySource | None, edit_mask: np.ndarray | None, oval, metrics: dict
) -> None:
    """The raw edit's figures (``raw_*``, with ``pair.raw_candidate``) and FOCUS's
    (``focus_*``, with ``pair.unregistered``) into ``metrics``."""
    raw = pair.raw_candidate
    if raw is not None and raw.shape == pair.source.shape:
        r = locality_metrics(pair.source, raw, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
        metrics.update({f"raw_{k}": r.get(k) for k in ("diff_face", "diff_nonface", "ratio", "diff_outside_edit")})
        if prepared is not None:
            k = prepared.stride
            work_raw = raw if k == 1 else np.ascontiguousarray(raw[::k, ::k])
            metrics.update(
                face_measures(prepared, pair.work_source, work_raw, prefix="raw_", work_covered=pair.work_covered)
            )
    un = pair.unregistered
    if un is not None and pair.face_mask is not None and getattr(un, "ndim", 0) == 3 and un.shape[2] == 3:
        f = locality_metrics(
            pair.source, resize_to(np.asarray(un, np.uint8), pair.source.shape[:2]), pair.face_mask, oval_mask=oval
        )
        metrics.update(focus_diff_face=f["diff_face"], focus_diff_nonface=f["diff_nonface"], focus_ratio=f["ratio"])


def _prepare(
    work_source: np.ndarray,
    face,
    face_mask: np.ndarray,
    mode: str,
    stride: int,
    person: np.ndarray | None,
    region: np.ndarray | None = None,
) -> LocalitySource:
    shape = (face_mask.shape[0], face_mask.shape[1])
    oval = draw_face_mask(face.landmarks, shape, mode="oval") if mode != "oval" else face_mask
    return prepare_locality_source(work_source, oval, face.size_px, stride, person, region)


class LocalityGate:
    """:func:`locality_gate` with its thresholds bound (no model: masks come with the pair)."""

    name = "locality"

    def __init__(self, config: LocalityGateConfig) -> None:
        self.config = config

    @property
    def needs_person(self) -> bool:
        """Whether body skin is judged, which needs the source's person segmentation."""
        return self.config.max_body_skin_delta_e is not None or self.config.max_hair_delta_e is not None

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> LocalitySource | None:
        """The source's :class:`LocalitySource` (None without a face), once per source."""
        if not analysis.faces or analysis.face_mask is None:
            return None
        person = analysis.person if self.needs_person else None
        k = analysis.stride
        work = analysis.work_image if analysis.work_image is not None else np.ascontiguousarray(source[::k, ::k])
        return _prepare(
            work, analysis.faces[0], analysis.face_mask, analysis.face_mask_mode, k, person, analysis.region_mask
        )

    def __call__(self, pair: PairContext) -> GateResult:
        return locality_gate(pair, **self.config.model_dump())


GATES.register("locality", LocalityGateConfig, LocalityGate, order=40)
