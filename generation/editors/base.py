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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

# a paid backend's journal is the one every paid client keeps (manifests/paid): an editor's
# ``edit_many(requests, journal)`` takes the ledger's, keyed by attempt id
from counterfactory.manifests.paid import PaidJournal as EditJournal

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
        if self.status == "ok" and self.image is None:
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
