"""The one interface every editor backend implements.

An editor turns an :class:`EditRequest` (a source image, a rendered prompt, a seed and,
for limb cells, an edit mask) into an :class:`EditResult`. Backends never align, composite
or judge: the factory does that to every result the same way, whatever produced it.

Per-item problems (a safety refusal, an empty output, a decode error) are *values*: an
``EditResult`` with ``status`` ``"refused"`` or ``"failed"`` and a reason. Only problems that
make the whole batch impossible (a missing model, no GPU, a bad API key) raise
:class:`~counterfactory.manifests.errors.SetupError`, and they do so from ``prepare()``, before any work is paid for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import BaseModel

# a paid backend's journal is the one every paid client keeps (manifests/paid): an editor's
# ``edit_many(requests, journal)`` takes the ledger's, keyed by attempt id
from counterfactory.manifests.paid import PaidJournal as EditJournal
from counterfactory.manifests.vocabulary import OK

EditStatus = Literal["ok", "refused", "failed"]


@dataclass(frozen=True)
class EditRequest:
    """One editor call.

    Attributes:
        attempt_id: the ledger id of this attempt (hash of everything deciding the output).
        image: the source, ``(H, W, 3)`` ``uint8`` RGB.
        prompt: the rendered prompt, exactly as it goes into the attempt's lineage.
        seed: the attempt's seed; backends seed their generator from it and nothing else.
        kind: ``"face"`` (a whole-image edit of the face's demographic cues) or ``"limb"``
            (inpainting inside ``mask``).
        mask: the region the study varies, ``(H, W)`` ``uint8`` with 255 inside and 0 outside:
            the face mask for face cells, the limb mask for limb cells; ``None`` if unknown.
            Inpainting backends edit inside it for limb cells; whole-image editors may ignore it.
        condition: the cell's condition, e.g. ``{"race": "Black", "gender": "female"}``
            or ``{"cue": "removed"}``; informative only, the prompt already encodes it.
        negative_prompt: optional negative prompt for backends with classifier-free guidance.
    """

    attempt_id: str
    image: np.ndarray
    prompt: str
    seed: int
    kind: Literal["face", "limb"] = "face"
    mask: np.ndarray | None = None
    condition: Mapping[str, str] = field(default_factory=dict)
    negative_prompt: str | None = None


@dataclass(frozen=True)
class EditResult:
    """What a backend returned for one request.

    Attributes:
        attempt_id: copied from the request.
        status: ``"ok"`` with an image; ``"refused"`` when the model declined (safety filter,
            empty output) with its reason; ``"failed"`` for any other per-item error.
        image: ``(h, w, 3)`` ``uint8`` RGB of whatever size the model returned, or ``None``.
        reason: the model's or the transport's reason when not ``"ok"``.
        cost_usd: money spent on this call (0 for local models).
        metadata: backend facts worth keeping (request ids, timings, output size, seed used).
    """

    attempt_id: str
    status: EditStatus
    image: np.ndarray | None = None
    reason: str | None = None
    cost_usd: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status == OK and self.image is None:
            raise ValueError("an 'ok' EditResult needs an image")


class Editor(Protocol):
    """An editing backend. Construct with its options; ``prepare()`` loads heavy parts once.

    ``lineage()`` returns everything about the backend that decides its output (backend name,
    model id, revision, steps, guidance, ...). It is hashed into every attempt id, so changing
    any of it makes new attempts instead of reusing old ones.
    """

    name: str

    def lineage(self) -> dict[str, Any]: ...

    def consumes(self, kind: str) -> frozenset[str]:
        """Which request inputs decide this backend's output for ``kind`` cells: a subset of
        ``{"prompt", "negative_prompt", "seed", "mask"}``. Only those are hashed into attempt
        ids, so a mask a backend ignores does not re-buy its edits when the mask changes."""
        ...

    def prepare(self) -> None: ...

    def edit(self, request: EditRequest) -> EditResult: ...

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]: ...


class SequentialEditor:
    """Mixin giving ``prepare`` and ``edit_many`` defaults: no set-up, one request at a time."""

    def prepare(self) -> None:
        return None

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return [self.edit(r) for r in requests]  # type: ignore[attr-defined]


class EditorOptions(BaseModel):
    """The options model of an editor backend (``editor.<name>`` in the spec), with the hooks the
    factory calls on it. Each has a default that does nothing, so a backend declares only what it
    needs; the engine never names a backend (``tests/test_backend_names.py``).

    Every built-in backend's options derive from this. A plug-in's options model need not: the
    engine reads hooks through :func:`hooks_of`, which gives the defaults for what it lacks.
    """

    #: what a release made with this backend must say first among its limitations (the Hub
    #: card, :func:`~counterfactory.manifests.hub_card.release_caveats`); None: nothing
    release_caveat: ClassVar[str | None] = None

    #: the outputs are an existing set's, so a release's ``stats.json`` audits it
    #: (:func:`~counterfactory.flows.engine.stats.audit_stats`)
    audits_imported_set: ClassVar[bool] = False

    #: a backend whose input fixes the cells (the ``import`` backend: one per row of its table)
    #: defines ``plan_grid(records, design) -> Grid``, the grid of the usable sources' metadata
    #: ``records`` under the spec's ``design``
    #: (:func:`~counterfactory.flows.engine.sources.plan_grid`); None: the stratified templates x
    #: conditions are drawn, and the spec must say ``design.templates_per_stratum``
    plan_grid: ClassVar[Callable[..., Any] | None] = None

    def bind_spec(self, spec: Any) -> None:
        """Take what the options are read against from the loaded ``spec`` (its folder, design,
        photos); :func:`~counterfactory.flows.engine.spec.load_spec` calls it on every editor view."""
        return None

    def bind_run_folder(self, out: str | Path) -> None:
        """Learn the run's folder ``out`` before anything is read, for files the backend keeps
        there (:meth:`~counterfactory.flows.engine.spec.Spec.bind_run_folder`)."""
        return None

    def named_files(self) -> dict[str, Path]:
        """The files the options name, by spec field (``editor.<name>.<field>``), resolved:
        :func:`~counterfactory.flows.engine.spec.load_spec` checks each exists before any work."""
        return {}


class _UndeclaredHooks:
    """A plug-in's options model that does not derive from :class:`EditorOptions`, seen through
    the hooks it declares: each hook it has is its own, each it lacks the default."""

    def __init__(self, options: Any) -> None:
        self._options = options
        caveat = getattr(options, "release_caveat", None)
        self.release_caveat: str | None = caveat if isinstance(caveat, str) and caveat else None
        self.audits_imported_set = bool(getattr(options, "audits_imported_set", False))
        plan = getattr(options, "plan_grid", None)
        self.plan_grid: Callable[..., Any] | None = plan if callable(plan) else None

    def _call(self, hook: str, *args: Any) -> Any:
        method = getattr(self._options, hook, None)
        return method(*args) if callable(method) else getattr(EditorOptions, hook)(self._options, *args)

    def bind_spec(self, spec: Any) -> None:
        self._call("bind_spec", spec)

    def bind_run_folder(self, out: str | Path) -> None:
        self._call("bind_run_folder", out)

    def named_files(self) -> dict[str, Path]:
        return dict(self._call("named_files"))


def hooks_of(options: Any) -> EditorOptions | type[EditorOptions] | _UndeclaredHooks:
    """The hooks of an editor backend's options (an instance, or for the class-level ones the
    model class): the options themselves when they derive from :class:`EditorOptions`, else a
    view that gives the default for each hook the plug-in left out. The one place a hook is
    looked up by name."""
    if isinstance(options, EditorOptions) or (isinstance(options, type) and issubclass(options, EditorOptions)):
        return options
    return _UndeclaredHooks(options)
