"""Skin-tone gate: did the edit move skin tone where it must not, or leave an incongruent image?

Measures ITA° (:mod:`counterfactory.validation.skin`, median over skin pixels) of the face skin
and of the exposed body skin outside the face, in the source and the aligned candidate, both
on the same body pixels. Then, by the kind of pair:

- face edit (a change of group): reports the candidate's face ITA, its change from the
  source, the body's, and the face-to-body gap and its growth (face-body congruence, a
  covariate the release reports per group). Body skin is the skin *outside the edit region
  the prompt names* (``face_only_v1``: face, neck, ears, facial hair; see
  :mod:`counterfactory.generation.regions`), so a face-only edit of a person whose hands
  show leaves face and hands apart by design: not judged by default. With
  ``require_congruent`` a gap that grew by more than ``max_face_body_gap_growth_deg`` sends
  the pair to review (``skin_face_body_mismatch``). Judged always: body skin whose ITA moved
  beyond ``max_ita_shift_deg`` (``skin_body_tone_shift``: the editor recoloured the hands),
  and, with ``max_against_direction_deg``, a face pushed against the requested direction
  (``skin_against_direction``: the condition's expected direction from
  ``direction_by_condition``).
- same-group control (the condition equals the source's own group) and limb edit: skin tone
  must not move. A face or body ITA change beyond ``max_ita_shift_deg`` (the no-op ceiling)
  rejects with ``skin_tone_shift``.
- limb edit: the skin the editor painted inside the mask must match the person's skin
  outside it (face skin, else body skin): when its |ITA gap| to that skin exceeds the
  source's gap there (zero when the source showed no skin inside) by more than
  ``max_inpaint_gap_deg``, ``skin_inpaint_mismatch``. That is a treatment's rule (skin painted
  where the cue was): a same-cue control (``cue: kept``) keeps what the mask showed (a glove, a
  prosthesis, a sleeve), which need not look like skin, and on such near-neutral colours ITA
  swings by tens of degrees with a re-rendering's few levels (the demo's gloved hand: -17 to
  -41 degrees); its gap is recorded, not judged. Its tone is held by ``skin_tone_shift`` as
  every limb pair's is.

``lightened`` (candidate face ITA above the source's by more than ``max_ita_shift_deg``) is
recorded for every face pair: the release stats count it per source group (Seo et al. 2026
found editors lighten skin in 62-71 % of outputs, 72-75 % for Black and Indian sources).

Whether a pair is a control comes from ``PairContext.extras``: ``condition`` (axis -> value)
and ``source`` (the source's metadata record), compared through ``source_fields``; or
``condition`` equal to one of ``control_conditions`` (limb designs: ``{cue: kept}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.gates.base import GateResult, PairContext, SourceAnalysis, finite_or_none
from counterfactory.validation.gates.registry import GATES
from counterfactory.validation.gates.rules import Rule, evaluate
from counterfactory.validation.segment import PersonSegmenter, get_person_segmenter, work_stride
from counterfactory.validation.skin import SourceSkin, measure_candidate_skin, prepare_source_skin

#: No thresholds here depend on a model backend (ITA is a colour formula).
BACKEND_THRESHOLDS: tuple[str, ...] = ()


#: the conditions that are controls whatever the source when a gate's ``control_conditions`` is
#: unset: a limb design's same-cue control (the skin and locality gates read the same default)
CONTROL_CONDITIONS: tuple[dict[str, str], ...] = ({"cue": "kept"},)


class SkinGateConfig(BaseModel):
    """``gates.<kind>.skin`` in the spec; thresholds in ITA degrees.

    Attributes:
        max_ita_shift_deg: no-op ceiling of face/body ITA change; beyond it a control or a
            limb edit is rejected (``skin_tone_shift``) and a face edit counts as lightened
            or darkened.
        max_face_body_gap_growth_deg: how much more the candidate's face may differ from its
            body than the source's does before review (``skin_face_body_mismatch``).
        max_inpaint_gap_deg: how much further the skin inside a limb mask may be from the
            person's skin outside it than it was in the source (``skin_inpaint_mismatch``).
        max_body_ita_shift_deg: face edits: body skin (outside the edit region) whose ITA moved
            further than this is rejected (``skin_body_tone_shift``); None: twice
            ``max_ita_shift_deg`` (a latent decoder's re-rendering alone moves the few hundred
            body-skin pixels of a photo by up to about 3 degrees).
        require_congruent: a face edit whose face-to-body gap grew beyond
            ``max_face_body_gap_growth_deg`` goes to review (off: recorded only).
        max_against_direction_deg: a face edit whose face ITA moved by more than this against
            the direction its condition asks for is rejected; None: not judged.
        direction_by_condition: ``"axis=value"`` -> +1 (lighter skin asked for) or -1 (darker)
            relative to the source, e.g. from a study's own reference tones; unlisted: unknown.
        source_fields: condition axis -> source metadata field holding the source's own
            value (looked up in the record, then in its ``extra``); a face pair whose every
            axis equals the source's value is a same-group control.
        control_conditions: conditions that are controls whatever the source.
    """

    model_config = ConfigDict(extra="forbid")

    max_ita_shift_deg: float = Field(gt=0)
    max_face_body_gap_growth_deg: float = Field(gt=0)
    max_inpaint_gap_deg: float = Field(gt=0)
    require_congruent: bool = False
    max_body_ita_shift_deg: float | None = Field(None, gt=0)
    max_against_direction_deg: float | None = Field(None, gt=0)
    direction_by_condition: dict[str, int] = Field(default_factory=dict)
    source_fields: dict[str, str] = Field(
        default_factory=lambda: {"race": "race", "gender": "presented_gender", "skin_tone": "skin_tone"}
    )
    control_conditions: list[dict[str, str]] = Field(default_factory=lambda: [dict(c) for c in CONTROL_CONDITIONS])


def is_control(
    condition: Mapping[str, Any] | None,
    source: Mapping[str, Any] | None,
    *,
    source_fields: Mapping[str, str],
    control_conditions: list[dict[str, str]],
) -> bool | None:
    """True when the pair is a same-group control, False when it is a change of group, None
    when unknown (no condition given, or the source's value of some axis is not recorded)."""
    if not condition:
        return None
    cond = {str(k): str(v) for k, v in condition.items()}
    if any(cond == {str(k): str(v) for k, v in c.items()} for c in control_conditions):
        return True
    if source is None:
        return None
    extra = source.get("extra") or {}
    same = True
    for axis, value in cond.items():
        field = source_fields.get(axis)
        own = None
        if field is not None:
            own = source.get(field)
            if own is None and isinstance(extra, Mapping):
                own = extra.get(field)
        if own is None:
            return None
        same = same and str(own).casefold() == value.casefold()
    return same


def _direction(condition: Mapping[str, Any] | None, table: Mapping[str, int]) -> int | None:
    """+1 / -1 from ``table`` for the first ``axis=value`` of ``condition`` it lists, else None."""
    for axis, value in sorted((condition or {}).items()):
        found = table.get(f"{axis}={value}")
        if found is not None:
            return 1 if found > 0 else -1
    return None


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else float(a - b)


class SkinGate:
    """The configured skin-tone gate; the selfie segmenter is loaded once per process."""

    name = "skin"
    #: the stack segments the source's person once for every gate that sets this
    needs_person = True

    def __init__(self, config: SkinGateConfig, segmenter: PersonSegmenter | None = None) -> None:
        self.config = config
        self.segmenter = segmenter if segmenter is not None else get_person_segmenter()

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> SourceSkin:
        """The source's skin (:func:`~counterfactory.validation.skin.prepare_source_skin`), once per source."""
        faces = analysis.faces
        person = analysis.person
        if faces and person is None:
            k = analysis.stride
            work = analysis.work_image if analysis.work_image is not None else source[::k, ::k]
            person = self.segmenter.segment(np.ascontiguousarray(work))
        return prepare_source_skin(
            source,
            person,
            source_landmarks=faces[0].landmarks if faces else None,
            other_faces=[f.landmarks for f in faces[1:]],
            work_source=analysis.work_image,
            region=analysis.region_mask,
        )

    def __call__(self, pair: PairContext) -> GateResult:
        c = self.config
        thresholds = {
            "max_ita_shift_deg": c.max_ita_shift_deg,
            "max_face_body_gap_growth_deg": c.max_face_body_gap_growth_deg,
            "max_inpaint_gap_deg": c.max_inpaint_gap_deg,
            "require_congruent": c.require_congruent,
            "max_body_ita_shift_deg": c.max_body_ita_shift_deg,
            "max_against_direction_deg": c.max_against_direction_deg,
        }
        prepared = pair.source_data(self.name)
        if prepared is None:
            faces = tuple(pair.source_faces)
            k = work_stride(pair.source.shape)
            analysis = SourceAnalysis(
                "",
                pair.source.shape,
                faces,
                pair.face_mask,
                pair.face_mask_mode,
                k,
                pair.work_source,
                region_mask=pair.edit_region_mask,
            )
            prepared = self.prepare(pair.source, analysis)
        metrics, facts = skin_measures(pair, prepared, c)
        body_limit = c.max_body_ita_shift_deg if c.max_body_ita_shift_deg is not None else 2 * c.max_ita_shift_deg
        judging = {**thresholds, "body_ita_limit_deg": body_limit}
        reasons, review = evaluate(SKIN_RULES, {**metrics, **facts}, judging, kind=pair.kind)
        return GateResult(self.name, not reasons, metrics, reasons, review, thresholds)


#: The skin gate's decision, in order. Judged figures are the unrounded ones (``*_judged``:
#: ``inpaint_gap_growth_deg``, ``face_body_gap_growth_deg``; ``tone_shift_judged``: the larger
#: absolute face or body ITA change; ``body_ita_change_judged``; ``against_direction_deg``:
#: the face's ITA change against the direction the condition asks for). ``not_control``: the
#: pair is not known to be a same-group control; ``tone_must_hold``: a limb edit or a control,
#: whose skin must keep its tone; ``require_congruent`` is the config's switch;
#: ``body_ita_limit_deg`` is ``max_body_ita_shift_deg``, else twice ``max_ita_shift_deg``.
SKIN_RULES: tuple[Rule, ...] = (
    Rule(
        "inpaint_gap_growth_judged",
        "above",
        "max_inpaint_gap_deg",
        "skin_inpaint_mismatch",
        kinds=("limb",),
        when="not_control",
    ),
    Rule("tone_shift_judged", "above", "max_ita_shift_deg", "skin_tone_shift", when="tone_must_hold"),
    # skin outside the region the prompt names must keep its tone whatever the condition
    Rule(
        "body_ita_change_judged",
        "abs_above",
        "body_ita_limit_deg",
        "skin_body_tone_shift",
        kinds=("face",),
        unless=("skin_tone_shift",),
    ),
    Rule("against_direction_deg", "above", "max_against_direction_deg", "skin_against_direction", kinds=("face",)),
    Rule(
        "face_body_gap_growth_judged",
        "above",
        "max_face_body_gap_growth_deg",
        "skin_face_body_mismatch",
        kinds=("face",),
        outcome="review",
        when="require_congruent",
    ),
)


def skin_measures(pair: PairContext, prepared: SourceSkin, c: SkinGateConfig) -> tuple[dict, dict]:
    """The skin gate's measures of ``pair`` and the facts :data:`SKIN_RULES` read; no
    decision (``lightened`` / ``darkened`` / ``face_body_incongruent`` record where a figure
    lies against its threshold)."""
    cand_face = pair.candidate_face
    src, cand = measure_candidate_skin(
        prepared,
        pair.candidate,
        candidate_landmarks=cand_face.landmarks if cand_face is not None else None,
        edit_mask=pair.edit_mask if pair.kind == "limb" else None,
        covered=pair.covered,
        work_candidate=pair.work_candidate,
    )
    control = is_control(
        pair.extras.get("condition"),
        pair.extras.get("source"),
        source_fields=c.source_fields,
        control_conditions=c.control_conditions,
    )
    face_change = _diff(cand.face_ita_deg, src.face_ita_deg)
    body_change = _diff(cand.body_ita_deg, src.body_ita_deg)
    src_gap = _diff(src.face_ita_deg, src.body_ita_deg)
    cand_gap = _diff(cand.face_ita_deg, cand.body_ita_deg)
    growth = None if src_gap is None or cand_gap is None else abs(cand_gap) - abs(src_gap)
    metrics: dict[str, Any] = {
        "face_ita_deg": finite_or_none(cand.face_ita_deg),
        "source_face_ita_deg": finite_or_none(src.face_ita_deg),
        "face_ita_change_deg": finite_or_none(face_change),
        "body_ita_deg": finite_or_none(cand.body_ita_deg),
        "source_body_ita_deg": finite_or_none(src.body_ita_deg),
        "body_ita_change_deg": finite_or_none(body_change),
        "face_body_gap_deg": finite_or_none(cand_gap),
        "source_face_body_gap_deg": finite_or_none(src_gap),
        "face_body_gap_growth_deg": finite_or_none(growth),
        "face_skin_px": cand.face_pixels,
        "body_skin_px": src.body_pixels,
        "body_skin_visible": src.body_ita_deg is not None,
        "control": control,
        "lightened": None if face_change is None else bool(face_change > c.max_ita_shift_deg),
        "darkened": None if face_change is None else bool(face_change < -c.max_ita_shift_deg),
    }
    shifts = [abs(v) for v in (face_change, body_change) if v is not None]
    facts: dict[str, Any] = {
        "not_control": control is not True,
        "tone_must_hold": pair.kind == "limb" or control is True,
        "tone_shift_judged": max(shifts) if shifts else None,
        "body_ita_change_judged": body_change,
    }
    if pair.kind == "limb":
        # the face is the person's best-measured skin (a landmark mask, no colour gate);
        # the body mask is the fallback for photos without a usable face
        def reference(t):
            return t.face_ita_deg if t.face_ita_deg is not None else t.body_ita_deg

        gap = _diff(cand.inpaint_ita_deg, reference(cand))
        before = _diff(src.inpaint_ita_deg, reference(src))
        # judged on how much further from the person's skin the region is than it was:
        # what the mask covered before (a glove, a prosthesis, a sleeve) may differ anyway
        inpaint_growth = None if gap is None else abs(gap) - (abs(before) if before is not None else 0.0)
        metrics["inpaint_ita_deg"] = finite_or_none(cand.inpaint_ita_deg)
        metrics["source_inpaint_ita_deg"] = finite_or_none(src.inpaint_ita_deg)
        metrics["inpaint_gap_deg"] = finite_or_none(gap)
        metrics["source_inpaint_gap_deg"] = finite_or_none(before)
        metrics["inpaint_gap_growth_deg"] = finite_or_none(inpaint_growth)
        metrics["inpaint_skin_px"] = cand.inpaint_pixels
        facts["inpaint_gap_growth_judged"] = inpaint_growth
    if pair.kind == "face":
        direction = _direction(pair.extras.get("condition"), c.direction_by_condition)
        metrics["requested_direction"] = direction
        facts["against_direction_deg"] = None if direction is None or face_change is None else -direction * face_change
        facts["face_body_gap_growth_judged"] = growth
        metrics["face_body_incongruent"] = None if growth is None else bool(growth > c.max_face_body_gap_growth_deg)
    return metrics, facts


GATES.register("skin", SkinGateConfig, SkinGate, order=50)
