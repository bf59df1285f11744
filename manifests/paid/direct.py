"""Paid calls that are one request and one answer each (a chat completion over HTTP), as a
:class:`~counterfactory.manifests.paid.base.PaidClient`.

:class:`DirectClient` takes the function that sends one request (``send(arguments) -> result
JSON``) and keeps the promises every paid client keeps: at most ``concurrency`` requests in
flight per client, whatever thread or event loop its batches run in; the spend cap checked
against the journal's spend plus what is in flight before each request; the transport errors
the caller names (``transient``) retried with jittered exponential backoff; and each result
committed to the journal the moment it returns, with what it cost, so that a re-run reads it
back instead of paying again (a request in flight when the process dies is lost, and asked
again: there is no request id to fetch it by). What a call sends and how its answer is read
stay with the caller, as for :class:`~counterfactory.manifests.paid.fal.FalQueue`.

Journal rows: ``{"state": "completed", "result": <result JSON>, "saved_at": ...}``, written
once, when the result returns and has been read: at the reader's cost, or at ``estimate_usd``
when the reader refused or failed it (it was paid for all the same, and is read again next
time). The write runs on the batch's writer thread and the call keeps its slot and its spend
reservation until it lands. A call that got no result has no row, and is asked again next time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid.base import (
    MemoryJournal,
    PaidAnswer,
    PaidCall,
    PaidCallFailed,
    PaidJournal,
    Reader,
    SpendCap,
    SpendHold,
    backoff_delay,
    redact,
    reraise_setup_error,
    run_sync,
)

logger = logging.getLogger(__name__)


def _land(journal: PaidJournal, key: str, row: dict[str, Any], cost_usd: float, hold: SpendHold) -> None:
    """Writes one paid call's journal row on the batch's writer thread; its hold against the cap
    ends as the write returns, in the same thread (:meth:`SpendHold.landing`)."""
    with hold.landing():
        journal.save(key, row, cost_usd=cost_usd)


class DirectClient:
    """Paid calls of one request each.

    Args:
        send: ``await send(arguments)``: sends one request, returns its result JSON; raises one
            of ``transient`` for a transport failure worth another try.
        name: the client's name, the prefix of its reason codes (``<name>_spend_cap_reached``,
            ``<name>_unavailable``, ``<name>_error``).
        concurrency: requests in flight at once, per client.
        spend_cap_usd: no new request once the journal's spend plus what is in flight would pass
            this many US dollars; ``None`` for no cap.
        estimate_usd: USD one request is expected to cost, held against the cap while it is in
            flight (the reader's figure replaces it in the journal).
        max_retries: retries of one request after a transient failure.
        backoff_s: first retry delay in seconds; doubles per retry, jittered, capped at 30 s.
        transient: the exception types ``send`` raises for a transport failure.
        secrets: strings (a configured key) cut out of every reason a call ends with, beside
            anything else that looks like a credential (:func:`~counterfactory.manifests.paid.base.redact`).
    """

    def __init__(
        self,
        send: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        *,
        name: str,
        concurrency: int = 4,
        spend_cap_usd: float | None = None,
        estimate_usd: float = 0.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        transient: tuple[type[BaseException], ...] = (),
        secrets: Sequence[str | None] = (),
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"{name}: concurrency must be at least 1, got {concurrency}")
        self.send, self.name = send, name
        self.concurrency, self.estimate_usd = concurrency, float(estimate_usd)
        self.max_retries, self.backoff_s, self.transient = max_retries, backoff_s, transient
        self._cap = SpendCap(spend_cap_usd, code=f"{name}_spend_cap_reached")
        self._in_flight = threading.BoundedSemaphore(concurrency)
        self.secrets = tuple(secrets)

    def prepare(self) -> None:
        """Nothing to check before the first request: ``send`` owns its connection."""

    def run_many(self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None) -> list[PaidAnswer]:
        """Runs ``calls``; see :meth:`arun_many`."""
        return run_sync(self.arun_many(calls, read, journal))

    async def arun_many(
        self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None
    ) -> list[PaidAnswer]:
        """One :class:`PaidAnswer` per call, in order; calls sharing a key share one answer.

        ``read(call, result_json, None)`` turns a result into a :class:`PaidReading` (or raises
        :class:`PaidCallFailed`); a result already in the journal is read again, not paid again.

        ``concurrency`` workers take the calls one after another (a waiting call costs nothing:
        no task per call polls for a slot), and every journal write runs on one writer thread of
        the batch, one after another, so the event loop keeps sending and reading while the
        journal's database writes (a fixed-latency server returns a whole wave of answers at
        once; writing them on the loop would delay the wave's next requests by the sum of the
        writes). A call waits for its own write before it gives its slot up.

        Raises:
            SetupError: ``send`` said the batch cannot go on (e.g. a rejected key); the calls
                still running are cancelled.
        """
        journal = journal if journal is not None else MemoryJournal()
        unique: dict[str, PaidCall] = {}
        for call in calls:
            unique.setdefault(call.key, call)
        todo = iter(unique.values())
        answers: dict[str, PaidAnswer] = {}
        loop = asyncio.get_running_loop()
        writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-journal")
        sending = asyncio.Semaphore(self.concurrency)

        async def save(key: str, row: dict[str, Any], cost_usd: float, hold: SpendHold) -> None:
            await loop.run_in_executor(writer, functools.partial(_land, journal, key, row, cost_usd, hold))

        async def worker() -> None:
            for call in todo:  # one iterator shared by the workers: each call is taken once
                answers[call.key] = await self._one(call, read, journal, save, sending)

        try:
            async with asyncio.TaskGroup() as group:
                # twice the bound: while one call's answer is read and written, another is sent
                for _ in range(min(2 * self.concurrency, len(unique))):
                    group.create_task(worker())
        except BaseExceptionGroup as errors:
            reraise_setup_error(errors)
            raise
        finally:
            writer.shutdown(wait=True)
        return [answers[call.key] for call in calls]

    async def _one(
        self, call: PaidCall, read: Reader, journal: PaidJournal, save: Any, sending: asyncio.Semaphore
    ) -> PaidAnswer:
        started = time.monotonic()
        tries = [0]  # requests sent, counted by ``_send``

        def answer(status: Any, **fields: Any) -> PaidAnswer:
            return PaidAnswer(
                call.key, status, seconds=round(time.monotonic() - started, 4), submit_tries=tries[0], **fields
            )

        saved = journal.load(call.key) or {}
        resumed = saved.get("state") == "completed" and isinstance(saved.get("result"), dict)
        try:
            if resumed:
                reading = await read(call, saved["result"], None)
            else:
                reading = await self._send_and_read(call, read, journal, save, sending, tries)
        except PaidCallFailed as failure:
            reason = redact(failure.reason, self.secrets)
            return answer(failure.status, reason=reason, cost_usd=failure.cost_usd, resumed=resumed)
        except SetupError:
            raise
        except Exception as exc:  # a bug or a surprise must not sink the other calls
            logger.exception("%s request for %s failed", self.name, call.key)
            reason = redact(f"{self.name}_error: {type(exc).__name__}: {exc}", self.secrets)
            return answer("failed", reason=reason, resumed=resumed)
        return answer("ok", value=reading.value, cost_usd=reading.cost_usd, resumed=resumed, metadata=reading.metadata)

    async def _send_and_read(
        self,
        call: PaidCall,
        read: Reader,
        journal: PaidJournal,
        save: Any,
        sending: asyncio.Semaphore,
        tries: list[int],
    ) -> Any:
        """Sends one call in a slot and reads its result, then journals it with the slot freed.

        The slot (this batch's ``sending`` and the client's own, shared with other batches) is
        held from the spend cap's check until the result is read: that is a request in flight.
        The spend reservation is held until the journal row lands, at the reader's cost once
        read (a cost that is not a finite USD amount >= 0 fails the call, journaled at the
        estimate)."""
        await sending.acquire()
        while not self._in_flight.acquire(blocking=False):  # another batch holds the slots
            await asyncio.sleep(0.005)  # polling keeps the wait cancellable
        held = True

        def free() -> None:
            nonlocal held
            if held:
                held = False
                self._in_flight.release()
                sending.release()

        try:
            # the cap first: a call it refuses builds no input and sends nothing
            with self._cap.reserve(journal, self.estimate_usd) as hold:
                try:
                    arguments = await asyncio.to_thread(call.arguments)
                    result = await self._send(arguments, tries)
                    # read with the slot held: until its cost is known (and held against the
                    # cap, below) a returned answer counts as in flight, so the calls paid past
                    # the cap are at most the ones in flight when it was reached
                    row = {"state": "completed", "result": result, "saved_at": time.time()}
                    try:
                        reading = await read(call, result, None)
                        cost = reading.cost_usd
                        if not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost >= 0):
                            raise PaidCallFailed(
                                "failed", f"{self.name}_bad_cost: the reader's cost {cost!r} is not a USD amount >= 0"
                            )
                    except BaseException as exc:
                        cost = getattr(exc, "cost_usd", 0.0) or self.estimate_usd
                        hold.settle(cost)
                        free()
                        # paid for: journaled at the estimate when the reader refuses or fails it,
                        # so a re-run reads it back instead of paying again
                        await asyncio.shield(save(call.key, row, cost, hold))
                        raise
                    hold.settle(cost)
                finally:
                    free()
                # journaled before the hold ends, at the reader's cost
                await asyncio.shield(save(call.key, row, cost, hold))
                return reading
        finally:
            free()

    async def _send(self, arguments: dict[str, Any], tries: list[int]) -> dict[str, Any]:
        """``send(arguments)``, retrying the transient errors with backoff; counts in ``tries[0]``."""
        while True:
            tries[0] += 1
            try:
                return await self.send(arguments)
            except self.transient as exc:
                if tries[0] > self.max_retries:
                    raise PaidCallFailed(
                        "failed",
                        f"{self.name}_unavailable: the request failed {tries[0]} time(s), last "
                        f"{type(exc).__name__}: {exc}",
                    ) from None
                await asyncio.sleep(backoff_delay(tries[0], self.backoff_s))
