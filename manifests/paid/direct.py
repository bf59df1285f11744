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

Journal rows: ``{"state": "completed", "result": <result JSON>, "saved_at": ...}``, at
``estimate_usd`` when the result returns and at the reader's cost once it is read. A call that
got no result has no row, and is asked again next time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from counterfactory.manifests.paid.base import (
    MemoryJournal,
    PaidAnswer,
    PaidCall,
    PaidCallFailed,
    PaidJournal,
    Reader,
    SpendCap,
    backoff_delay,
    run_sync,
)

logger = logging.getLogger(__name__)


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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"{name}: concurrency must be at least 1, got {concurrency}")
        self.send, self.name = send, name
        self.concurrency, self.estimate_usd = concurrency, float(estimate_usd)
        self.max_retries, self.backoff_s, self.transient = max_retries, backoff_s, transient
        self._cap = SpendCap(spend_cap_usd, code=f"{name}_spend_cap_reached")
        self._in_flight = threading.BoundedSemaphore(concurrency)

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
        """
        journal = journal if journal is not None else MemoryJournal()
        unique: dict[str, PaidCall] = {}
        for call in calls:
            unique.setdefault(call.key, call)
        answers = await asyncio.gather(*(self._one(call, read, journal) for call in unique.values()))
        by_key = dict(zip(unique, answers, strict=True))
        return [by_key[call.key] for call in calls]

    async def _one(self, call: PaidCall, read: Reader, journal: PaidJournal) -> PaidAnswer:
        started = time.monotonic()
        tries = 0

        def answer(status: Any, **fields: Any) -> PaidAnswer:
            return PaidAnswer(
                call.key, status, seconds=round(time.monotonic() - started, 4), submit_tries=tries, **fields
            )

        saved = journal.load(call.key) or {}
        resumed = saved.get("state") == "completed" and isinstance(saved.get("result"), dict)
        try:
            if resumed:
                result, row = saved["result"], saved
            else:
                while not self._in_flight.acquire(blocking=False):  # polling keeps the wait cancellable
                    await asyncio.sleep(0.005)
                try:
                    arguments = await asyncio.to_thread(call.arguments)
                    with self._cap.reserve(journal, self.estimate_usd):
                        while True:
                            tries += 1
                            try:
                                result = await self.send(arguments)
                                break
                            except self.transient as exc:
                                if tries > self.max_retries:
                                    raise PaidCallFailed(
                                        "failed",
                                        f"{self.name}_unavailable: the request failed {tries} time(s), last "
                                        f"{type(exc).__name__}: {exc}",
                                    ) from None
                                await asyncio.sleep(backoff_delay(tries, self.backoff_s))
                        # committed the moment it returns, at the estimate until it is read: a
                        # re-run reads it back instead of paying again
                        row = {"state": "completed", "result": result, "saved_at": time.time()}
                        journal.save(call.key, row, cost_usd=self.estimate_usd)
                finally:
                    self._in_flight.release()
            reading = await read(call, result, None)
            if not resumed:
                journal.save(call.key, row, cost_usd=reading.cost_usd)
        except PaidCallFailed as failure:
            return answer(failure.status, reason=failure.reason, cost_usd=failure.cost_usd, resumed=resumed)
        except Exception as exc:  # a bug or a surprise must not sink the other calls
            logger.exception("%s request for %s failed", self.name, call.key)
            return answer("failed", reason=f"{self.name}_error: {type(exc).__name__}: {exc}", resumed=resumed)
        return answer("ok", value=reading.value, cost_usd=reading.cost_usd, resumed=resumed, metadata=reading.metadata)
