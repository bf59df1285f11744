"""Judging one editor output: register it to its source, run the gates, record the candidate.

:func:`judge_output` is the one judging path of ``counterfactory run`` and ``counterfactory
measure`` (``judge_alone`` for a set with no source photo, ``judge_cohort`` for outputs judged
together). Nothing here writes: the engine's :class:`~counterfactory.flows.engine.judge.TemplateJudge`
records what these return in the run's ledger. Plain functions: no Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactory.generation.align import AlignConfig, Alignment, align_candidate
from counterfactory.manifests.store import ImageStore
from counterfactory.manifests.vocabulary import ACCEPTED, FLOOR, NEEDS_REVIEW, REJECTED
from counterfactory.validation.gate_stack import GateStack
from counterfactory.validation.gates.base import REGISTRATION_FAILED

#: the cell id suffix and the candidate verdict of a template's noise-floor request: not a
#: cell of the grid, never reviewed or published as an item
FLOOR_VERDICT = FLOOR


@dataclass(frozen=True)
class Judged:
    """One stored output after alignment and the gates.

    Attributes:
        verdict: ``accepted``, ``rejected``, ``needs_review`` or ``failed``.
        reasons: stable reason codes (``align_...``, ``<gate>_...``).
        image_sha256: the aligned image in the store, or None (not aligned, or no store).
        alignment: :meth:`~counterfactory.generation.align.Alignment.record`.
        gates: per-gate metrics, thresholds and reasons (``Judgement.to_dict()["gates"]``).
        image: the aligned image itself (``(H, W, 3)`` uint8), or None when not aligned.
    """

    verdict: str
    reasons: list[str]
    image_sha256: str | None
    alignment: dict[str, Any]
    gates: dict[str, Any]
    image: np.ndarray | None = None


def floor_path_of(gates: Mapping[str, Any] | None) -> str | None:
    """Which floor judged an output: ``request`` (the run's "return this photo unchanged"
    output), ``cohort`` (the median of the same source's other outputs) or ``none``, from its
    locality record (``metrics.floor_path``); None where locality did not measure it (limb
    cells, a registration that failed, a set with no source photo)."""
    return (((gates or {}).get("locality") or {}).get("metrics") or {}).get("floor_path")


def no_source_mode(spec: Any) -> bool | None:
    """None when the spec's cells are judged against their source; else (the editor's options
    say ``no_source``) whether a candidate that passes every gate that can run alone is
    accepted (``accept_on_remaining``)."""
    options = spec.editor.options()
    if not getattr(options, "no_source", False):
        return None
    return bool(getattr(options, "accept_on_remaining", False))


#: the gates that judge a candidate alone (its faces, its perceived labels): the only ones run
#: when a set has no source photo (:func:`judge_alone`); every other gate compares with a source
SOURCE_FREE_GATES = ("face", "attribute")
#: the review reason of a candidate judged without a source that passed every gate that ran
SOURCE_GATES_SKIPPED = "import_source_gates_skipped"
#: why :func:`judge_alone` skips a gate (recorded on the candidate, shown in the report)
SKIPPED_WHY = "no source photo: the gate compares the candidate with its source"


def judge_alone(
    output: np.ndarray,
    *,
    kind: str,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    accept: bool = False,
) -> Judged:
    """Judge an output that has no source photo (an imported set like PAIRS: one scene, several
    generated people): nothing is registered, and only :data:`SOURCE_FREE_GATES` run, on the
    candidate alone (the face gate counts and scores its faces; the attribute gate reads its
    labels). The gates skipped are listed in the alignment record (``skipped_gates``).

    The verdict is the remaining gates' (``rejected``, ``failed`` and ``needs_review`` as they
    say); one that passes all of them is ``needs_review`` with :data:`SOURCE_GATES_SKIPPED`
    (a person judges what no gate could), unless ``accept``: then ``accepted``, judged on the
    remaining gates, its skipped gates listed on the item.
    """
    from counterfactory.validation.gates.face import NO_SOURCE

    skipped = [g.name for g in stack.gates if g.name not in SOURCE_FREE_GATES]
    kept = stack.without(*skipped)
    image = np.ascontiguousarray(output)
    sha = store.put(image) if store is not None else None
    judgement = kept.evaluate(image, image, extras={**(extras or {}), NO_SOURCE: True}, source_key=sha)
    verdict, reasons = judgement.verdict, list(judgement.reasons)
    if verdict == ACCEPTED and skipped and not accept:
        verdict, reasons = NEEDS_REVIEW, [SOURCE_GATES_SKIPPED]
    record = {"ok": None, "no_source": True, "note": SKIPPED_WHY, "skipped_gates": skipped}
    return Judged(verdict, reasons, sha, record, judgement.to_dict()["gates"])


#: the gates whose metrics need a registered candidate (skin measures both images on the
#: source's body mask); the others measure faces, which an unregistered candidate still has
PIXEL_GATES = ("locality", "skin")


def judge_output(
    source: np.ndarray,
    output: np.ndarray,
    *,
    kind: str,
    region: np.ndarray | None,
    face_size_px: float | None,
    align: AlignConfig,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    source_key: str | None = None,
) -> Judged:
    """Align one editor output to its source and run the gates on it: the one judging path of
    ``run`` and ``measure``.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        output: ``(h, w, 3)`` uint8 RGB as the editor returned it, any size.
        kind: ``"face"`` or ``"limb"``.
        region: ``(H, W)`` uint8 {0, 255}, the region the study varies (face or limb mask), or None.
        face_size_px: the source face's size in pixels, or None.
        align: alignment settings.
        stack: the gates for ``kind``.
        store: where the aligned image is put (None: not stored).
        extras: the cell's ``condition`` (axis -> value) and the ``source`` metadata record,
            for the gates that judge the requested change (skin tone).
        source_key: names the source's pixels (the photo file's sha256) for the stack's
            source cache, so every cell of a template reuses one analysis of its source
            (:meth:`~counterfactory.validation.gate_stack.GateStack.analysis_for`); None: hashed.

    When registration fails the verdict is ``rejected`` with the ``align_...`` reason first, and
    the gates that do not need pixel registration (face, identity, expression) still measure the
    unregistered candidate on its own landmarks (``extras[REGISTRATION_FAILED]``: the expression gate
    reads the mesh and the AUs, not the pixel shifts, which need the pair registered); their
    rejection reasons follow the alignment's, so a smile or a new framing is named beside it.
    ``locality`` and ``skin`` are recorded as not measurable.
    """
    alignment = align_candidate(source, output, mask=region, kind=kind, face_size_px=face_size_px, config=align)
    return judge_aligned(
        source,
        output,
        alignment,
        kind=kind,
        region=region,
        stack=stack,
        store=store,
        extras=extras,
        source_key=source_key,
    )


def judge_aligned(
    source: np.ndarray,
    output: np.ndarray,
    alignment: Alignment,
    *,
    kind: str,
    region: np.ndarray | None,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    source_key: str | None = None,
) -> Judged:
    """:func:`judge_output` after its alignment: the gates on ``output`` registered as
    ``alignment`` says (the same arguments; a cohort aligns all its members first,
    :func:`judge_cohort`)."""
    record = alignment.record()
    edit_mask = region if kind == "limb" else None
    if not alignment.ok:
        reasons = [alignment.reason or "align_failed"]
        gates: dict[str, Any] = {}
        if alignment.image is not None and alignment.image.shape == source.shape:
            # what the editor did, read on the unregistered candidate's own landmarks (faces,
            # pose, framing, expression on the mesh; nothing that compares pixels in place):
            # its reasons stand beside the alignment's, so a smile or a zoom is named as such
            unregistered = {**(extras or {}), REGISTRATION_FAILED: True}
            judgement = stack.without(*PIXEL_GATES).evaluate(
                source, alignment.image, edit_mask=edit_mask, extras=unregistered, source_key=source_key
            )
            gates = judgement.to_dict()["gates"]
            if judgement.verdict == REJECTED:
                reasons += [r for r in judgement.reasons if r not in reasons]
        for name in PIXEL_GATES:
            if stack.has(name):
                gates[name] = {
                    "passed": False,
                    "measurable": False,
                    "metrics": {},
                    "reasons": [],
                    "review": [],
                    "thresholds": {},
                    "note": "not measurable: the candidate could not be registered to the source",
                }
        return Judged(REJECTED, reasons, None, record, gates)
    sha = store.put(alignment.image) if store is not None else None
    judgement = stack.evaluate(
        source,
        alignment.image,
        edit_mask=edit_mask,
        extras=extras,
        covered=alignment.covered,
        raw_candidate=alignment.raw,
        unregistered=output,
        source_key=source_key,
    )
    return Judged(
        judgement.verdict, list(judgement.reasons), sha, record, judgement.to_dict()["gates"], alignment.image
    )


def judge_cohort(
    source: np.ndarray,
    outputs: Sequence[np.ndarray],
    *,
    kind: str,
    region: np.ndarray | None,
    face_size_px: float | None,
    align: AlignConfig,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Sequence[Mapping[str, Any] | None] | None = None,
    source_key: str | None = None,
    members: Sequence[np.ndarray] = (),
) -> list[Judged]:
    """Judge several outputs of one source against each other: the cohort floor.

    Every output is registered to the source first; then each is judged with, as its floor,
    the pixelwise median of the *other* registered outputs (and of ``members``: more outputs
    of the same source already registered, e.g. earlier rounds' cells) on the gates' working
    grid (:func:`~counterfactory.validation.cohort.cohort_floors`): what the editor rendered
    alike in all of them outside the edit region is its re-rendering of unchanged content,
    and what one output alone changed stands out. With fewer than
    :data:`~counterfactory.validation.cohort.COHORT_MIN_OTHERS` others registered, an output
    is judged with no floor (``floor_path: none``). Same arguments as :func:`judge_output`,
    ``extras`` one per output.
    """
    from counterfactory.validation.cohort import cohort_floors
    from counterfactory.validation.gates.locality import FLOOR_WORK_IMAGE
    from counterfactory.validation.segment import work_stride

    extras = list(extras) if extras is not None else [None] * len(outputs)
    alignments = [
        align_candidate(source, out, mask=region, kind=kind, face_size_px=face_size_px, config=align) for out in outputs
    ]
    k = work_stride(source.shape)
    grid = [a.image[::k, ::k] if a.ok and a.image is not None else None for a in alignments]
    floors = cohort_floors(grid, [m[::k, ::k] for m in members])
    judged = []
    for out, alignment, extra, floor in zip(outputs, alignments, extras, floors, strict=True):
        extra = dict(extra or {})
        if floor is not None:
            extra["noise_floor"] = {"path": "cohort", "members": floor.members}
            extra[FLOOR_WORK_IMAGE] = floor.image
        judged.append(
            judge_aligned(
                source,
                out,
                alignment,
                kind=kind,
                region=region,
                stack=stack,
                store=store,
                extras=extra,
                source_key=source_key,
            )
        )
    return judged
