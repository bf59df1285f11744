"""Audit existing counterfactual pairs: align each and run every gate (``counterfactory measure``,
one pair or a table of them with ``--batch``)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.generation.align import AlignConfig
from counterfactory.generation.editors.tables import TableError, read_table, table_folder
from counterfactory.generation.images import decoder_warnings
from counterfactory.generation.masks import load_mask_file
from counterfactory.generation.regions import DEFAULT_REGION
from counterfactory.generation.sources import SourceError, load_image
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import InputFileError, inside
from counterfactory.manifests.vocabulary import FAILED
from counterfactory.validation.faces import face_mask, get_face_landmarker
from counterfactory.validation.gate_stack import GatesConfig, GateStack
from counterfactory.validation.gates.locality import FLOOR_IMAGE
from counterfactory.validation.judging import floor_path_of, judge_output
from counterfactory.validation.skin import source_edit_region

#: decoded sources kept for the next pairs (a batch table is usually sorted by source)
SOURCES_KEPT = 4


class PairError(CounterfactoryError):
    """A pair's file cannot be read: ``code`` is the stable reason (a batch row's), ``message``
    (its text) names the file."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class _Source:
    pixels: np.ndarray
    sha256: str
    region: np.ndarray | None
    face_size: float | None
    notes: tuple[str, ...]


#: The face region ``measure`` judges without a spec: the one FOCUS's prompt names (face, neck,
#: ears, facial hair; ``face_only_v1``), the region the shipped thresholds are calibrated on.
AUDIT_REGION = "face_neck_ears"


class PairMeasurer:
    """Measures pairs as ``counterfactory measure`` does, with the settings and gate stacks built once.

    Sources are decoded once for the pairs that share them (the last few kept), and the stack's
    source cache reuses each source's analysis across its candidates, as a run does per template.
    """

    def __init__(self, spec_path: Path | None = None, *, diagnostics: bool = False) -> None:
        self.align_config, self.gates_config = AlignConfig(), GatesConfig()
        #: the face edit region, as a run of the spec draws it (the prompt's region, or
        #: ``gates.edit_region``); without a spec, ``gates.edit_region`` else :data:`AUDIT_REGION`
        self.region = self.gates_config.edit_region or AUDIT_REGION
        if spec_path is not None:
            from counterfactory.flows.engine.sources import edit_region_name
            from counterfactory.flows.engine.spec import load_spec

            spec = load_spec(spec_path)
            self.align_config, self.gates_config = spec.align, spec.gates
            self.region = edit_region_name(spec)
        if diagnostics:
            # the raw_* figures of a composited pair too (gates.diagnostics)
            self.gates_config = self.gates_config.model_copy(update={"diagnostics": True})
        self._stacks: dict[str, GateStack] = {}
        self._sources: OrderedDict[tuple[str, str, str | None], _Source] = OrderedDict()
        #: each source's floor output, measured once for the pairs that name it (a table's rows)
        self._floors: dict[tuple[str, str, str], tuple[dict[str, Any], np.ndarray | None]] = {}

    def _stack(self, kind: str) -> GateStack:
        if kind not in self._stacks:
            # the run's stack (counterfactory.flows.engine.execute.build_gate_stack): the same edit region
            self._stacks[kind] = GateStack.from_config(self.gates_config, kind, region=self.region)
        return self._stacks[kind]

    def _source(self, path: Path, kind: str, mask_path: Path | None) -> _Source:
        key = (str(path), kind, None if mask_path is None else str(mask_path))
        if key in self._sources:
            self._sources.move_to_end(key)
            return self._sources[key]
        try:
            loaded = load_image(path)
        except SourceError as exc:
            raise PairError("source_unreadable", str(exc)) from None
        region: np.ndarray | None
        face_size = None
        if kind == "limb":
            if mask_path is None:
                raise PairError("mask_missing", "limb pairs need --mask FILE (the limb region, white inside)")
            try:
                region = load_mask_file(mask_path, loaded.pixels.shape[:2])
            except (OSError, ValueError) as exc:
                raise PairError("mask_unreadable", str(exc)) from None
        else:
            faces = get_face_landmarker().detect(loaded.pixels)
            region = None
            if faces and self.region == DEFAULT_REGION:
                region = face_mask(faces[0].landmarks, loaded.pixels.shape[:2], mode=self.gates_config.face_mask)
            elif faces:
                # the region the run keeps out of registration and composites inside
                # (counterfactory.flows.engine.sources._check_source): the prompt's, drawn on the person
                region, _ = source_edit_region(
                    loaded.pixels, faces[0].landmarks, self.region, mode=self.gates_config.face_mask
                )
            face_size = faces[0].size_px if faces else None
        source = _Source(loaded.pixels, loaded.sha256, region, face_size, loaded.notes)
        self._sources[key] = source
        while len(self._sources) > SOURCES_KEPT:
            self._sources.popitem(last=False)
        return source

    def _judge(self, source: _Source, pixels: np.ndarray, kind: str, extras: dict[str, Any] | None = None):
        """``pixels`` aligned to ``source`` and judged, the run's way (:func:`judge_output`)."""
        return judge_output(
            source.pixels,
            pixels,
            kind=kind,
            region=source.region,
            face_size_px=source.face_size,
            align=self.align_config,
            stack=self._stack(kind),
            extras=extras,
            source_key=source.sha256,
        )

    def noise_floor(self, source: _Source, floor_path: Path, kind: str) -> tuple[dict[str, Any], np.ndarray | None]:
        """``(measures, registered image)`` of ``floor_path``, the editor's output for "return
        this photo unchanged" of this source, measured like a candidate (what a run's floor
        request gives): the locality measures, and the output registered to the source, which
        the locality gate compares with each candidate pixel by pixel.

        Raises:
            PairError: the file cannot be read, or could not be registered to the source.
        """
        from counterfactory.flows.engine.template import floor_metrics

        key = (source.sha256, str(floor_path), kind)
        if key in self._floors:
            return self._floors[key]
        try:
            image = load_image(floor_path)
        except SourceError as exc:
            raise PairError("floor_unreadable", str(exc)) from None
        judged = self._judge(source, image.pixels, kind)
        floor = floor_metrics(judged.gates, str(floor_path))
        if floor is None:
            raise PairError(
                "floor_unmeasurable",
                f"{floor_path}: the noise-floor image could not be measured against the source "
                f"({', '.join(judged.reasons) or 'no locality measures'}); give the editor's output for "
                "'return this photo unchanged' of the same source",
            )
        self._floors[key] = (floor, judged.image)
        while len(self._floors) > SOURCES_KEPT:
            self._floors.pop(next(iter(self._floors)))
        return floor, judged.image

    def measure(
        self,
        source_path: Path,
        candidate_path: Path,
        *,
        mask_path: Path | None = None,
        kind: str | None = None,
        condition: Mapping[str, str] | None = None,
        floor_path: Path | None = None,
    ) -> dict[str, Any]:
        """One pair's report (see :func:`measure_pair`).

        Raises:
            PairError: a file of the pair cannot be read; ``code`` says which.
        """
        kind = kind or ("limb" if mask_path is not None else "face")
        source = self._source(source_path, kind, mask_path)
        try:
            candidate = load_image(candidate_path)
        except SourceError as exc:
            raise PairError("candidate_unreadable", str(exc)) from None
        extras: dict[str, Any] = {"condition": dict(condition)} if condition else {}
        floor = None
        if floor_path is not None:
            floor, extras[FLOOR_IMAGE] = self.noise_floor(source, floor_path, kind)
            extras["noise_floor"] = floor
        judged = self._judge(source, candidate.pixels, kind, extras or None)
        return self._report(source_path, candidate_path, kind, source, candidate, judged, floor)

    def _report(self, source_path, candidate_path, kind, source, candidate, judged, floor) -> dict[str, Any]:
        return {
            "floor_path": floor_path_of(judged.gates),
            "noise_floor": floor,
            "source": str(source_path),
            "candidate": str(candidate_path),
            "kind": kind,
            "alignment": judged.alignment,
            "verdict": judged.verdict,
            "reasons": judged.reasons,
            "gates": judged.gates,
            "notes": {"source": list(source.notes), "candidate": list(candidate.notes)},
            "warnings": decoder_warnings(source.notes) + decoder_warnings(candidate.notes),
        }

    def measure_cohort(
        self, source_path: Path, candidates: Sequence[tuple[Path, Mapping[str, str] | None]]
    ) -> list[dict[str, Any] | PairError]:
        """Face pairs of one source judged together (:func:`~counterfactory.validation.judging.judge_cohort`):
        each against the median of the others, the cohort floor, as an import judges a set
        with several candidates per source. One report (as :meth:`measure`'s) or
        :class:`PairError` per candidate, in order.

        Raises:
            PairError: the source cannot be read.
        """
        from counterfactory.validation.judging import judge_cohort

        source = self._source(source_path, "face", None)
        loaded: list[Any] = []
        for path, _ in candidates:
            try:
                loaded.append(load_image(path))
            except SourceError as exc:
                loaded.append(PairError("candidate_unreadable", str(exc)))
        good = [i for i, c in enumerate(loaded) if not isinstance(c, PairError)]
        judged = judge_cohort(
            source.pixels,
            [loaded[i].pixels for i in good],
            kind="face",
            region=source.region,
            face_size_px=source.face_size,
            align=self.align_config,
            stack=self._stack("face"),
            extras=[{"condition": dict(candidates[i][1])} if candidates[i][1] else None for i in good],
            source_key=source.sha256,
        )
        out: list[dict[str, Any] | PairError] = list(loaded)
        for i, j in zip(good, judged, strict=True):
            out[i] = self._report(source_path, candidates[i][0], "face", source, loaded[i], j, None)
        return out


def measure_pair(
    source_path: Path,
    candidate_path: Path,
    *,
    mask_path: Path | None = None,
    kind: str | None = None,
    spec_path: Path | None = None,
    floor_path: Path | None = None,
    diagnostics: bool = False,
) -> dict[str, Any]:
    """Align ``candidate_path`` to ``source_path`` and judge it (relative to the editor's
    noise floor when ``floor_path``, its output for "return this photo unchanged", is given).

    Judges through :func:`counterfactory.validation.judging.judge_output`, the run's own path.
    Returns a JSON-ready dict: ``verdict``, ``reasons``, ``alignment`` and per-gate
    ``gates`` (metrics, thresholds, reasons), ``notes`` (what decoding normalised, per file)
    and ``warnings`` (the files' decoder warnings, e.g. a damaged PNG chunk skipped). When
    registration fails, face, identity and expression are still measured on the unregistered
    candidate and ``locality`` is marked ``measurable: false``.

    ``diagnostics``: also the ``locality.raw_*`` figures of a composited pair (the registered
    output before compositing; :attr:`~counterfactory.validation.gate_stack.GatesConfig.diagnostics`).

    Raises:
        PairError: a file cannot be read (its reason code and a message naming the file).
    """
    return PairMeasurer(spec_path, diagnostics=diagnostics).measure(
        source_path, candidate_path, mask_path=mask_path, kind=kind, floor_path=floor_path
    )


#: the columns of a batch table that are not condition labels (``prompt``: what the ``import``
#: editor backend records on the item, so one table serves both)
BATCH_COLUMNS = ("id", "source", "candidate", "mask", "prompt", "floor")


def measure_batch(
    table_path: Path,
    *,
    spec_path: Path | None = None,
    kind: str | None = None,
    diagnostics: bool = False,
) -> Iterator[dict[str, Any]]:
    """Measure every pair of the table at ``table_path``, one report at a time, in table order.

    The table (CSV, JSONL or Parquet; :func:`~counterfactory.generation.editors.tables.read_table`)
    has ``source`` and ``candidate`` (paths relative to the table's folder), an optional ``id``
    (default ``row<N>``), an optional ``mask`` (makes the pair a limb pair), an optional
    ``prompt`` (not read here) and any other columns, which are the pair's ``condition``. Each report is :func:`measure_pair`'s plus
    ``id`` and ``condition``; a pair whose file is missing or unreadable is reported with
    ``verdict: failed``, a reason code (``source_unreadable``, ``candidate_unreadable``,
    ``mask_unreadable``, ``row_incomplete``, ``path_refused``: an absolute path, one leading out
    of the table's folder through ``..`` or a symbolic link, or a NUL byte in it, none of which
    is read) and ``error`` (the message naming the row and column), and the batch goes on.

    Raises:
        TableError: the table itself cannot be read (raised before any pair is measured).
    """
    columns, rows = read_table(table_path)
    missing = [name for name in ("source", "candidate") if name not in columns]
    if missing:
        raise TableError(
            f"{table_path}: the table needs the column(s) {', '.join(missing)}; it has {', '.join(columns)}"
        )
    folder = table_folder(table_path)
    conditions = [name for name in columns if name not in BATCH_COLUMNS]
    measurer = PairMeasurer(spec_path, diagnostics=diagnostics)
    # every path a row names, resolved inside the table's folder first (nothing refused is read)
    resolved: dict[int, dict[str, Path] | str] = {}
    for row in rows:
        paths: dict[str, Path] = {}
        for column in ("source", "candidate", "mask", "floor"):
            value = row.get(column)
            if value is None:
                continue
            if column in row.embedded:  # the file the table's own bytes were written to
                paths[column] = Path(value)
                continue
            try:
                paths[column] = inside(folder, value, what="the table's folder", roots_field=None)
            except InputFileError as exc:
                paths = f"{table_path}, row {row.number}, column {column!r}: {exc}"
                break
        resolved[row.number] = paths
    # face pairs without a floor are judged per source, each against the others (the cohort
    # floor), as an import of the same table judges them; the reports keep the table's order
    cohorts: dict[Path, list[Any]] = {}
    if kind != "limb":
        for row in rows:
            paths = resolved[row.number]
            if isinstance(paths, dict) and {"source", "candidate"} <= set(paths) and not {"mask", "floor"} & set(paths):
                cohorts.setdefault(paths["source"], []).append(row)
    judged_rows: dict[int, Any] = {}
    for source_path, members in cohorts.items():
        if len(members) < 2:
            continue
        pairs = [
            (resolved[r.number]["candidate"], {n: r.values[n] for n in conditions if n in r.values}) for r in members
        ]
        try:
            reports = measurer.measure_cohort(source_path, pairs)
        except PairError as exc:
            reports = [exc] * len(members)
        for r, report in zip(members, reports, strict=True):
            judged_rows[r.number] = report
    for row in rows:
        pair_id = row.get("id") or f"row{row.number}"
        condition = {name: row.values[name] for name in conditions if name in row.values}
        base = {"id": pair_id, "row": row.number, "condition": condition}
        source, candidate = row.get("source"), row.get("candidate")
        base.update({"source": source, "candidate": candidate})
        if source is None or candidate is None:
            yield {
                **base,
                "verdict": FAILED,
                "reasons": ["row_incomplete"],
                "error": f"{table_path}, row {row.number}: no {'source' if source is None else 'candidate'} path",
            }
            continue
        paths = resolved[row.number]
        if isinstance(paths, str):
            yield {**base, "verdict": FAILED, "reasons": ["path_refused"], "error": paths}
            continue
        try:
            report = judged_rows.get(row.number)
            if isinstance(report, PairError):
                raise report
            if report is None:
                report = measurer.measure(
                    paths["source"],
                    paths["candidate"],
                    mask_path=paths.get("mask"),
                    kind=kind,
                    condition=condition,
                    floor_path=paths.get("floor"),
                )
        except PairError as exc:
            yield {**base, "verdict": FAILED, "reasons": [exc.code], "error": exc.message}
            continue
        yield {**base, **report, "source": source, "candidate": candidate}


def summarise_batch(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per verdict, and per verdict for each value of each condition column.

    Returns:
        ``{"pairs": n, "verdicts": {verdict: n}, "by_condition": {column: {value: {verdict: n}}}}``.
    """
    verdicts: Counter[str] = Counter(r["verdict"] for r in reports)
    by_condition: dict[str, dict[str, Counter[str]]] = {}
    for report in reports:
        for column, value in report.get("condition", {}).items():
            by_condition.setdefault(column, {}).setdefault(value, Counter())[report["verdict"]] += 1
    return {
        "pairs": len(reports),
        "verdicts": dict(sorted(verdicts.items())),
        "by_condition": {
            column: {value: dict(sorted(c.items())) for value, c in sorted(values.items())}
            for column, values in sorted(by_condition.items())
        },
    }
