"""Nano Banana (Pro) through fal's queue API, with bounded concurrency and paid-call safety.

One request makes one queue call: ``POST https://queue.fal.run/<endpoint>`` with the source
as a PNG data URI (lossless; fal accepts data URIs wherever it takes an image URL), then
status polls, then ``GET .../requests/<id>`` for the result, then a download of the output
image from the URL the result names. Everything goes through the ``fal-client`` library, which
reads its hosts from ``FAL_RUN_HOST`` / ``FAL_QUEUE_RUN_HOST`` when it is first imported.

Money. fal bills per output image, and a request that runs is billed whether or not anybody
collects its result. So the request id goes into the :class:`EditJournal` *before* the wait,
with the expected price: a process killed mid-wait resumes by fetching that id, never by
paying again.
Only the server's own word that it does not know an id (HTTP 404) or that the job failed
lets the same attempt be submitted again. ``spend_cap_usd`` is checked against
``journal.spent_usd()`` plus what is being submitted right now before every new submission;
fetching an already-paid request is always allowed. Two windows cannot be closed from the
client side, as fal has no idempotency key: a kill between fal accepting a submission and the
journal write (milliseconds), and a submission whose HTTP answer is lost in transit.

Errors. HTTP 408/409/429/5xx, connection errors and network time-outs are transient and
retried with exponential backoff, ``max_retries`` times per call (``fal-client`` itself
already retries 408/409/429 and connection errors up to 10 times before we see them). Other
4xx answers, safety refusals and empty outputs are per-item results. A rejected key (401/403)
or an app fal does not know (404 on submit) raises :class:`EditorSetupError`.

Key check. ``prepare()`` asks the queue for the status of a random, never-issued request id
of the endpoint's app: free, authenticated, no model runs. A 401/403 answer means the key is
bad; any other answer (404 is the one expected for an id never issued) means it passed. The
probe cannot tell an unknown app from an unknown request id, so an unknown app is caught by
the 404 of the first submission, which stops the batch before anything is billed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import io
import logging
import math
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from counterfactory.generation.editors.base import (
    EditJournal,
    EditorSetupError,
    EditRequest,
    EditResult,
    MemoryJournal,
)
from counterfactory.manifests.registry import EDITORS

logger = logging.getLogger(__name__)

#: USD per output image, as listed on fal's model pages when this was written (Nano Banana
#: Pro bills 4K outputs at twice this). Override per endpoint with ``prices_usd``.
DEFAULT_PRICES_USD: dict[str, float] = {
    "fal-ai/nano-banana/edit": 0.039,
    "fal-ai/nano-banana-pro/edit": 0.15,
}
KNOWN_ENDPOINTS: tuple[str, ...] = tuple(DEFAULT_PRICES_USD)
#: The ``aspect_ratio`` values (width:height) an endpoint accepts, from fal's model pages.
#: Nano Banana snaps its output to a fixed size per ratio and crops to fill, so asking for
#: the ratio nearest the source's keeps most of the source's frame in the output.
ASPECT_RATIOS: dict[str, tuple[str, ...]] = {
    endpoint: ("21:9", "16:9", "3:2", "4:3", "5:4", "1:1", "4:5", "3:4", "2:3", "9:16") for endpoint in KNOWN_ENDPOINTS
}


def nearest_aspect_ratio(width: int, height: int, choices: tuple[str, ...]) -> str:
    """The ``"w:h"`` in ``choices`` nearest ``width / height`` on a log scale (so 2:1 and 1:2
    are equally far from 1:1)."""

    def distance(choice: str) -> float:
        w, h = (float(v) for v in choice.split(":"))
        return abs(math.log((w / h) / (width / height)))

    return min(choices, key=distance)


# fal endpoint ids are <owner>/<app>[/<path>...].
_ENDPOINT_SHAPE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(/[\w.-]+)*$")

# Inputs the backend sets itself; letting ``arguments`` override them would break lossless
# transport (output_format, sync_mode), seeding or the one-image-per-attempt accounting.
_RESERVED_ARGUMENTS = frozenset({"prompt", "image_urls", "seed", "num_images", "output_format", "sync_mode"})

# Journal states whose request id may still be fetched. "failed" (the server said the job
# failed) and "lost" (the server does not know the id) allow a new submission instead.
_FETCHABLE_STATES = frozenset({"submitted", "completed", "refused"})

# Gemini answers some edits with text instead of an image ("I can't help with ..."); with an
# image beside such text the image is the unedited input, so the text decides.
_REFUSAL_TEXT = re.compile(
    r"\b(I can(?:'|\u2019|no)t|I(?:'m|\u2019m| am) (?:not able|unable)|I won(?:'|\u2019)t"
    r"|I will not|unable to (?:help|edit|create|generate|fulfil))",
    re.IGNORECASE,
)

_BACKOFF_CAP_S = 30.0
_POLL_GROWTH = 0.05
_POLL_CAP_S = 5.0


class FalOptions(BaseModel):
    """Options of the ``fal`` backend (``editor.fal`` in the spec).

    Attributes:
        endpoint: fal endpoint id, ``<owner>/<app>[/<path>]``; see ``KNOWN_ENDPOINTS``.
        concurrency: requests in flight at once (submitted and not yet collected).
        spend_cap_usd: no new submission once the journal's spend plus its price would
            exceed this many US dollars; ``None`` for no cap.
        timeout_s: seconds one request may take from getting its slot to its decoded image
            (the submission call is bounded by the same number but never cut half-way).
        max_retries: retries of one HTTP call after a transient failure.
        arguments: extra model inputs, e.g. ``{"aspect_ratio": "auto", "resolution": "1K"}``;
            part of the lineage.
        prices_usd: USD per output image by endpoint, over ``DEFAULT_PRICES_USD``.
        poll_interval_s: shortest seconds between status polls of one request (the interval
            grows to 5 % of the time waited, at most 5 s).
        backoff_s: first retry delay in seconds; doubles per retry, jittered, capped at 30 s.
        match_aspect_ratio: send the ``aspect_ratio`` nearest the source's (``ASPECT_RATIOS``)
            to endpoints that take one, unless ``arguments`` sets it.
    """

    model_config = ConfigDict(extra="forbid")

    endpoint: str = "fal-ai/nano-banana/edit"
    concurrency: int = Field(4, ge=1)
    spend_cap_usd: float | None = Field(None, ge=0)
    timeout_s: float = Field(300.0, gt=0)
    max_retries: int = Field(3, ge=0)
    arguments: dict[str, Any] = Field(default_factory=dict)
    prices_usd: dict[str, float] = Field(default_factory=dict)
    poll_interval_s: float = Field(0.25, gt=0)
    backoff_s: float = Field(1.0, ge=0)
    match_aspect_ratio: bool = True

    @field_validator("arguments")
    @classmethod
    def _no_reserved_arguments(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(_RESERVED_ARGUMENTS & set(value))
        if clash:
            raise ValueError(
                f"arguments may not set {clash}; the fal backend sets {sorted(_RESERVED_ARGUMENTS)} itself"
            )
        return value

    @field_validator("prices_usd")
    @classmethod
    def _prices_not_negative(cls, value: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in value.items() if v < 0}
        if negative:
            raise ValueError(f"prices_usd must be >= 0, received {negative}")
        return value


class _Outcome(Exception):
    """Ends one item early with a non-``ok`` result (internal control flow).

    ``state`` is written to the journal when given; ``None`` leaves the row as it is, so a
    re-run can still fetch a request that may yet finish.
    """

    def __init__(self, status: str, reason: str, *, state: str | None = None, cost_usd: float = 0.0):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.state = state
        self.cost_usd = cost_usd


class _Lost(Exception):
    """fal answered 404 for a request id: it does not know it (expired or never accepted)."""


@dataclass
class _Progress:
    """What one item has done so far; read when it ends, whichever way it ends."""

    started: float
    request_id: str | None = None
    endpoint: str | None = None
    resumed: bool = False
    submit_tries: int = 0
    lost_request_ids: list[str] = field(default_factory=list)


@dataclass
class _Batch:
    """Per-``edit_many`` state shared by its items (one event loop)."""

    journal: EditJournal
    fal: Any
    http: Any


class FalEditor:
    """Edits through a fal-hosted model (Nano Banana, Nano Banana Pro) over the queue API.

    ``edit_many`` returns one :class:`EditResult` per request, in order: ``image`` is the
    model's output decoded to ``(h, w, 3)`` ``uint8`` RGB at whatever size it came, exactly
    as served (PNG both ways). ``cost_usd`` is the price of the images fal returned
    (0 when it returned none). ``metadata`` holds ``request_id``, ``endpoint``, ``seconds``
    (wall time with its slot), ``cost_usd``, ``resumed`` (fetched by a journaled id),
    ``submit_tries`` (submissions made; fal-client's internal retries not counted), ``seed``,
    ``lost_request_ids`` when fal had forgotten a journaled id, and for outputs ``width``,
    ``height``, ``output_format`` and ``description`` (the model's text).
    """

    name = "fal"

    def __init__(self, options: FalOptions | None = None) -> None:
        self.options = options if options is not None else FalOptions()
        self._fal: Any = None
        self._key: str | None = None
        self._prepared = False
        # Shared by every edit_many call of this editor, whatever thread or event loop it runs
        # in (the flow runs several templates at once): ``concurrency`` bounds the requests in
        # flight per process, and spend reservations are checked against one cap.
        self._in_flight = threading.BoundedSemaphore(self.options.concurrency)
        self._budget = threading.Lock()
        self._reserved_usd = 0.0

    @property
    def batch_size(self) -> int:
        """Requests the factory hands over at once: ``concurrency``, enough to keep every slot busy."""
        return self.options.concurrency

    def lineage(self) -> dict[str, Any]:
        """Everything that decides the output; fal does not version its endpoints, so the
        endpoint id stands for the model."""
        return {
            "backend": self.name,
            "endpoint": self.options.endpoint,
            "arguments": dict(sorted(self.options.arguments.items())),
            "aspect_ratio": "nearest_to_source" if self._matches_aspect_ratio() else None,
            "num_images": 1,
            "output_format": "png",
            "input_encoding": "png_data_uri",
        }

    def _matches_aspect_ratio(self) -> bool:
        o = self.options
        return o.match_aspect_ratio and "aspect_ratio" not in o.arguments and o.endpoint in ASPECT_RATIOS

    def consumes(self, kind: str) -> frozenset[str]:
        """The image, prompt and seed go to fal; no mask and no negative prompt do."""
        return frozenset({"prompt", "seed"})

    def prepare(self) -> None:
        """Checks the dependency, key, endpoint and price, then the key against fal.

        Raises:
            EditorSetupError: with one message saying what is wrong and how to fix it.
        """
        if not self._prepared:
            _run_sync(self._aprepare())

    def edit(self, request: EditRequest) -> EditResult:
        return self.edit_many([request])[0]

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        """Runs ``requests`` with at most ``concurrency`` in flight; see :meth:`aedit_many`."""
        return _run_sync(self.aedit_many(requests, journal))

    async def aedit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        """Async form of :meth:`edit_many` for callers already inside an event loop.

        Requests sharing an ``attempt_id`` are one attempt and get the same result.
        Without a journal the batch keeps an in-memory one (no resume across processes).

        Raises:
            EditorSetupError: the key or endpoint is rejected; nothing was billed for it.
        """
        if not self._prepared:
            await self._aprepare()
        journal = journal if journal is not None else MemoryJournal()
        unique: dict[str, EditRequest] = {}
        for request in requests:
            unique.setdefault(request.attempt_id, request)
        batch = _Batch(journal=journal, fal=self._client(), http=self._http_client())
        tasks: dict[str, asyncio.Task[EditResult]] = {}
        try:
            async with asyncio.TaskGroup() as group:
                for attempt_id, request in unique.items():
                    tasks[attempt_id] = group.create_task(self._one(request, batch))
        except BaseExceptionGroup as errors:
            setup = errors.subgroup(EditorSetupError)
            if setup is not None:
                raise _first_leaf(setup) from None
            raise
        finally:
            await _close_clients(batch.fal, batch.http)
        return [tasks[r.attempt_id].result() for r in requests]

    # -- set-up -------------------------------------------------------------------------

    async def _aprepare(self) -> None:
        try:
            import fal_client
            import httpx
        except ImportError as exc:
            raise EditorSetupError(
                f"the fal backend needs the fal-client package: pip install 'counterfactory[remote]' ({exc})"
            ) from None
        key = os.environ.get("FAL_KEY")
        if not key and os.environ.get("FAL_KEY_ID") and os.environ.get("FAL_KEY_SECRET"):
            key = f"{os.environ['FAL_KEY_ID']}:{os.environ['FAL_KEY_SECRET']}"
        if not key:
            raise EditorSetupError(
                "FAL_KEY is not set: create a key at https://fal.ai/dashboard/keys and run "
                "`export FAL_KEY=<key_id>:<key_secret>` (or set FAL_KEY_ID and FAL_KEY_SECRET)"
            )
        endpoint = self.options.endpoint
        if endpoint not in KNOWN_ENDPOINTS and not _ENDPOINT_SHAPE.match(endpoint):
            raise EditorSetupError(
                f"unknown fal endpoint {endpoint!r}: expected <owner>/<app>[/<path>]; "
                f"known endpoints: {', '.join(KNOWN_ENDPOINTS)}"
            )
        if self._price(endpoint) is None:
            raise EditorSetupError(
                f"no price known for fal endpoint {endpoint!r}, so spend cannot be "
                f"accounted: set editor.fal.prices_usd[{endpoint!r}] to its USD per image"
            )
        self._fal, self._key = fal_client, key
        client = self._client()
        host = fal_client.client.QUEUE_URL_FORMAT
        try:
            async with asyncio.timeout(min(30.0, self.options.timeout_s)):
                await client.status(endpoint, str(uuid.uuid4()))
        except fal_client.FalClientHTTPError as exc:
            if exc.status_code in (401, 403):
                raise EditorSetupError(_key_message(exc)) from None
        except (httpx.TransportError, httpx.TimeoutException, TimeoutError, OSError) as exc:
            raise EditorSetupError(
                f"cannot reach fal's queue at {host} ({type(exc).__name__}: {exc}); check the "
                "network, or FAL_QUEUE_RUN_HOST if it is set"
            ) from None
        finally:
            await _close_clients(client, None)
        self._prepared = True

    def _price(self, endpoint: str) -> float | None:
        return {**DEFAULT_PRICES_USD, **self.options.prices_usd}.get(endpoint)

    def _client(self) -> Any:
        return self._fal.AsyncClient(key=self._key, default_timeout=self.options.timeout_s)

    def _http_client(self) -> Any:
        import httpx

        # A separate client for output downloads: the fal key must not travel to a CDN.
        return httpx.AsyncClient(timeout=self.options.timeout_s, follow_redirects=True)

    # -- one item -----------------------------------------------------------------------

    async def _one(self, request: EditRequest, batch: _Batch) -> EditResult:
        # Polling keeps the wait cancellable: a thread blocked in acquire() is not.
        while not self._in_flight.acquire(blocking=False):
            await asyncio.sleep(0.005)
        try:
            return await self._one_in_slot(request, batch)
        finally:
            self._in_flight.release()

    async def _one_in_slot(self, request: EditRequest, batch: _Batch) -> EditResult:
        progress = _Progress(started=asyncio.get_running_loop().time())
        try:
            return await self._attempt(request, batch, progress)
        except _Outcome as outcome:
            if outcome.state is not None and progress.request_id is not None:
                batch.journal.save(
                    request.attempt_id,
                    _row(progress, outcome.state, reason=outcome.reason),
                    cost_usd=outcome.cost_usd,
                )
            # A failure after fal accepted (and bills) the request, with the id still journalled
            # as fetchable: the attempt must be fetched again, never replaced by another seed.
            pending = (
                outcome.status == "failed"
                and progress.request_id is not None
                and (outcome.state is None or outcome.state in _FETCHABLE_STATES)
            )
            return self._result(
                request,
                progress,
                outcome.status,
                reason=outcome.reason,
                cost_usd=outcome.cost_usd,
                extra={"pending_request_id": progress.request_id} if pending else None,
            )
        except (EditorSetupError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug or a surprise must not sink the other items
            logger.exception("fal request for attempt %s failed", request.attempt_id)
            return self._result(request, progress, "failed", reason=f"fal_error: {type(exc).__name__}: {exc}")

    async def _attempt(self, request: EditRequest, batch: _Batch, progress: _Progress) -> EditResult:
        deadline = progress.started + self.options.timeout_s
        saved = batch.journal.load(request.attempt_id) or {}
        if saved.get("request_id") and saved.get("state") in _FETCHABLE_STATES:
            progress.request_id = str(saved["request_id"])
            progress.endpoint = str(saved.get("endpoint") or self.options.endpoint)
            progress.resumed = True
            try:
                payload = await self._until(deadline, progress, self._collect(progress, batch))
            except _Lost:
                batch.journal.save(request.attempt_id, _row(progress, "lost"), cost_usd=0.0)
                progress.lost_request_ids.append(progress.request_id)
                progress.request_id, progress.resumed = None, False
            else:
                return await self._until(deadline, progress, self._finish(request, progress, payload, batch))

        arguments = await asyncio.to_thread(self._arguments, request)
        if asyncio.get_running_loop().time() >= deadline:  # a slow resume must not pay anew
            await self._until(deadline, progress, asyncio.sleep(0))
        await self._submit(request, arguments, progress, batch)
        try:
            payload = await self._until(deadline, progress, self._collect(progress, batch))
        except _Lost:
            raise _Outcome(
                "failed",
                f"fal_lost: fal does not know request {progress.request_id}, which it accepted moments ago",
                state="lost",
            ) from None
        return await self._until(deadline, progress, self._finish(request, progress, payload, batch))

    def _arguments(self, request: EditRequest) -> dict[str, Any]:
        image = request.image
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
            shape = getattr(image, "shape", None)
            dtype = getattr(image, "dtype", None)
            raise _Outcome(
                "failed",
                f"fal_bad_input: image must be (H, W, 3) uint8 RGB, received shape {shape} dtype {dtype}",
            )
        extra = {}
        if self._matches_aspect_ratio():
            choices = ASPECT_RATIOS[self.options.endpoint]
            extra["aspect_ratio"] = nearest_aspect_ratio(image.shape[1], image.shape[0], choices)
        return {
            **extra,
            **self.options.arguments,
            "prompt": request.prompt,
            "image_urls": [self._fal.encode(_encode_png(image), "image/png")],
            "seed": int(request.seed),
            "num_images": 1,
            "output_format": "png",
            "sync_mode": False,
        }

    async def _submit(
        self, request: EditRequest, arguments: dict[str, Any], progress: _Progress, batch: _Batch
    ) -> None:
        """Submits (retrying transient failures) and journals the id before returning.

        Deliberately outside the per-request deadline: cancelling a submission half-way could
        leave a billed request that no journal row knows about.
        """
        endpoint, cap = self.options.endpoint, self.options.spend_cap_usd
        price = float(self._price(endpoint) or 0.0)
        # Check and reserve under one lock: no item of this or another batch can slip in.
        with self._budget:
            committed = batch.journal.spent_usd() + self._reserved_usd
            if cap is not None and committed + price > cap + 1e-9:
                raise _Outcome(
                    "failed",
                    f"fal_spend_cap_reached: ${committed:.4f} "
                    f"spent or committed, ${price:.4f} more would exceed "
                    f"spend_cap_usd=${cap:.4f}; no new submissions",
                )
            self._reserved_usd += price
        try:
            extra = {"start_timeout": self.options.timeout_s} if self.options.timeout_s > 1 else {}
            failures = 0
            while True:
                progress.submit_tries += 1
                try:
                    handle = await batch.fal.submit(endpoint, arguments, **extra)
                    break
                except Exception as exc:
                    kind = self._classify(exc)
                    if kind == "auth":
                        raise EditorSetupError(_key_message(exc)) from None
                    if kind == "not_found":
                        raise EditorSetupError(
                            f"fal has no app at endpoint {endpoint!r} (HTTP 404: "
                            f"{_detail(exc)}); known endpoints: {', '.join(KNOWN_ENDPOINTS)}"
                        ) from None
                    if kind == "transient" and failures < self.options.max_retries:
                        failures += 1
                        await self._backoff(failures, exc)
                        continue
                    raise self._http_outcome(exc, "submit", tries=failures + 1) from None
            progress.request_id, progress.endpoint = handle.request_id, endpoint
            batch.journal.save(request.attempt_id, _row(progress, "submitted"), cost_usd=price)
        finally:
            with self._budget:
                self._reserved_usd -= price

    async def _collect(self, progress: _Progress, batch: _Batch) -> dict[str, Any]:
        """Polls the request until fal says it is done, then fetches its result JSON."""
        handle = await batch.fal.get_handle(progress.endpoint, progress.request_id)
        completed = await self._wait_completed(handle, poll_first=progress.resumed)
        job_failed = completed.error is not None

        async def fetch() -> dict[str, Any]:
            # The handle's own authenticated client, straight to the result: handle.get()
            # would poll the status once more first.
            response = await handle.client.get(handle.response_url)
            response.raise_for_status()
            return response.json()

        try:
            return await self._retrying("result", fetch, transient_ok=not job_failed)
        except _Outcome as outcome:
            if job_failed and outcome.state is None:
                # The server's own verdict: the job failed (fal does not bill it), so a
                # later run may submit this attempt again.
                raise _Outcome(
                    "failed",
                    f"fal_job_failed: {completed.error_type or 'error'}: {completed.error}",
                    state="failed",
                ) from None
            raise

    async def _wait_completed(self, handle: Any, *, poll_first: bool) -> Any:
        """Polls until ``Completed``. The interval grows with the wait (5 %, at most 5 s), so
        a long job is not polled needlessly, and is jittered so that a batch submitted at
        once does not poll in lock-step bursts. A fresh submission is not polled at once:
        it cannot be done yet; a resumed one may well be."""
        loop = asyncio.get_running_loop()
        begun = loop.time()
        while True:
            if poll_first:
                status = await self._retrying("status", handle.status)
                if isinstance(status, self._fal.Completed):
                    return status
            poll_first = True
            waited = loop.time() - begun
            interval = max(self.options.poll_interval_s, min(_POLL_GROWTH * waited, _POLL_CAP_S))
            await asyncio.sleep(interval * random.uniform(0.75, 1.25))

    async def _retrying(self, what: str, call: Any, *, transient_ok: bool = True) -> Any:
        """Runs ``call()``, retrying transient failures; maps the rest to outcomes."""
        failures = 0
        while True:
            try:
                return await call()
            except Exception as exc:
                kind = self._classify(exc)
                if what == "download" and kind == "auth":
                    kind = "permanent"  # a CDN answer, not a verdict on the key or request
                if what == "download" and kind == "not_found":
                    kind = "transient"  # a CDN may answer 404 until the file has propagated
                if kind == "auth":
                    raise EditorSetupError(_key_message(exc)) from None
                if kind == "not_found":
                    raise _Lost() from None
                if kind == "transient" and transient_ok and failures < self.options.max_retries:
                    failures += 1
                    await self._backoff(failures, exc)
                    continue
                raise self._http_outcome(exc, what, tries=failures + 1) from None

    async def _finish(
        self, request: EditRequest, progress: _Progress, payload: dict[str, Any], batch: _Batch
    ) -> EditResult:
        images = payload.get("images") or []
        description = str(payload.get("description") or "").strip()
        price = self._price(progress.endpoint or "") or self._price(self.options.endpoint) or 0.0
        cost = float(price) * len(images)
        flags = payload.get("has_nsfw_concepts") or payload.get("nsfw_content_detected") or []
        flags = flags if isinstance(flags, list) else [flags]
        if any(bool(f) for f in flags):
            raise _Outcome(
                "refused",
                f"fal_nsfw: the safety checker flagged the output "
                f"(has_nsfw_concepts={flags}){': ' + description if description else ''}",
                state="refused",
                cost_usd=cost,
            )
        if not images:
            raise _Outcome(
                "refused",
                "fal_no_images: " + (description or "the model returned no image"),
                state="refused",
                cost_usd=cost,
            )
        if _REFUSAL_TEXT.search(description):
            raise _Outcome("refused", f"fal_refusal: {description}", state="refused", cost_usd=cost)
        first = images[0] if isinstance(images[0], Mapping) else {"url": images[0]}
        try:
            data = await self._download(str(first.get("url", "")), batch)
            image, fmt = await asyncio.to_thread(_decode_image, data)
        except _Outcome as outcome:
            outcome.cost_usd = cost  # the images were billed even if we could not get them
            raise
        except Exception as exc:
            raise _Outcome(
                "failed",
                f"fal_bad_output: cannot decode the output image ({type(exc).__name__}: {exc})",
                state="completed",
                cost_usd=cost,
            ) from None
        batch.journal.save(request.attempt_id, _row(progress, "completed"), cost_usd=cost)
        return self._result(
            request,
            progress,
            "ok",
            image=image,
            cost_usd=cost,
            extra={
                "width": int(image.shape[1]),
                "height": int(image.shape[0]),
                "output_format": fmt,
                "description": description,
            },
        )

    async def _download(self, url: str, batch: _Batch) -> bytes:
        if url.startswith("data:"):
            return base64.b64decode(url.partition(",")[2])
        if not url:
            raise _Outcome("failed", "fal_bad_output: the result's image has no url", state="completed")

        async def get() -> bytes:
            response = await batch.http.get(url)
            response.raise_for_status()
            return response.content

        return await self._retrying("download", get)

    async def _until(self, deadline: float, progress: _Progress, work: Any) -> Any:
        """Awaits ``work`` until the loop time ``deadline``, then ends the item as timed out."""
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if not scope.expired():
                raise
        where = f"request {progress.request_id}" if progress.request_id else "no request id"
        raise _Outcome(
            "failed",
            f"fal_timeout: no result within timeout_s={self.options.timeout_s:g} s "
            f"({where}); a submitted id stays in the journal, so a re-run fetches "
            "it instead of paying again",
        )

    # -- helpers ------------------------------------------------------------------------

    def _classify(self, exc: Exception) -> str:
        """``transient``, ``auth``, ``not_found`` or ``permanent``; re-raises non-network errors."""
        import httpx

        if isinstance(exc, self._fal.FalClientHTTPError):
            code = exc.status_code
        elif isinstance(exc, httpx.HTTPStatusError):
            code = exc.response.status_code
        elif isinstance(exc, (httpx.TimeoutException, httpx.TransportError)):
            return "transient"
        else:
            raise exc
        if code in (401, 403):
            return "auth"
        if code == 404:
            return "not_found"
        response = getattr(exc, "response", None)
        if code == 504 and response is not None and "x-fal-request-timeout-type" in response.headers:
            return "permanent"  # our own start_timeout ran out at fal: the job was dropped
        return "transient" if code in (408, 409, 429) or code >= 500 else "permanent"

    def _http_outcome(self, exc: Exception, what: str, *, tries: int) -> _Outcome:
        kind = self._classify(exc)
        code = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
        message = _detail(exc)
        if code == 504 and kind == "permanent":
            return _Outcome(
                "failed",
                f"fal_timeout: fal dropped the request, it did not start "
                f"within timeout_s={self.options.timeout_s:g} s ({message})",
                state="failed",
            )
        if kind == "transient":
            return _Outcome(
                "failed",
                f"fal_unavailable: {what} failed {tries} time(s), last "
                f"{'HTTP ' + str(code) if code else type(exc).__name__}: {message}",
            )
        body = _json_body(exc)
        items = body.get("detail") if isinstance(body, dict) else None
        if isinstance(items, list) and any(
            isinstance(i, dict) and i.get("type") == "content_policy_violation" for i in items
        ):
            return _Outcome("refused", f"fal_content_policy: {message}", state="refused")
        if what == "download":
            # "completed": the result stays fetchable, a re-run tries the download again.
            return _Outcome("failed", f"fal_download_failed: HTTP {code}: {message}", state="completed")
        return _Outcome("failed", f"fal_rejected: {what} HTTP {code}: {message}", state="failed")

    async def _backoff(self, failures: int, exc: Exception) -> None:
        delay = min(self.options.backoff_s * 2 ** (failures - 1), _BACKOFF_CAP_S)
        delay *= random.uniform(0.5, 1.5)  # jitter: retries of a batch do not arrive together
        logger.debug("fal: transient %s, retry %d in %.2f s", type(exc).__name__, failures, delay)
        await asyncio.sleep(delay)

    def _result(
        self,
        request: EditRequest,
        progress: _Progress,
        status: str,
        *,
        image: np.ndarray | None = None,
        reason: str | None = None,
        cost_usd: float = 0.0,
        extra: Mapping[str, Any] | None = None,
    ) -> EditResult:
        elapsed = asyncio.get_running_loop().time() - progress.started
        metadata: dict[str, Any] = {
            "request_id": progress.request_id,
            "endpoint": progress.endpoint or self.options.endpoint,
            "seconds": round(elapsed, 4),
            "cost_usd": cost_usd,
            "resumed": progress.resumed,
            "submit_tries": progress.submit_tries,
            "seed": int(request.seed),
        }
        if progress.lost_request_ids:
            metadata["lost_request_ids"] = list(progress.lost_request_ids)
        metadata.update(extra or {})
        return EditResult(
            attempt_id=request.attempt_id,
            status=status,  # type: ignore[arg-type]
            image=image,
            reason=reason,
            cost_usd=cost_usd,
            metadata=metadata,
        )


def _row(progress: _Progress, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_id": progress.request_id,
        "endpoint": progress.endpoint,
        "state": state,
        "saved_at": time.time(),
        **extra,
    }


def _encode_png(image: np.ndarray) -> bytes:
    """``(H, W, 3)`` ``uint8`` RGB -> PNG bytes (lossless)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def _decode_image(data: bytes) -> tuple[np.ndarray, str]:
    """Image bytes -> (``(h, w, 3)`` ``uint8`` RGB, container format such as ``"PNG"``)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        fmt = image.format or "unknown"
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb), fmt


def _json_body(exc: Exception) -> Any:
    response = getattr(exc, "response", None)
    try:
        return response.json() if response is not None else None
    except Exception:
        return None


def _detail(exc: Exception) -> str:
    """The server's message: fal's ``detail`` (a string, or a list of typed errors)."""
    body = _json_body(exc)
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                text = f"{item.get('msg', item)}" + (f" [{loc}]" if loc else "")
                if item.get("categories"):
                    text += f" (categories: {', '.join(map(str, item['categories']))})"
                parts.append(text)
            else:
                parts.append(str(item))
        return "; ".join(parts)
    if detail:
        return str(detail)
    return str(exc) or type(exc).__name__


def _key_message(exc: Exception) -> str:
    code = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", "?")
    return (
        f"fal rejected the key in FAL_KEY (HTTP {code}: {_detail(exc)}); check it at "
        "https://fal.ai/dashboard/keys and `export FAL_KEY=<key_id>:<key_secret>`"
    )


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _close_clients(fal: Any, http: Any) -> None:
    # fal-client's AsyncClient has no public close; its httpx client is a cached property,
    # present in the instance dict once a call has tried to use it. Closing must not mask
    # the error being raised, e.g. when building that client is what failed.
    if fal is not None and "_client" in vars(fal):
        with contextlib.suppress(Exception):
            await (await fal._client).aclose()
    if http is not None:
        await http.aclose()


def _run_sync(coroutine: Any) -> Any:
    """Runs a coroutine to completion from sync code, even when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


EDITORS.register("fal", FalOptions, FalEditor)
