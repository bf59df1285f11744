"""Global concurrency limits: GPU slots and fal's account concurrency, shared by every run.

Templates run concurrently inside one run (``--workers``), and several runs (other specs,
scheduled regenerations, Ray workers) can share one GPU or one fal account. A limit inside one
process cannot see the others, so each is a Prefect global concurrency limit on the Prefect
server the runs report to: the spec's ``run`` section sets its value when a run starts
(:func:`apply_limits`), and the editor holds a slot for each batch it sends
(:class:`LimitedEditor`).

| limit | set from | held |
|---|---|---|
| ``counterfactory-gpu`` | ``run.gpu_slots`` | one slot per batch, by backends registered with ``limit="gpu"`` (``qwen``) |
| ``counterfactory-fal`` | ``run.fal_max_concurrency`` | one slot per request in flight, by backends registered with ``limit="fal"`` (``fal``) and by the ``vlm`` attribute gate's questions (one fal account) |

Which limit a backend holds, and whether per batch or per request, is what it declares when it
registers (:class:`~counterfactory.generation.editors.registry.EditorCapabilities`).

A limit of zero is refused when the spec loads (:class:`~counterfactory.manifests.spec.RunConfig`):
it would let no edit start and the run would wait for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.editors.base import EditJournal, EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS

logger = logging.getLogger(__name__)

GPU_LIMIT = "counterfactory-gpu"
FAL_LIMIT = "counterfactory-fal"
#: the Prefect limit of each ``EditorCapabilities.limit``
LIMIT_NAMES = {"gpu": GPU_LIMIT, "fal": FAL_LIMIT}
#: seconds a held slot stays leased without renewal (Prefect renews it while the batch runs);
#: a killed run's slots come back after this long
LEASE_S = 300.0


def spec_limits(spec: Spec) -> dict[str, int]:
    """``{limit name: slots}`` the spec sets (empty when its ``run`` section sets none)."""
    limits = {}
    if spec.run.gpu_slots is not None:
        limits[GPU_LIMIT] = spec.run.gpu_slots
    if spec.run.fal_max_concurrency is not None:
        limits[FAL_LIMIT] = spec.run.fal_max_concurrency
    return limits


def apply_limits(limits: dict[str, int]) -> None:
    """Create or update each global concurrency limit on the current Prefect server (active,
    with the given number of slots). Needs ``PREFECT_API_URL`` (a run sets it).

    Raises:
        ValueError: a limit below 1 (a spec refuses it earlier; this guards the Python API).
    """
    if not limits:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    for name, slots in limits.items():
        if slots < 1:
            raise ValueError(f"concurrency limit {name}: {slots} slots would let nothing run; set at least 1")
    with get_client(sync_client=True) as client:
        for name, slots in sorted(limits.items()):
            try:
                existing = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
                continue
            if existing.limit != slots or not existing.active:
                client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots, active=True))


class LimitedEditor:
    """An editor whose batches hold slots of a global concurrency limit while they run.

    Everything else (name, lineage, options) is the wrapped editor's, so attempt ids do not
    change. ``occupy_per_request`` holds one slot per request of a batch (fal's account
    counts requests in flight); otherwise a batch holds one slot (a GPU runs one batch).
    """

    def __init__(self, editor: Any, limit: str, slots: int, *, occupy_per_request: bool) -> None:
        self.inner = editor
        self.limit = limit
        self.slots = slots
        self.occupy_per_request = occupy_per_request

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def batch_size(self) -> int:
        """The wrapped editor's batch size, at most the limit's slots when each request holds one."""
        size = EDITORS.batch_size_of(self.inner)
        return min(size, self.slots) if self.occupy_per_request else size

    def _occupy(self, n_requests: int) -> int:
        return min(max(1, n_requests), self.slots) if self.occupy_per_request else 1

    def _held(self, n_requests: int):
        from prefect.concurrency.sync import concurrency

        return concurrency(self.limit, occupy=self._occupy(n_requests), lease_duration=LEASE_S)

    def edit(self, request: EditRequest) -> EditResult:
        with self._held(1):
            result = self.inner.edit(request)
            self._until_fal_says_ended()
            return result

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return self._in_slices(requests, lambda chunk: self.inner.edit_many(chunk, journal))

    def _in_slices(self, items: Sequence[Any], call: Any) -> list[Any]:
        """``call`` on ``items`` holding the limit; with a slot per request, a batch larger than
        the limit runs in slices of at most ``slots`` items."""
        results: list[Any] = []
        step = self.slots if self.occupy_per_request else max(1, len(items))
        for start in range(0, len(items), step):
            chunk = list(items[start : start + step])
            with self._held(len(chunk)):
                results.extend(call(chunk))
                self._until_fal_says_ended()
        return results

    def _until_fal_says_ended(self) -> None:
        """Keeps the held slots while fal has not said that requests of this client ended.

        A fal call whose status polls gave up (an outage) has ended, but its request may still
        run at fal and count against the account: its slot is freed once fal says it ended
        (:meth:`~counterfactory.manifests.paid.fal.FalQueue.wait_parked`, at most the
        client's ``timeout_s``).
        """
        wait = getattr(getattr(self.inner, "queue", None), "wait_parked", None)
        if not self.occupy_per_request or wait is None:
            return
        left = wait()
        if left:
            logger.warning(
                "%s: freeing slots of %d fal request(s) fal has not reported ended: %s",
                self.limit,
                len(left),
                ", ".join(left),
            )


def limited_editor(editor: Any, spec: Spec) -> Any:
    """``editor`` holding the spec's limit for its backend (the one its capabilities name), or
    ``editor`` itself when none applies."""
    capabilities = EDITORS.capabilities(spec.editor.backend)
    name = LIMIT_NAMES.get(capabilities.limit or "")
    slots = spec_limits(spec).get(name) if name else None
    if name is None or slots is None:
        return editor
    return LimitedEditor(editor, name, slots, occupy_per_request=capabilities.per_request)


class LimitedVisionClient(LimitedEditor):
    """The ``vlm`` attribute gate's fal client, holding one slot of ``counterfactory-fal`` per
    question in flight: its questions go to the same fal account as the ``fal`` editor's edits,
    so together they stay within ``run.fal_max_concurrency``. Everything else (lineage,
    question ids) is the wrapped client's, so stored verdicts do not change."""

    def __init__(self, client: Any, slots: int) -> None:
        super().__init__(client, FAL_LIMIT, slots, occupy_per_request=True)

    def ask_many(self, images: Sequence[Any], prompt: str, journal: EditJournal | None = None) -> list[Any]:
        return self._in_slices(images, lambda chunk: self.inner.ask_many(chunk, prompt, journal))


def limited_gates(stack: Any, spec: Spec) -> Any:
    """``stack`` with its ``vlm`` attribute gate holding the spec's fal limit when it asks
    through fal (the same stack; unchanged when the spec sets no ``run.fal_max_concurrency`` or
    asks no VLM on fal: an OpenAI-compatible server or a local model is not the fal account)."""
    slots = spec_limits(spec).get(FAL_LIMIT)
    if slots is None:
        return stack
    for gate in getattr(stack, "gates", ()):
        config = getattr(gate, "config", None)
        on_fal = getattr(config, "backend", None) == "vlm" and getattr(config, "answer_backend", "fal") == "fal"
        if on_fal and not isinstance(gate.classifier, LimitedVisionClient):
            gate.classifier = LimitedVisionClient(gate.classifier, slots)
    return stack
