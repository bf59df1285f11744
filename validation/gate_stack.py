"""Build the gate stack from the spec and judge one aligned pair.

``GateStack.evaluate`` checks the inputs, runs the face analysis once per image, hands every
gate the same :class:`~counterfactory.validation.gates.base.PairContext`, and combines the results into a
verdict. Bad input (another size, no face, a blank image, NaNs) comes back as a rejection
with reason codes; only a backend that cannot load raises, when the stack is built.

Thresholds a spec leaves out come from the shipped calibration
(:mod:`counterfactory.validation.thresholds`), per edit kind and for the backend they were measured with.

Every cell of a template is judged against the same source photo, so what the gates measure
on the source alone is computed once per source (:meth:`GateStack.analyse_source`, a
:class:`~counterfactory.validation.gates.base.SourceAnalysis`) and kept in the stack's
:class:`SourceCache`, keyed by the sha256 of the source's pixels: ``evaluate`` finds it there
for every further candidate of that source. A caller that already knows a key for the source
(the image store's sha256) passes ``source_key`` and saves the hashing; one that handles a
template at a time may pass the analysis itself (``analysis=``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from counterfactory.generation.regions import DEFAULT_REGION, get_region
from counterfactory.manifests.errors import SetupError
from counterfactory.validation.faces import FaceLandmarker, MaskMode, face_mask, get_face_landmarker, region_mask
from counterfactory.validation.gates.base import (
    Gate,
    GateResult,
    Judgement,
    PairContext,
    PreparingGate,
    SourceAnalysis,
    combine,
    not_finite_metrics,
)
from counterfactory.validation.gates.inputs import input_gate
from counterfactory.validation.gates.registry import GATES, GatePlugin
from counterfactory.validation.segment import PersonSegmenter, get_person_segmenter, work_stride
from counterfactory.validation.thresholds import RECALIBRATE, calibrated_gates

Kind = Literal["face", "limb"]


def _gate_options(plugin: GatePlugin, kind: str, given: Any, calibrated: dict[str, Any]) -> BaseModel | None:
    """``gates.<kind>.<plugin.name>`` as the gate's options model, missing settings calibrated.

    A gate set to None stays disabled. A gate whose chosen backend differs from the one
    calibrated keeps only its backend-free defaults (a cosine of one model is not a cosine
    of another); a required threshold then missing is an error that names the fix.

    Raises:
        ValidationError: located under the gate's name (``identity.min_cosine``), so the
            spec's message names ``gates.<kind>.<gate>.<field>``.
    """
    name, options = plugin.name, plugin.options
    if given is None:
        return None
    if isinstance(given, options):
        return given  # an already-built sub-config is taken as it is
    if isinstance(given, BaseModel):
        given = given.model_dump()
    if not isinstance(given, dict):
        raise _located(
            name, [("gate_settings", "a mapping of the gate's settings, or null to switch it off", (), given)]
        )
    defaults = dict(calibrated.get(name, {}))
    cal_backend = defaults.get("backend")
    backend = given.get("backend", cal_backend)
    if cal_backend is not None and backend != cal_backend:
        for key in plugin.backend_keys:
            defaults.pop(key, None)
    merged = {**defaults, **given}
    missing = [key for key, field in options.model_fields.items() if field.is_required() and key not in merged]
    if missing and cal_backend is not None and backend != cal_backend:
        names = ", ".join(missing)
        message = (
            f"{names} for backend {backend!r}, which the shipped calibration did not measure (it measured "
            f"{cal_backend!r}); set {names} in gates.{kind}.{name}, or re-run `{RECALIBRATE}` with that backend"
        )
        raise _located(name, [("calibration_missing", message, (), given)])
    try:
        return options.model_validate(merged)
    except ValidationError as exc:
        raise _located(name, [(e["type"], e["msg"], e["loc"], e.get("input")) for e in exc.errors()]) from None


def _located(gate: str, errors: list[tuple[str, str, tuple[Any, ...], Any]]) -> ValidationError:
    """One ValidationError whose errors sit under ``gate`` (type, message, location, input kept)."""
    escape = str.maketrans({"{": "{{", "}": "}}"})
    return ValidationError.from_exception_data(
        "KindGatesConfig",
        [
            {"type": PydanticCustomError(kind, message.translate(escape)), "loc": (gate, *loc), "input": value}
            for kind, message, loc, value in errors
        ],
    )


#: the key under which :class:`GatesConfig` hands each kind's settings the pinned calibration
#: file (``gates.calibration``); never written by a user, never dumped
PINNED_CALIBRATION = "__calibration__"


class KindGatesConfig(BaseModel):
    """Gate choices and thresholds for one edit kind (``gates.face`` / ``gates.limb``).

    One entry per gate registered in :data:`~counterfactory.validation.gates.registry.GATES`, read as
    an attribute (``config.identity``): the gate's options model, or None when it is off.
    Every gate is on by default with the calibrated thresholds for ``kind``; set a gate to
    ``null`` to switch it off, or give any of its fields to override them. Opt-in gates (the
    ``attribute`` gate reads a classifier the user supplies) are on only when configured.
    """

    model_config = ConfigDict(extra="allow")

    kind: Kind = "face"

    @model_validator(mode="before")
    @classmethod
    def _gates(cls, data: Any) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return data
        data = dict(data)
        pinned = data.pop(PINNED_CALIBRATION, None)
        kind = data.get("kind", "face")
        if kind not in ("face", "limb"):
            return data  # the ``kind`` field reports it
        unknown = [name for name in data if name != "kind" and name not in GATES]
        if unknown:
            valid = f"one of the registered gates ({', '.join(GATES.names())}); check its spelling"
            raise ValidationError.from_exception_data(
                "KindGatesConfig",
                [
                    {"type": PydanticCustomError("unknown_gate", valid), "loc": (name,), "input": data[name]}
                    for name in unknown
                ],
            )
        try:
            calibrated = calibrated_gates(kind, pinned)
        except KeyError:
            if pinned is None:
                raise
            calibrated = calibrated_gates(kind)  # the pinned file fits the other kind only
        out: dict[str, Any] = {"kind": kind}
        for plugin in GATES.plugins():
            if plugin.name not in data:
                given = None if plugin.opt_in else {}
            else:
                given = data[plugin.name]
            out[plugin.name] = _gate_options(plugin, kind, given, calibrated)
        return out

    def enabled(self) -> list[tuple[GatePlugin, BaseModel]]:
        """The configured gates in stack order, each with its options."""
        extra = self.__pydantic_extra__ or {}
        return [(p, extra[p.name]) for p in GATES.plugins() if extra.get(p.name) is not None]


class GatesConfig(BaseModel):
    """``gates`` in the spec: one set per edit kind, and how the face mask is drawn."""

    model_config = ConfigDict(extra="forbid")

    face_mask: MaskMode = "oval"
    #: a calibration file (``counterfactory calibrate --from-review RUN --out DIR`` writes
    #: ``DIR/calibration.json``) whose thresholds replace the shipped ones for every threshold
    #: the spec leaves out; relative to the spec file's folder; its sha256 enters the judge key
    #: and the release names it. None: the shipped calibration.
    calibration: Path | None = None
    #: the edit region the gates measure body skin outside
    #: (:data:`~counterfactory.generation.regions.REGIONS`); None: the one the face prompt
    #: names (the run passes it to :meth:`GateStack.from_config`), else ``face``.
    edit_region: str | None = None
    #: Face designs: spend one request per template and editor asking for the photo unchanged
    #: (``assets/prompts/noise_floor_v1.txt``) and judge the locality measures of its cells
    #: relative to that output, the editor's own re-rendering of the photo
    #: (:func:`~counterfactory.validation.gates.locality.noise_floor_of`). False: judged as measured.
    noise_floor: bool = True
    #: Face designs: when a template has no floor output (an imported set without a ``floor``
    #: column, ``noise_floor: false``), judge its cells together, each above the median of the
    #: others (:mod:`~counterfactory.validation.cohort`); False: each as a lone pair.
    cohort_floor: bool = True
    #: Also measure the registered output before compositing (composited cells: every limb
    #: cell, face cells with ``align.composite: mask``) and record its figures as
    #: ``locality.raw_*``: a diagnostic no rule, report or release reader judges, which doubles
    #: the locality gate's face measures of such a cell. False: not measured (``counterfactory
    #: measure --diagnostics`` asks for them on one pair). True enters the judge key.
    diagnostics: bool = False
    face: KindGatesConfig = Field(default_factory=lambda: KindGatesConfig(kind="face"))
    limb: KindGatesConfig = Field(default_factory=lambda: KindGatesConfig(kind="limb"))

    @field_validator("edit_region")
    @classmethod
    def _known_region(cls, value: str | None) -> str | None:
        if value is not None:
            get_region(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _kinds(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        pinned = data.get("calibration")
        for kind in ("face", "limb"):
            sub = data.get(kind)
            if pinned is not None and (sub is None and kind not in data or isinstance(sub, dict)):
                sub = {**(sub or {}), PINNED_CALIBRATION: str(pinned)}
                data[kind] = sub
            if isinstance(sub, dict):
                if sub.get("kind", kind) != kind:
                    raise ValueError(f"gates.{kind}.kind must be {kind!r}, got {sub['kind']!r}")
                data[kind] = {**sub, "kind": kind}
            elif isinstance(sub, KindGatesConfig) and sub.kind != kind:
                raise ValueError(f"gates.{kind} holds thresholds for kind {sub.kind!r}")
            elif sub is None and kind in data:
                raise ValueError(f"gates.{kind} must be a mapping of gates (set single gates to null)")
        return data

    def for_kind(self, kind: Kind) -> KindGatesConfig:
        if kind not in ("face", "limb"):
            raise ValueError(f"edit kind must be 'face' or 'limb', got {kind!r}")
        return self.face if kind == "face" else self.limb


def pixel_key(image: np.ndarray) -> str:
    """sha256 (hex) of an array's shape, dtype and bytes: names exactly these pixels."""
    a = np.ascontiguousarray(image)
    digest = hashlib.sha256(f"{a.shape}|{a.dtype.str}|".encode())
    digest.update(memoryview(a).cast("B"))
    return digest.hexdigest()


class SourceCache:
    """The last ``max_items`` source analyses of one :class:`GateStack`, by key.

    A run judges every cell of a template against one source, so a few entries serve it; the
    analyses hold a few full-size masks each (about 3 bytes a pixel), so keep ``max_items``
    small. Thread-safe; ``hits`` and ``misses`` count lookups.
    """

    def __init__(self, max_items: int = 4) -> None:
        if max_items < 0:
            raise ValueError(f"SourceCache max_items must be >= 0, got {max_items}")
        self.max_items = max_items
        self._items: OrderedDict[str, SourceAnalysis] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> SourceAnalysis | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return found

    def put(self, analysis: SourceAnalysis) -> None:
        if self.max_items == 0:
            return
        with self._lock:
            self._items[analysis.key] = analysis
            self._items.move_to_end(analysis.key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class GateStack:
    """The configured gates for one edit kind, with the models they share loaded once.

    ``sources`` is its :class:`SourceCache` (shared with :meth:`without`'s stacks).
    """

    def __init__(
        self,
        gates: list[Gate],
        *,
        kind: Kind,
        face_mask_mode: MaskMode = "oval",
        landmarker: FaceLandmarker | None = None,
        segmenter: PersonSegmenter | None = None,
        sources: SourceCache | None = None,
        region: str = DEFAULT_REGION,
        diagnostics: bool = False,
    ) -> None:
        self.gates = gates
        self.kind = kind
        #: whether a pair's ``raw_candidate`` is measured (:attr:`GatesConfig.diagnostics`)
        self.diagnostics = diagnostics
        self.face_mask_mode = face_mask_mode
        self.region = get_region(region).name
        self.landmarker = landmarker or get_face_landmarker()
        self._segmenter = segmenter
        self.sources = sources if sources is not None else SourceCache()

    @property
    def segmenter(self) -> PersonSegmenter:
        """The person segmenter (loaded on first use: only face edits measure body skin)."""
        if self._segmenter is None:
            self._segmenter = get_person_segmenter()
        return self._segmenter

    def wants_person_mask(self) -> bool:
        """Whether :meth:`analyse_source` segments the source's person (a gate measures body
        skin: the skin-tone gate, or the locality gate judging body-skin drift)."""
        return any(getattr(g, "needs_person", False) for g in self.gates)

    @classmethod
    def from_config(cls, config: GatesConfig, kind: Kind, *, region: str | None = None) -> GateStack:
        """Build the gates for ``kind``, loading each backend (once per process).

        ``region`` is the edit region the design's prompt names
        (:func:`~counterfactory.generation.prompts.face_region`); ``config.edit_region``, when
        set, wins over it; neither: ``face``.

        Raises :class:`~counterfactory.validation.backends.SetupError` when a chosen backend cannot
        run here (missing optional dependency or weights), before any pair is judged.
        """
        gates: list[Gate] = [plugin.factory(options) for plugin, options in config.for_kind(kind).enabled()]
        chosen = config.edit_region or region or DEFAULT_REGION
        return cls(gates, kind=kind, face_mask_mode=config.face_mask, region=chosen, diagnostics=config.diagnostics)

    def without(self, *names: str) -> GateStack:
        """The same stack minus the gates called ``names`` (models stay shared)."""
        kept = [g for g in self.gates if g.name not in names]
        # the analyses stay valid: a gate's source data is read only by that gate
        return GateStack(
            kept,
            kind=self.kind,
            face_mask_mode=self.face_mask_mode,
            landmarker=self.landmarker,
            segmenter=self._segmenter,
            sources=self.sources,
            region=self.region,
            diagnostics=self.diagnostics,
        )

    def has(self, name: str) -> bool:
        """Whether a gate called ``name`` is in the stack."""
        return any(g.name == name for g in self.gates)

    def analyse_source(
        self, source: np.ndarray, *, key: str | None = None, base: SourceAnalysis | None = None
    ) -> SourceAnalysis:
        """Measure what the gates need from ``source`` alone, once for all its candidates.

        Runs the landmarker, draws the face mask, segments the person at the working
        resolution when a gate measures body skin (one segmentation serves the skin-tone and
        the locality gates), and calls every gate's ``prepare`` (detector faces, identity
        embedding, AUs, locality regions and body skin, skin tones). Does not touch the cache.

        Args:
            source: ``(H, W, 3)`` uint8 RGB.
            key: what names these pixels (default: :func:`pixel_key`).
            base: an analysis of the same pixels by a stack with fewer gates (:meth:`without`):
                what it holds is kept and only what this stack's gates lack is measured.

        A gate whose ``prepare`` raises gets no entry: it measures the source itself when
        called, and its error is then that pair's ``<gate>_error``.
        """
        if source.ndim != 3 or source.shape[2] != 3 or source.dtype != np.uint8:
            raise ValueError(f"source must be (H, W, 3) uint8 RGB, got {source.shape} {source.dtype}")
        if base is not None:
            faces, fmask, person, data = base.faces, base.face_mask, base.person, dict(base.gate_data)
        else:
            faces = tuple(self.landmarker.detect(source))
            fmask = face_mask(faces[0].landmarks, source.shape[:2], mode=self.face_mask_mode) if faces else None
            person, data = None, {}
        k = work_stride(source.shape)
        work = base.work_image if base is not None else None
        if work is None:
            # a copy: the cache outlives the caller's array, which the caller may reuse
            work = source.copy() if k == 1 else np.ascontiguousarray(source[::k, ::k])
        if person is None and faces and self.wants_person_mask():
            person = self.segmenter.segment(work)
        # the base's region holds unless this stack segmented the person it was drawn without
        same = base is not None and base.region == self.region and (base.person is not None or person is None)
        rmask = base.region_mask if same else None
        if rmask is None and faces:
            rmask = region_mask(faces[0].landmarks, source.shape[:2], self.region, person=person, image=source)
        analysis = SourceAnalysis(
            key=key if key is not None else pixel_key(source),
            shape=tuple(source.shape),
            faces=faces,
            face_mask=fmask,
            face_mask_mode=self.face_mask_mode,
            stride=k,
            work_image=work,
            person=person,
            gate_data=data,
            region=self.region,
            region_mask=rmask,
        )
        for gate in self.gates:
            if isinstance(gate, PreparingGate) and gate.name not in data:
                try:
                    data[gate.name] = gate.prepare(source, analysis)
                except SetupError:
                    raise
                except Exception:  # noqa: BLE001 - the gate meets the same error per pair, as a value
                    continue
        return analysis

    def _complete(self, analysis: SourceAnalysis) -> bool:
        """Whether ``analysis`` holds everything this stack's gates prepare."""
        if analysis.faces and analysis.person is None and self.wants_person_mask():
            return False
        return all(g.name in analysis.gate_data for g in self.gates if isinstance(g, PreparingGate))

    def analysis_for(self, source: np.ndarray, *, key: str | None = None) -> SourceAnalysis:
        """The cached :class:`SourceAnalysis` of ``source`` (``(H, W, 3)`` uint8), prepared and
        cached on a miss. ``key`` names the pixels (default: :func:`pixel_key`, about 2 ms per
        megapixel); a caller-given key must change whenever the pixels do."""
        key = key if key is not None else pixel_key(source)
        found = self.sources.get(key)
        if found is not None and (
            found.shape != tuple(source.shape)
            or found.face_mask_mode != self.face_mask_mode
            or found.region != self.region
        ):
            found = None
        if found is not None and self._complete(found):
            return found
        analysis = self.analyse_source(source, key=key, base=found)
        self.sources.put(analysis)
        return analysis

    def context(
        self,
        source: np.ndarray,
        candidate: np.ndarray,
        *,
        edit_mask: np.ndarray | None = None,
        extras: Mapping[str, Any] | None = None,
        covered: np.ndarray | None = None,
        raw_candidate: np.ndarray | None = None,
        unregistered: np.ndarray | None = None,
        analysis: SourceAnalysis | None = None,
    ) -> PairContext:
        """Analyse the candidate, take the source's analysis (``analysis``, or prepared here),
        and bundle the pair for the gates.

        ``source`` and ``candidate`` are ``(H, W, 3)`` uint8 RGB of the same shape (raises
        ``ValueError`` otherwise; :meth:`evaluate` turns that into a rejection first).
        ``raw_candidate`` and ``unregistered`` are passed on for reporting (see
        :class:`~counterfactory.validation.gates.base.PairContext`).
        """
        if source.shape != candidate.shape:
            raise ValueError(f"candidate {candidate.shape} is not aligned to source {source.shape}")
        if analysis is None:
            analysis = self.analyse_source(source)
        elif analysis.shape != tuple(source.shape):
            raise ValueError(f"the source analysis is of a {analysis.shape} image, the source is {source.shape}")
        cand_faces = self.landmarker.detect(candidate)
        return PairContext(
            source=source,
            candidate=candidate,
            kind=self.kind,
            face_mask=analysis.face_mask,
            edit_mask=edit_mask,
            source_faces=analysis.faces,
            candidate_faces=cand_faces,
            face_mask_mode=self.face_mask_mode,
            extras=dict(extras or {}),
            covered=None if covered is None or covered.all() else covered,
            analysis=analysis,
            raw_candidate=raw_candidate,
            unregistered=unregistered,
        )

    def evaluate(
        self,
        source: np.ndarray,
        candidate: np.ndarray,
        *,
        edit_mask: np.ndarray | None = None,
        extras: Mapping[str, Any] | None = None,
        covered: np.ndarray | None = None,
        raw_candidate: np.ndarray | None = None,
        unregistered: np.ndarray | None = None,
        source_key: str | None = None,
        analysis: SourceAnalysis | None = None,
    ) -> Judgement:
        """Judge one aligned pair: ``accepted``, ``rejected`` (with reasons),
        ``needs_review`` or ``failed`` (a gate could not measure; the error is recorded).

        Args:
            source: ``(H, W, 3)`` uint8 RGB (float in [0, 1] is accepted and converted).
            candidate: the aligned candidate, same shape as ``source``.
            edit_mask: ``(H, W)`` limb mask (nonzero inside) for limb cells.
            extras: what the cell knows beyond the pixels, for gates that judge against it:
                ``condition`` (axis -> requested value) and ``source`` (the source's metadata
                record); the skin gate uses them to tell same-group controls from edits.
            covered: ``(H, W)`` bool, where the editor's output covers the source frame
                (:attr:`~counterfactory.generation.align.Alignment.covered`); None for all.
            raw_candidate: the registered output before compositing, same shape (reported as
                ``locality.raw_*`` when the stack's :attr:`diagnostics` is on; not read
                otherwise); None when there was no composite.
            unregistered: the editor's output as returned, uint8 RGB of any size (reported
                as ``locality.focus_*``, FOCUS's figures without registration).
            source_key: a key naming the source's pixels (e.g. its sha256 in the image store)
                for the :attr:`sources` cache; None: the pixels are hashed (:func:`pixel_key`).
            analysis: the source's analysis (:meth:`analyse_source`) to use as it is,
                bypassing the cache; it must be of this source.
        """
        checked, src, cand = input_gate(source, candidate, edit_mask=edit_mask)
        if src is None or cand is None or not self.gates:
            # with every gate switched off there is nothing to analyse the faces for
            return combine([checked])
        try:
            if analysis is None:
                analysis = self.analysis_for(src, key=source_key)
            pair = self.context(
                src,
                cand,
                edit_mask=edit_mask,
                extras=extras,
                covered=covered,
                raw_candidate=raw_candidate if self.diagnostics else None,
                unregistered=unregistered,
                analysis=analysis,
            )
        except Exception as exc:  # a per-item analysis error is a value, not a crash
            failed = GateResult("input", False, dict(checked.metrics), ("input_analysis_error",), error=_describe(exc))
            return combine([failed])
        results: list[GateResult] = [checked]
        for gate in self.gates:
            try:
                result = gate(pair)
            except SetupError:
                raise
            except Exception as exc:
                result = GateResult(gate.name, False, reasons=(f"{gate.name}_error",), error=_describe(exc))
            results.append(_guard_finite(result))
        return combine(results)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _guard_finite(result: GateResult) -> GateResult:
    """Replace NaN / infinite metrics by None and reject with ``<gate>_metric_not_finite``."""
    bad = not_finite_metrics(result.metrics)
    if not bad:
        return result
    metrics = {k: (None if k in bad else v) for k, v in result.metrics.items()}
    code = f"{result.gate}_metric_not_finite"
    reasons = result.reasons if code in result.reasons else result.reasons + (code,)
    return GateResult(result.gate, False, metrics, reasons, result.review, result.thresholds, result.error)
