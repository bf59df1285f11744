"""fal's queue API as a :class:`~counterfactory.manifests.paid.base.PaidClient`, shared by
every fal caller of the factory.

One call is one queue request: ``POST https://queue.fal.run/<endpoint>`` with the model input,
status polls, then ``GET .../requests/<id>`` for the result JSON. :class:`FalQueue` does that
for a batch of calls with at most ``concurrency`` in flight per process, a spend cap, retries
of transient errors and a request journal; what a call sends and how its answer is read stay
with the caller (the ``fal`` editor: Nano Banana images; the ``vlm`` attribute backend: a
vision-LLM's text). Everything goes through the ``fal-client`` library, which reads its hosts
from ``FAL_RUN_HOST`` / ``FAL_QUEUE_RUN_HOST`` when it is first imported.

Money. fal bills a request that runs whether or not anybody collects its result. So the
request id goes into the :class:`~counterfactory.manifests.paid.base.PaidJournal`
*before* the wait, with the call's estimated price: a process killed mid-wait resumes by
fetching that id, never by paying again. Only the server's own word that it does not know an
id (HTTP 404), that the job failed, or that it was cancelled lets the same call be submitted
again. ``spend_cap_usd`` is checked against ``journal.spent_usd()`` plus what is being
submitted right now before every new submission; fetching an already-paid request is always
allowed. A finished call journals its real cost (the reader's figure), so the cap counts what
fal charged. Two windows cannot be closed from the client side, as fal has no idempotency key:
a kill between fal accepting a submission and the journal write (milliseconds), and a
submission whose HTTP answer is lost in transit.

Abandoned requests are cancelled. A request the client stops waiting for would otherwise run
on at fal, billed, and the next submission would take its slot, so fal would hold more than
``concurrency`` of ours. When an item times out (``timeout_s``), its status polls give up, its
task is cancelled, or the process is stopped (:func:`~counterfactory.manifests.paid.fal_cancel.cancel_open_requests`, called by the
command line's SIGINT/SIGTERM handler), the client sends ``PUT .../requests/<id>/cancel``.
fal answers 202 ``CANCELLATION_REQUESTED`` (the journal row becomes ``cancelled``) or 400
``ALREADY_COMPLETED`` (the row stays ``submitted``: the result is there to fetch). A
``cancelled`` row is still fetched on resume: a request fal had already started may finish
anyway, and it is then kept, never bought again; one that ended without a result (fal
reports the cancelled job as completed with an error) is submitted again as the same call.
A SIGKILL cannot cancel anything; the journal still lets the next run fetch instead of pay.

Slots. A slot of ``concurrency`` belongs to the request, not to the call: it is freed only
when fal says the request ended: its status is ``COMPLETED`` (with or without an error), fal
does not know the id (404), or a cancel is answered ``ALREADY_COMPLETED``. A 202 to a cancel is
not that answer: a request still in fal's queue then ends (its status says so), one already
running runs on until it finishes. A call that ends before fal's answer (its status polls gave
up in an outage, its time ran out, a cancel could not be confirmed) leaves its request
*parked*: the slot stays taken, the id stays in the journal and in :func:`~counterfactory.manifests.paid.fal_cancel.open_requests`
unless fal accepted a cancel, and the next poll frees it: calls waiting for a slot poll the
parked requests, a call resuming one takes its slot over, and :meth:`FalQueue.wait_parked`
lets a holder of a wider slot (the Prefect ``counterfactory-fal`` limit) wait for them. The
next run fetches a parked request by its journalled id. When every slot has been parked for
``timeout_s``, a waiting call fails (``fal_unavailable``) without submitting.

Errors. HTTP 408/409/429/5xx, connection errors and network time-outs are transient and
retried with exponential backoff, ``max_retries`` times per call (``fal-client`` itself
already retries 408/409/429 and connection errors up to 10 times before we see them). Other
4xx answers are per-item results. A rejected key (401/403) or an app fal does not know (404
on submit) raises :class:`SetupError`.

Key check. :meth:`FalQueue.prepare` asks the queue for the status of a random, never-issued
request id of the endpoint's app: free, authenticated, no model runs. A 401/403 answer means
the key is bad; any other answer (404 is the one expected for an id never issued) means it
passed. The probe cannot tell an unknown app from an unknown request id, so an unknown app is
caught by the 404 of the first submission, which stops the batch before anything is billed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from counterfactory.manifests.errors import CounterfactoryError, SetupError
from counterfactory.manifests.paid.base import (
    CallStatus,
    MemoryJournal,
    PaidAnswer,
    PaidCall,
    PaidCallFailed,
    PaidJournal,
    Reader,
    SpendCap,
    backoff_delay,
    reraise_setup_error,
    run_sync,
)
from counterfactory.manifests.paid.fal_cancel import OpenRequest, track, untrack
from counterfactory.manifests.vocabulary import FAILED, REFUSED

logger = logging.getLogger(__name__)

# fal endpoint ids are <owner>/<app>[/<path>...].
ENDPOINT_SHAPE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(/[\w.-]+)*$")

#: Gemini (behind Nano Banana and the vision router) answers some requests with text instead
#: of doing them ("I can't help with ..."); clients read this wording as a refusal.
REFUSAL_TEXT = re.compile(
    r"\b(I can(?:'|\u2019|no)t|I(?:'m|\u2019m| am) (?:not able|unable)|I won(?:'|\u2019)t"
    r"|I will not|unable to (?:help|edit|create|generate|fulfil))",
    re.IGNORECASE,
)

# Journal states whose request id may still be fetched. "failed" (the server said the job
# failed) and "lost" (the server does not know the id) allow a new submission instead.
FETCHABLE_STATES = frozenset({"submitted", "completed", "refused", "cancelled"})

_POLL_GROWTH = 0.05
_POLL_CAP_S = 5.0
#: Seconds one cancellation may take; it runs after the item's own deadline has passed.
CANCEL_TIMEOUT_S = 5.0


class FalQueueOptions(BaseModel):
    """The transport's settings, shared by every fal client's options.

    Attributes:
        concurrency: requests in flight at once (submitted and not yet reported ended by fal).
        spend_cap_usd: no new submission once the journal's spend plus its estimated price
            would exceed this many US dollars; ``None`` for no cap.
        timeout_s: seconds one request may take from getting its slot to its read answer
            (the submission call is bounded by the same number but never cut half-way); a
            request still unanswered then is cancelled at fal.
        max_retries: retries of one HTTP call after a transient failure.
        poll_interval_s: shortest seconds between status polls of one request (the interval
            grows to 5 % of the time waited, at most 5 s).
        backoff_s: first retry delay in seconds; doubles per retry, jittered, capped at 30 s.
    """

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(4, ge=1)
    spend_cap_usd: float | None = Field(None, ge=0)
    timeout_s: float = Field(300.0, gt=0)
    max_retries: int = Field(3, ge=0)
    poll_interval_s: float = Field(0.25, gt=0)
    backoff_s: float = Field(1.0, ge=0)


class FalTransfer:
    """What a reader may use of the batch: downloads with the transport's retries."""

    def __init__(self, queue: FalQueue, http: Any, endpoint: str, request_id: str | None) -> None:
        self._queue, self._http = queue, http
        self.endpoint, self.request_id = endpoint, request_id

    async def download(self, url: str) -> bytes:
        """The bytes at ``url`` (``data:`` URIs decoded in place). A CDN 404 is retried like a
        transient error, as a file may not have propagated yet; the fal key is not sent.

        Raises:
            PaidCallFailed: ``fal_download_failed`` / ``fal_bad_output``, journaled ``completed``
                (the result stays fetchable, a re-run tries the download again).
        """
        if url.startswith("data:"):
            return base64.b64decode(url.partition(",")[2])
        if not url:
            raise PaidCallFailed("failed", "fal_bad_output: the result's file has no url", state="completed")

        async def get() -> bytes:
            response = await self._http.get(url)
            response.raise_for_status()
            return response.content

        return await self._queue._retrying("download", get)


@dataclass
class _Progress:
    """What one call has done so far; read when it ends, whichever way it ends."""

    started: float
    estimate_usd: float
    request_id: str | None = None
    endpoint: str | None = None
    resumed: bool = False
    submit_tries: int = 0
    lost_request_ids: list[str] = field(default_factory=list)
    cancelled: bool = False
    #: fal said the current request ended (completed, failed, cancelled in its queue, or
    #: unknown to it); until then it holds its slot, whatever became of the call
    ended: bool = False


@dataclass
class _Parked:
    """A request whose call has ended without fal saying the request did: it keeps its slot."""

    key: str
    endpoint: str
    request_id: str
    since: float  # time.monotonic() when it was parked
    next_poll: float = 0.0
    polls: int = 0
    polling: bool = False


@dataclass
class _Batch:
    """Per-``run_many`` state shared by its calls (one event loop)."""

    journal: PaidJournal
    fal: Any
    http: Any
    read: Reader


class FalQueue:
    """Paid calls to one fal endpoint over the queue API.

    Args:
        endpoint: fal endpoint id, ``<owner>/<app>[/<path>]``.
        options: transport settings.
        estimate_usd: USD one call is expected to cost; journaled at submission and used by
            the spend cap's check before it (the real cost replaces it once read).
        known_endpoints: named in the message when fal does not know ``endpoint``.
        client_name: the option path users set, for messages (``editor.fal``).
    """

    def __init__(
        self,
        endpoint: str,
        options: FalQueueOptions,
        *,
        estimate_usd: float,
        known_endpoints: Sequence[str] = (),
        client_name: str = "fal",
    ) -> None:
        self.endpoint = endpoint
        self.options = options
        self.estimate_usd = float(estimate_usd)
        self.known_endpoints = tuple(known_endpoints)
        self.client_name = client_name
        self._fal: Any = None
        self._key: str | None = None
        self._prepared = False
        # Shared by every run_many of this queue, whatever thread or event loop it runs in
        # (the flow runs several templates at once): ``concurrency`` bounds the requests in
        # flight per process, and spend reservations are checked against one cap.
        self._in_flight = threading.BoundedSemaphore(options.concurrency)
        self._cap = SpendCap(options.spend_cap_usd, code="fal_spend_cap_reached")
        # request id -> a request that holds one of the ``_in_flight`` slots although its call
        # has ended, until fal says it ended; guarded by ``_parked_lock``
        self._parked: dict[str, _Parked] = {}
        self._parked_lock = threading.Lock()

    # -- set-up -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Checks the dependency, key and endpoint, then the key against fal.

        Raises:
            SetupError: with one message saying what is wrong and how to fix it.
        """
        if not self._prepared:
            run_sync(self.aprepare())

    async def aprepare(self) -> None:
        """Async form of :meth:`prepare`."""
        if self._prepared:
            return
        try:
            import fal_client
            import httpx
        except ImportError as exc:
            raise SetupError(
                f"the {self.client_name} backend needs the fal-client package: "
                f"pip install 'counterfactory[remote]' ({exc})"
            ) from None
        key = os.environ.get("FAL_KEY")
        if not key and os.environ.get("FAL_KEY_ID") and os.environ.get("FAL_KEY_SECRET"):
            key = f"{os.environ['FAL_KEY_ID']}:{os.environ['FAL_KEY_SECRET']}"
        if not key:
            raise SetupError(
                "FAL_KEY is not set: create a key at https://fal.ai/dashboard/keys and run "
                "`export FAL_KEY=<key_id>:<key_secret>` (or set FAL_KEY_ID and FAL_KEY_SECRET)"
            )
        if self.endpoint not in self.known_endpoints and not ENDPOINT_SHAPE.fullmatch(self.endpoint):
            known = f"; known endpoints: {', '.join(self.known_endpoints)}" if self.known_endpoints else ""
            raise SetupError(
                f"unknown fal endpoint {self.endpoint!r} in {self.client_name}.endpoint: "
                f"expected <owner>/<app>[/<path>]{known}"
            )
        self._fal, self._key = fal_client, key
        client = self._client()
        host = fal_client.client.QUEUE_URL_FORMAT
        try:
            async with asyncio.timeout(min(30.0, self.options.timeout_s)):
                await client.status(self.endpoint, str(uuid.uuid4()))
        except fal_client.FalClientHTTPError as exc:
            if exc.status_code in (401, 403):
                raise SetupError(_key_message(exc)) from None
        except (httpx.TransportError, httpx.TimeoutException, TimeoutError, OSError) as exc:
            raise SetupError(
                f"cannot reach fal's queue at {host} ({type(exc).__name__}: {exc}); check the "
                "network, or FAL_QUEUE_RUN_HOST if it is set"
            ) from None
        finally:
            await _close_clients(client, None)
        self._prepared = True

    @property
    def fal(self) -> Any:
        """The imported ``fal_client`` module (after :meth:`prepare`)."""
        return self._fal

    def _client(self) -> Any:
        return self._fal.AsyncClient(key=self._key, default_timeout=self.options.timeout_s)

    def _http_client(self) -> Any:
        import httpx

        # A separate client for output downloads: the fal key must not travel to a CDN.
        return httpx.AsyncClient(timeout=self.options.timeout_s, follow_redirects=True)

    # -- batches ------------------------------------------------------------------------

    def run_many(self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None) -> list[PaidAnswer]:
        """Runs ``calls`` with at most ``concurrency`` in flight; see :meth:`arun_many`."""
        return run_sync(self.arun_many(calls, read, journal))

    async def arun_many(
        self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None
    ) -> list[PaidAnswer]:
        """One :class:`PaidAnswer` per call, in order; calls sharing a key share one answer.

        ``read(call, result_json, transfer)`` turns a finished request's result into a
        :class:`PaidReading`, or raises :class:`PaidCallFailed`. Without a journal the batch
        keeps an in-memory one (no resume across processes).

        Raises:
            SetupError: the key or endpoint is rejected; nothing was billed for it.
        """
        if not self._prepared:
            await self.aprepare()
        journal = journal if journal is not None else MemoryJournal()
        unique: dict[str, PaidCall] = {}
        for call in calls:
            unique.setdefault(call.key, call)
        batch = _Batch(journal=journal, fal=self._client(), http=self._http_client(), read=read)
        tasks: dict[str, asyncio.Task[PaidAnswer]] = {}
        try:
            async with asyncio.TaskGroup() as group:
                for key, call in unique.items():
                    tasks[key] = group.create_task(self._one(call, batch))
        except BaseExceptionGroup as errors:
            reraise_setup_error(errors)
            raise
        finally:
            await _close_clients(batch.fal, batch.http)
        return [tasks[c.key].result() for c in calls]

    # -- one call -----------------------------------------------------------------------

    async def _one(self, call: PaidCall, batch: _Batch) -> PaidAnswer:
        # A request this queue parked is still running at fal: a call resuming it takes over
        # its slot instead of taking a second one for the same request.
        if not self._adopt(call, batch):
            try:
                await self._acquire(batch)
            except PaidCallFailed as failure:
                progress = _Progress(started=asyncio.get_running_loop().time(), estimate_usd=self.estimate_usd)
                return self._answer(call, progress, failure.status, reason=failure.reason)
        progress = _Progress(started=asyncio.get_running_loop().time(), estimate_usd=self.estimate_usd)
        try:
            return await self._one_in_slot(call, batch, progress)
        finally:
            # The slot is the request's, not the call's: it is freed only once fal has said
            # the request ended; until then it is parked, still taken, and polled again later.
            request_id = progress.request_id
            if request_id is not None and (progress.ended or progress.cancelled):
                untrack(request_id)  # nothing left for a stop to cancel
            if request_id is None or progress.ended:
                self._in_flight.release()
            else:
                self._park(call.key, progress.endpoint or self.endpoint, request_id)

    async def _acquire(self, batch: _Batch) -> None:
        """Takes one slot, polling parked requests meanwhile (the one that ends frees its slot).

        Raises:
            PaidCallFailed: ``fal_unavailable`` when every slot has been held by a parked
                request for ``timeout_s`` (fal cannot say whether they ended); nothing was
                submitted.
        """
        all_parked_since: float | None = None
        # Polling keeps the wait cancellable: a thread blocked in acquire() is not.
        while not self._in_flight.acquire(blocking=False):
            await self._poll_parked(batch)
            now = time.monotonic()
            with self._parked_lock:
                all_parked = len(self._parked) >= self.options.concurrency
            if not all_parked:
                all_parked_since = None
            elif all_parked_since is None:
                all_parked_since = now
            elif now - all_parked_since >= self.options.timeout_s:
                raise PaidCallFailed(
                    "failed",
                    f"fal_unavailable: all {self.options.concurrency} slot(s) held for "
                    f"timeout_s={self.options.timeout_s:g} s by requests fal has not reported "
                    "ended (their status polls fail); nothing was submitted",
                )
            await asyncio.sleep(0.005)

    def _adopt(self, call: PaidCall, batch: _Batch) -> bool:
        """Whether ``call`` resumes a parked request and so took over its slot."""
        with self._parked_lock:
            if not self._parked:
                return False
        saved = batch.journal.load(call.key) or {}
        with self._parked_lock:
            return self._parked.pop(str(saved.get("request_id")), None) is not None

    def _park(self, key: str, endpoint: str, request_id: str) -> None:
        now = time.monotonic()
        with self._parked_lock:
            self._parked[request_id] = _Parked(key, endpoint, request_id, since=now, next_poll=now)
        logger.warning("fal: request %s has not been reported ended; it keeps its slot until fal says so", request_id)

    def _settle(self, request_id: str) -> None:
        """fal said a parked request ended: its slot is free."""
        with self._parked_lock:
            entry = self._parked.pop(request_id, None)
        if entry is not None:  # else a resuming call took the slot over
            untrack(request_id)
            self._in_flight.release()

    def parked(self) -> list[str]:
        """Ids of requests holding a slot although their calls ended, fal not having said they
        ended (e.g. their status polls gave up during an outage)."""
        with self._parked_lock:
            return list(self._parked)

    async def _poll_parked(self, batch: _Batch) -> None:
        """One status poll of each parked request that is due, without retries: the next poll
        is the retry, spaced like a request's own polls (5 % of the time parked, at least
        ``poll_interval_s``, at most 5 s)."""
        now = time.monotonic()
        with self._parked_lock:
            due = [e for e in self._parked.values() if not e.polling and e.next_poll <= now]
            for entry in due:
                entry.polling = True
        for entry in due:
            ended = False
            try:
                async with asyncio.timeout(CANCEL_TIMEOUT_S):
                    status = await batch.fal.status(entry.endpoint, entry.request_id)
                ended = isinstance(status, self._fal.Completed)
            except Exception as exc:  # noqa: BLE001 - a failed poll is tried again later
                ended = getattr(exc, "status_code", None) == 404  # fal does not know it: not running
            with self._parked_lock:
                entry.polling = False
                entry.polls += 1
                now = time.monotonic()
                waited = now - entry.since
                entry.next_poll = now + max(self.options.poll_interval_s, min(_POLL_GROWTH * waited, _POLL_CAP_S))
            if ended:
                self._settle(entry.request_id)

    def wait_parked(self, timeout_s: float | None = None) -> list[str]:
        """Polls the parked requests until fal says each ended, for at most ``timeout_s``
        (default the options' ``timeout_s``); returns the ids still parked.

        For a caller that holds a slot of a wider limit for these requests (the Prefect
        ``counterfactory-fal`` limit, see ``flows/limits.py``) and may free it only then.
        """
        if not self.parked():
            return []
        return run_sync(self._await_parked(self.options.timeout_s if timeout_s is None else timeout_s))

    async def _await_parked(self, timeout_s: float) -> list[str]:
        batch = _Batch(journal=MemoryJournal(), fal=self._client(), http=None, read=None)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout_s
        try:
            while self.parked() and time.monotonic() < deadline:
                await self._poll_parked(batch)
                await asyncio.sleep(0.005)
        finally:
            await _close_clients(batch.fal, None)
        return self.parked()

    async def _one_in_slot(self, call: PaidCall, batch: _Batch, progress: _Progress) -> PaidAnswer:
        try:
            return await self._attempt(call, batch, progress)
        except PaidCallFailed as failure:
            if failure.state is None and progress.request_id is not None:
                # given up on a request fal may still be running: cancel it, so it neither
                # bills nor holds a slot beyond the concurrency bound
                await self._abandon(call, progress, batch, failure.reason.partition(":")[0])
            elif failure.state is not None and progress.request_id is not None:
                progress.ended = True  # fal's own answer about the request: it is over
                batch.journal.save(
                    call.key, _row(progress, failure.state, reason=failure.reason), cost_usd=failure.cost_usd
                )
            # A failure after fal accepted (and bills) the request, with the id still journaled
            # as fetchable: the call must be fetched again, never replaced by another one.
            state = failure.state or ("cancelled" if progress.cancelled else "submitted")
            pending = failure.status == FAILED and progress.request_id is not None and state in FETCHABLE_STATES
            reason = failure.reason + ("; cancelled at fal" if progress.cancelled else "")
            return self._answer(
                call, progress, failure.status, reason=reason, cost_usd=failure.cost_usd, pending=pending
            )
        except asyncio.CancelledError:
            if progress.request_id is not None:
                await asyncio.shield(self._abandon(call, progress, batch, "call_cancelled"))
            raise
        except SetupError:
            raise
        except Exception as exc:  # a bug or a surprise must not sink the other calls
            logger.exception("fal request for %s failed", call.key)
            return self._answer(call, progress, "failed", reason=f"fal_error: {type(exc).__name__}: {exc}")

    async def _attempt(self, call: PaidCall, batch: _Batch, progress: _Progress) -> PaidAnswer:
        deadline = progress.started + self.options.timeout_s
        saved = batch.journal.load(call.key) or {}
        if saved.get("request_id") and saved.get("state") in FETCHABLE_STATES:
            progress.request_id = str(saved["request_id"])
            progress.endpoint = str(saved.get("endpoint") or self.endpoint)
            progress.resumed = True
            # a request whose result was read before has ended; one only submitted (or
            # cancelled) holds a slot at fal until its status says otherwise
            progress.ended = saved.get("state") in ("completed", REFUSED)
            try:
                payload = await self._until(
                    deadline, progress, self._collect(progress, batch, cancelled=saved.get("state") == "cancelled")
                )
            except _Lost:
                batch.journal.save(call.key, _row(progress, "lost"), cost_usd=0.0)
                progress.lost_request_ids.append(progress.request_id)
                progress.request_id, progress.resumed, progress.ended = None, False, False
            else:
                return await self._until(deadline, progress, self._finish(call, progress, payload, batch))

        arguments = await asyncio.to_thread(call.arguments)
        if asyncio.get_running_loop().time() >= deadline:  # a slow resume must not pay anew
            await self._until(deadline, progress, asyncio.sleep(0))
        await self._submit(call, arguments, progress, batch)
        try:
            payload = await self._until(deadline, progress, self._collect(progress, batch))
        except _Lost:
            progress.ended = True  # fal does not know it: it holds no slot there
            raise PaidCallFailed(
                "failed",
                f"fal_lost: fal does not know request {progress.request_id}, which it accepted moments ago",
                state="lost",
            ) from None
        return await self._until(deadline, progress, self._finish(call, progress, payload, batch))

    async def _submit(self, call: PaidCall, arguments: dict[str, Any], progress: _Progress, batch: _Batch) -> None:
        """Submits (retrying transient failures) and journals the id before returning.

        Deliberately outside the per-request deadline: cancelling a submission half-way could
        leave a billed request that no journal row knows about.
        """
        endpoint, price = self.endpoint, self.estimate_usd
        # the cap is checked and the price reserved under one lock, so no call of this or
        # another batch slips in; the journal row written below takes the reservation over
        with self._cap.reserve(batch.journal, price) as hold:
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
                        raise SetupError(_key_message(exc)) from None
                    if kind == "not_found":
                        known = f"; known endpoints: {', '.join(self.known_endpoints)}" if self.known_endpoints else ""
                        raise SetupError(
                            f"fal has no app at endpoint {endpoint!r} (HTTP 404: {_detail(exc)}); "
                            f"set {self.client_name}.endpoint to one it serves{known}"
                        ) from None
                    if kind == "transient" and failures < self.options.max_retries:
                        failures += 1
                        await self._backoff(failures, exc)
                        continue
                    raise self._http_outcome(exc, "submit", tries=failures + 1) from None
            progress.request_id, progress.endpoint, progress.ended = handle.request_id, endpoint, False
            with hold.landing():  # the row takes the reservation over as it lands
                batch.journal.save(call.key, _row(progress, "submitted"), cost_usd=price)
            track(OpenRequest(call.key, endpoint, handle.request_id, str(self._key), batch.journal, price))

    async def _collect(self, progress: _Progress, batch: _Batch, *, cancelled: bool = False) -> dict[str, Any]:
        """Polls the request until fal says it is done, then fetches its result JSON.

        ``cancelled``: we asked fal to cancel this request; if it ended with an error, it
        ended unbilled because of that, and the same call is submitted again (``_Lost``).
        """
        handle = await batch.fal.get_handle(progress.endpoint, progress.request_id)
        try:
            completed = await self._wait_completed(handle, poll_first=progress.resumed)
        except _Lost:
            progress.ended = True
            raise
        progress.ended = True  # fal's word: COMPLETED (with or without an error)
        job_failed = completed.error is not None
        if job_failed and cancelled:
            raise _Lost()

        async def fetch() -> dict[str, Any]:
            # The handle's own authenticated client, straight to the result: handle.get()
            # would poll the status once more first.
            response = await handle.client.get(handle.response_url)
            response.raise_for_status()
            return response.json()

        try:
            return await self._retrying("result", fetch, transient_ok=not job_failed)
        except PaidCallFailed as outcome:
            if job_failed and outcome.state is None:
                # The server's own verdict: the job failed (fal does not bill it), so a
                # later run may submit this call again.
                raise PaidCallFailed(
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

    async def _finish(self, call: PaidCall, progress: _Progress, payload: dict[str, Any], batch: _Batch) -> PaidAnswer:
        transfer = FalTransfer(self, batch.http, progress.endpoint or self.endpoint, progress.request_id)
        reading = await batch.read(call, payload, transfer)
        batch.journal.save(call.key, _row(progress, "completed"), cost_usd=reading.cost_usd)
        return self._answer(
            call, progress, "ok", value=reading.value, cost_usd=reading.cost_usd, extra=reading.metadata
        )

    async def _abandon(self, call: PaidCall, progress: _Progress, batch: _Batch, why: str) -> None:
        """Asks fal to cancel a request nobody will wait for, and journals its answer."""
        request_id = progress.request_id
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                await batch.fal.cancel(progress.endpoint, request_id)
        except Exception as exc:  # noqa: BLE001 - a failed cancel leaves a fetchable row, no worse
            code = getattr(exc, "status_code", None)
            if code == 404:
                batch.journal.save(call.key, _row(progress, "lost"), cost_usd=0.0)
                progress.lost_request_ids.append(str(request_id))
                progress.request_id = None
                progress.ended = True
            elif code == 400:  # ALREADY_COMPLETED: the result waits, the row stays fetchable
                progress.ended = True
            else:
                logger.warning("fal: could not cancel request %s (%s: %s)", request_id, type(exc).__name__, exc)
            return
        progress.cancelled = True
        batch.journal.save(call.key, _row(progress, "cancelled", cancelled_because=why), cost_usd=progress.estimate_usd)
        # 202 CANCELLATION_REQUESTED ends a request still in fal's queue; one already running
        # runs on (and holds its slot) until it finishes. Only its status tells which.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                status = await batch.fal.status(progress.endpoint, request_id)
            progress.ended = isinstance(status, self._fal.Completed)

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
                    raise SetupError(_key_message(exc)) from None
                if kind == "not_found":
                    raise _Lost() from None
                if kind == "transient" and transient_ok and failures < self.options.max_retries:
                    failures += 1
                    await self._backoff(failures, exc)
                    continue
                raise self._http_outcome(exc, what, tries=failures + 1) from None

    async def _until(self, deadline: float, progress: _Progress, work: Any) -> Any:
        """Awaits ``work`` until the loop time ``deadline``, then ends the call as timed out."""
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if not scope.expired():
                raise
        where = f"request {progress.request_id}" if progress.request_id else "no request id"
        raise PaidCallFailed(
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

    def _http_outcome(self, exc: Exception, what: str, *, tries: int) -> PaidCallFailed:
        kind = self._classify(exc)
        code = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
        message = _detail(exc)
        if code == 504 and kind == "permanent":
            return PaidCallFailed(
                "failed",
                f"fal_timeout: fal dropped the request, it did not start "
                f"within timeout_s={self.options.timeout_s:g} s ({message})",
                state="failed",
            )
        if kind == "transient":
            return PaidCallFailed(
                "failed",
                f"fal_unavailable: {what} failed {tries} time(s), last "
                f"{'HTTP ' + str(code) if code else type(exc).__name__}: {message}",
            )
        body = _json_body(exc)
        items = body.get("detail") if isinstance(body, dict) else None
        if isinstance(items, list) and any(
            isinstance(i, dict) and i.get("type") == "content_policy_violation" for i in items
        ):
            return PaidCallFailed("refused", f"fal_content_policy: {message}", state="refused")
        if what == "download":
            # "completed": the result stays fetchable, a re-run tries the download again.
            return PaidCallFailed("failed", f"fal_download_failed: HTTP {code}: {message}", state="completed")
        return PaidCallFailed("failed", f"fal_rejected: {what} HTTP {code}: {message}", state="failed")

    async def _backoff(self, failures: int, exc: Exception) -> None:
        delay = backoff_delay(failures, self.options.backoff_s)
        logger.debug("fal: transient %s, retry %d in %.2f s", type(exc).__name__, failures, delay)
        await asyncio.sleep(delay)

    def _answer(
        self,
        call: PaidCall,
        progress: _Progress,
        status: CallStatus,
        *,
        value: Any = None,
        reason: str | None = None,
        cost_usd: float = 0.0,
        pending: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> PaidAnswer:
        return PaidAnswer(
            key=call.key,
            status=status,
            value=value,
            reason=reason,
            cost_usd=cost_usd,
            request_id=progress.request_id,
            endpoint=progress.endpoint or self.endpoint,
            seconds=round(asyncio.get_running_loop().time() - progress.started, 4),
            resumed=progress.resumed,
            submit_tries=progress.submit_tries,
            lost_request_ids=tuple(progress.lost_request_ids),
            pending_request_id=progress.request_id if pending else None,
            cancelled=progress.cancelled,
            metadata=dict(extra or {}),
        )


class _Lost(CounterfactoryError):
    """fal answered 404 for a request id (expired or never accepted), or ended a request we
    had cancelled without a result: the same call may be submitted again."""


def png_data_uri(image: Any) -> str:
    """``(H, W, 3)`` ``uint8`` RGB -> a PNG data URI (lossless; fal accepts data URIs wherever
    it takes an image URL)."""
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def check_rgb(image: Any, code: str) -> None:
    """Raises :class:`PaidCallFailed` (``<code>: ...``) unless ``image`` is ``(H, W, 3)`` uint8."""
    import numpy as np

    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
        shape, dtype = getattr(image, "shape", None), getattr(image, "dtype", None)
        raise PaidCallFailed(
            "failed", f"{code}: image must be (H, W, 3) uint8 RGB, received shape {shape} dtype {dtype}"
        )


def _row(progress: _Progress, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_id": progress.request_id,
        "endpoint": progress.endpoint,
        "state": state,
        "saved_at": time.time(),
        **extra,
    }


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


async def _close_clients(fal: Any, http: Any) -> None:
    # fal-client's AsyncClient has no public close; its httpx client is a cached property,
    # present in the instance dict once a call has tried to use it. Closing must not mask
    # the error being raised, e.g. when building that client is what failed.
    if fal is not None and "_client" in vars(fal):
        with contextlib.suppress(Exception):
            await (await fal._client).aclose()
    if http is not None:
        await http.aclose()
