"""Sources: load every photo, check it can serve the design, record it; plan the grid.

:func:`prepare_sources` keeps a face source's check (its face mask in the store, its reason and
face size in the ledger) under :func:`source_check_key`, so a resumed run does not run the face
landmarker again. :func:`plan_grid` is the stratified templates x conditions (or the grid an
``import`` backend's table fixes), :func:`editor_runs` the grid once per editor a spec compares.
Plain functions, no Prefect.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.editors.base import hooks_of
from counterfactory.generation.masks import apply_mask_options, mask_from_record
from counterfactory.generation.prompts import face_region
from counterfactory.generation.sampling import Cell, Grid, expand_grid, for_editor
from counterfactory.generation.sources import FailedSource, PreparedSource, Source, iter_sources
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.judging import (
    no_source_mode,
)
from counterfactory.validation.skin import source_edit_region


def _record_meta(source: Source | FailedSource) -> dict[str, Any]:
    record = source.record
    if record is None:
        return {}
    return record.model_dump(mode="json")


#: bump when a face source's check (face count, face mask, face size) is computed differently
SOURCE_CHECK_VERSION = 2


@functools.cache
def _landmarker_identity() -> str:
    """sha256 of the face landmarker model file: a new model may find other faces and masks."""
    from counterfactory.manifests.store import sha256_file
    from counterfactory.validation.faces import FACE_LANDMARKER

    return sha256_file(Path(FACE_LANDMARKER))


def source_check_key(spec: Spec, source: Source) -> str | None:
    """sha256 of what decides a face source's check: the photo's bytes, the face-mask mode and
    the landmarker model (None for limb designs, whose masks are read from files every run)."""
    if spec.design.kind != "face" or no_source_mode(spec) is not None:
        return None  # (a set without source photos checks no face in the scene's image)
    payload = {
        "version": SOURCE_CHECK_VERSION,
        "photo_sha256": source.sha256,
        "shape": list(source.pixels.shape),
        "face_mask": spec.gates.face_mask,
        "edit_region": edit_region_name(spec),
        "landmarker": _landmarker_identity(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def edit_region_name(spec: Spec) -> str:
    """The edit region a face design's gates measure around: ``gates.edit_region``, else the
    one its prompt names (:func:`~counterfactory.generation.prompts.face_region`)."""
    return spec.gates.edit_region or face_region(spec.prompts)


def prepare_sources(
    spec: Spec, ledger: Ledger, store: ImageStore | None = None
) -> tuple[list[PreparedSource], list[FailedSource]]:
    """Load every source, check it can serve the design, and record each in the ledger.

    Face designs need exactly one face in the source; limb designs need a limb mask.
    A source that cannot serve becomes a :class:`FailedSource` with its reason, and so does a
    second id for the same photo with the same edit region (``source_duplicate``).

    With a ``store``, a face source's check is kept (its face mask in the store, its face size
    and its reason in the ledger's ``sources`` row, under :func:`source_check_key`), and a later
    run with the same key reads it back instead of running the face landmarker again: a
    resumed run then costs what loading the photos and the ledger costs.
    """
    # one photo decoded at a time: each usable source is kept released (its pixels are decoded
    # again when its template runs), so the run's memory does not grow with the photos
    loaded = iter_sources(spec.sources.photos, spec.sources.metadata, max_pixels=spec.sources.max_pixels)
    kept = {row.source_id: (row.meta or {}).get("check") for row in ledger.sources()} if store is not None else {}
    landmarker = None
    checks: dict[str, dict[str, Any]] = {}
    usable: list[PreparedSource] = []
    failed: list[FailedSource] = []
    # (photo sha256, region sha256) -> first id: two ids with both equal would make the same
    # attempts (the same item ids) twice, so the later one fails as a duplicate
    first_by_content: dict[tuple[str, str], str] = {}
    for item in loaded:
        if isinstance(item, FailedSource):
            failed.append(item)
            continue
        key = source_check_key(spec, item) if store is not None else None
        reason, prepared = _kept_check(item, kept.get(item.record.id), key, store)
        if no_source_mode(spec) is not None:
            # an imported set without source photos: the scene's image stands for the scene in
            # the release and is never compared with, so it needs no face and no edit region
            reason, prepared = (
                None,
                PreparedSource(item, np.zeros(item.pixels.shape[:2], np.uint8), None, _record_meta(item)),
            )
        elif key is None or reason is _NOT_KEPT:
            landmarker = landmarker or get_face_landmarker()
            reason, prepared = _check_source(spec, item, landmarker)
            if key is not None:
                checks[item.record.id] = {
                    "key": key,
                    "reason": reason,
                    "region_sha256": store.put(prepared.region) if prepared is not None else None,
                    "face_size_px": prepared.face_size_px if prepared is not None else None,
                    **({k: prepared.meta[k] for k in _REGION_FLAGS if k in prepared.meta} if prepared else {}),
                }
        elif key is not None:
            checks[item.record.id] = kept[item.record.id]
        if reason is None:
            key = (item.sha256, hashlib.sha256(np.ascontiguousarray(prepared.region).tobytes()).hexdigest())
            if key in first_by_content:
                reason = (
                    f"source_duplicate: {item.path.name} is the same photo (sha256 {item.sha256[:12]}) with the "
                    f"same edit region as source {first_by_content[key]!r}; list each photo once in the metadata"
                )
            else:
                first_by_content[key] = item.record.id
        if reason is not None:
            failed.append(FailedSource(id=item.record.id, path=item.path, reason=reason, record=item.record))
        else:
            usable.append(prepared.released())
    rows = [
        {
            "source_id": ok.id,
            "path": str(ok.source.path),
            "sha256": ok.source.sha256,
            "status": "ok",
            "meta": {**ok.meta, "normalisation": list(ok.source.notes), **_check_of(checks, ok.id)},
        }
        for ok in usable
    ]
    rows += [
        {
            "source_id": bad.id,
            "path": str(bad.path),
            "sha256": None,
            "status": "failed",
            "reason": bad.reason,
            "meta": {**_record_meta(bad), **_check_of(checks, bad.id)},
        }
        for bad in failed
    ]
    ledger.record_sources(rows)  # one transaction for every source
    return usable, failed


def _check_of(checks: dict[str, dict[str, Any]], source_id: str) -> dict[str, Any]:
    return {"check": checks[source_id]} if source_id in checks else {}


#: :func:`_kept_check`'s answer when there is no usable kept check
_NOT_KEPT = "not kept"


def _kept_check(
    source: Source, kept: dict[str, Any] | None, key: str | None, store: ImageStore | None
) -> tuple[str | None, PreparedSource | None]:
    """A face source's check as an earlier run recorded it under the same ``key``, or
    ``(_NOT_KEPT, None)`` (no record, another key, or its mask gone from the store)."""
    if key is None or store is None or not isinstance(kept, dict) or kept.get("key") != key:
        return _NOT_KEPT, None
    if kept.get("reason") is not None:
        return kept["reason"], None
    sha = kept.get("region_sha256")
    if not sha or not store.has(sha):
        return _NOT_KEPT, None
    region = store.get(sha)
    if region.shape != source.pixels.shape[:2]:
        return _NOT_KEPT, None
    flags = {k: kept[k] for k in _REGION_FLAGS if k in kept}
    return None, PreparedSource(source, region, kept.get("face_size_px"), {**_record_meta(source), **flags})


#: what a face source's check records about its edit region (kept with the check)
_REGION_FLAGS = ("edit_region", "source_body_skin_visible", "source_body_skin_px")


def _check_source(spec: Spec, source: Source, landmarker) -> tuple[str | None, PreparedSource | None]:
    pixels = source.pixels
    faces = landmarker.detect(pixels)
    shape = pixels.shape[:2]
    meta = _record_meta(source)
    if spec.design.kind == "face":
        if len(faces) != 1:
            what = "no face" if not faces else f"{len(faces)} faces"
            return (
                f"source_face_count: found {what} in {source.path.name}; face edits need exactly one "
                "face (crop the photo to one person, or remove it from the metadata)",
                None,
            )
        # the region the prompt names; a source that shows body skin outside it is flagged
        # (recorded, not a failure: a face-only edit leaves face and hands apart by design)
        region, flags = source_edit_region(
            pixels, faces[0].landmarks, edit_region_name(spec), mode=spec.gates.face_mask
        )
        return None, PreparedSource(source, region, faces[0].size_px, {**meta, **flags})
    if source.record.limb_mask is None:
        return (
            f"source_no_limb_mask: {source.record.id} has no limb_mask in the metadata; limb designs "
            "need polygons, an RLE or a mask file for every source",
            None,
        )
    try:
        region = mask_from_record(source.record, spec.sources.photos, shape)
    except (OSError, ValueError) as exc:
        return f"source_bad_limb_mask: {exc}", None
    region = apply_mask_options(region, spec.masks)
    if not region.any():
        return f"source_empty_limb_mask: the limb mask of {source.record.id} is empty", None
    return None, PreparedSource(source, region, faces[0].size_px if faces else None, meta)


def plan_grid(spec: Spec, sources: Sequence[PreparedSource]) -> Grid:
    """The stratified templates x conditions of ``sources`` (:func:`~counterfactory.generation.sampling.expand_grid`),
    or, for a backend whose input fixes the cells (the ``import`` backend: one per row of its
    table), the grid its options plan (``plan_grid(records, design)``)."""
    records = [s.source.record for s in sources]
    planned = hooks_of(spec.editor.options()).plan_grid
    return planned(records, spec.design) if planned is not None else expand_grid(records, spec.design)


def editor_runs(spec: Spec, grid: Grid) -> list[tuple[Spec, list[Cell]]]:
    """``(editor view, its cells)`` per editor the grid runs with
    (:meth:`~counterfactory.flows.engine.spec.Spec.editor_views`): one pair, ``(spec, grid's
    cells)``, for a one-editor spec; with ``editors``, each editor's view and the grid's cells
    labelled with its name (:func:`~counterfactory.generation.sampling.for_editor`)."""
    return [(view, for_editor(grid.cells, view.editor_name)) for view in spec.editor_views()]


def prepare_source(spec: Spec, source: Source) -> PreparedSource:
    """One source's edit region and face size, exactly as the run computed them.

    The review site calls this to show the mask a candidate was edited inside.

    Raises:
        ValueError: the source cannot serve the design (the reason the run gave it).
    """
    reason, prepared = _check_source(spec, source, get_face_landmarker())
    if prepared is None:
        raise ValueError(reason)
    return prepared
