"""The interface of a paid request, whoever makes it and whatever service it goes to.

A caller (the ``fal`` editor, the VLM attribute gate, ``ask``'s answer backends) describes each
request as a :class:`PaidCall` (a journal key that hashes everything deciding the answer, and a
builder of its input) and hands a batch of them to a :class:`PaidClient` with a reader that turns
a finished request's result into a :class:`PaidReading`. The client returns one
:class:`PaidAnswer` per call, in order, whichever way it ended; only a batch that cannot start
(a missing dependency, a rejected key) raises :class:`~counterfactory.manifests.errors.SetupError`.

Every client keeps the same four promises:

- **bounded concurrency**: at most ``concurrency`` requests in flight per process;
- **a spend cap**: :class:`SpendCap` checks the journal's spend plus what is being sent right
  now before every new request, and refuses one that would pass the cap (``<client>_spend_cap_reached``);
- **retries of transport errors** with jittered exponential backoff (:func:`backoff_delay`);
  anything the service says is an answer, not a retry;
- **the journal**: a :class:`PaidJournal` row per key, written the moment a request is paid for
  (or, for a queue, submitted) and again when its result returns, so a process killed mid-batch
  resumes by reading or fetching, never by paying again. The ledger implements it on its
  database (:meth:`~counterfactory.manifests.ledger.Ledger.journal`); :class:`MemoryJournal`
  serves tests and one-off scripts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from counterfactory.manifests.errors import CounterfactoryError, SetupError

CallStatus = Literal["ok", "refused", "failed"]

#: the longest wait between two tries of one request, in seconds
BACKOFF_CAP_S = 30.0
#: the longest a request the cap would refuse waits for journal writes in progress, in seconds
LANDING_WAIT_S = 10.0


@runtime_checkable
class PaidJournal(Protocol):
    """Durable per-call notes of a paid service's client, keyed by the call's key.

    A client writes what it must not lose (a remote request id, a returned result) *before* it
    waits for or acts on the answer; ``cost_usd`` is what the row has cost so far (an estimate
    at submission, the billed figure once read), and ``spent_usd()`` their sum, which the spend
    cap reads.
    """

    def load(self, key: str) -> dict[str, Any] | None: ...

    def save(self, key: str, data: Mapping[str, Any], *, cost_usd: float = 0.0) -> None: ...

    def spent_usd(self) -> float: ...


class MemoryJournal:
    """An in-process :class:`PaidJournal` (tests, one-off scripts): no resume across processes."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[dict[str, Any], float]] = {}
        self._lock = threading.Lock()

    def load(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._rows.get(key)
            return dict(row[0]) if row else None

    def save(self, key: str, data: Mapping[str, Any], *, cost_usd: float = 0.0) -> None:
        with self._lock:
            self._rows[key] = (dict(data), float(cost_usd))

    def spent_usd(self) -> float:
        with self._lock:
            return sum(cost for _, cost in self._rows.values())


class PaidCallFailed(CounterfactoryError):
    """Ends one call early with a non-``ok`` answer; raised by readers, argument builders and
    the client itself (caught by the client, never shown to a user).

    Args:
        status: ``refused`` or ``failed``.
        reason: a reason code and the server's words, e.g. ``fal_nsfw: ...``.
        state: written to the journal when given; ``None`` leaves the row as it is, so a
            re-run can still fetch a request that may yet finish.
        cost_usd: USD the service billed for it anyway (e.g. a flagged image).
    """

    def __init__(self, status: CallStatus, reason: str, *, state: str | None = None, cost_usd: float = 0.0):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.state = state
        self.cost_usd = cost_usd


@dataclass(frozen=True)
class PaidCall:
    """One paid request.

    Attributes:
        key: the journal key; calls with the same key are one call (an attempt id, a
            question id). It must hash everything that decides the answer.
        arguments: builds the request's input (run in a worker thread, e.g. to encode an
            image); raises :class:`PaidCallFailed` for bad input.
    """

    key: str
    arguments: Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class PaidReading:
    """What a caller's reader made of a result: its value and the USD the call cost."""

    value: Any
    cost_usd: float
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PaidAnswer:
    """One call's end, whichever way it ended.

    Attributes:
        key: the call's key.
        status: ``ok`` (read), ``refused`` (a policy answer) or ``failed``.
        value: the reader's value for ``ok`` answers, else ``None``.
        reason: why it is not ``ok``.
        cost_usd: USD this call cost as far as is known (0 when nothing was billed).
        request_id: the service's id of the last request made or fetched, ``None`` when none was.
        endpoint: the endpoint it went to.
        seconds: wall time with its slot.
        resumed: fetched by a journaled request id instead of submitted anew.
        submit_tries: submissions made (a transport library's internal retries not counted).
        lost_request_ids: journaled ids the service no longer knew, or had cancelled without result.
        pending_request_id: a billed request whose result may still come: fetch it later,
            never replace it.
        cancelled: the service was asked to cancel it and accepted.
        metadata: the reader's extra fields.
    """

    key: str
    status: CallStatus
    value: Any = None
    reason: str | None = None
    cost_usd: float = 0.0
    request_id: str | None = None
    endpoint: str | None = None
    seconds: float = 0.0
    resumed: bool = False
    submit_tries: int = 0
    lost_request_ids: tuple[str, ...] = ()
    pending_request_id: str | None = None
    cancelled: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)


#: ``read(call, result_json, transfer)``: a finished request's result as a :class:`PaidReading`
#: (or :class:`PaidCallFailed`); ``transfer`` is what the client lends its readers (downloads).
Reader = Callable[[PaidCall, dict[str, Any], Any], Awaitable[PaidReading]]


@runtime_checkable
class PaidClient(Protocol):
    """What a paid caller talks to: prepare once, then batches of calls.

    ``run_many`` / ``arun_many`` return one :class:`PaidAnswer` per call, in order (calls
    sharing a key share one answer), with at most the client's ``concurrency`` in flight, its
    spend cap checked before every new request, transport errors retried and every paid
    result journaled in ``journal`` as it returns (an in-memory one when ``None``).
    """

    def prepare(self) -> None: ...

    def run_many(
        self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None
    ) -> list[PaidAnswer]: ...

    async def arun_many(
        self, calls: Sequence[PaidCall], read: Reader, journal: PaidJournal | None = None
    ) -> list[PaidAnswer]: ...


class SpendHold:
    """What one request holds against a :class:`SpendCap` while it is in flight: its estimate,
    then (``settle``) what its reader says it cost, until the journal row that records it lands."""

    def __init__(self, cap: SpendCap, price_usd: float) -> None:
        self._cap, self.usd = cap, price_usd

    def settle(self, cost_usd: float) -> None:
        """Hold ``cost_usd`` (the answer's real cost, once read) instead of the estimate, so a
        request sent before its journal row lands sees it (never less than nothing)."""
        cost = cost_usd if math.isfinite(cost_usd) and cost_usd > 0 else 0.0
        with self._cap._lock:
            self._cap._reserved_usd += cost - self.usd
            self.usd = cost

    @contextlib.contextmanager
    def landing(self) -> Iterator[None]:
        """Wraps the journal write that records this hold's cost: the hold ends the moment the
        write returns, on the writer's thread. While the write runs, the cost may already be
        in the journal's spend and is still held; a request checked then waits for the write
        instead of counting the cost twice (which refused requests below the cap)."""
        cap = self._cap
        with cap._lock:
            cap._landing += 1
        try:
            yield
        finally:
            with cap._lock:
                cap._landing -= 1
                cap._reserved_usd -= self.usd
                self.usd = 0.0
                cap._landed.notify_all()


class SpendCap:
    """A spend cap shared by every batch of one client, whatever thread or loop it runs in.

    A new request is refused when the spend so far (the journal's, plus what requests being
    sent or read hold: their estimate until read, their real cost until journaled) has reached
    the cap, or would pass it at the request's estimated price. With an estimate of 0, the
    requests paid beyond the cap are at most those in flight when it was reached: at most
    ``concurrency - 1`` more than the answer that reached it.

    Args:
        cap_usd: no new request once the journal's spend plus what is being sent would pass
            this many US dollars; ``None`` for no cap.
        code: the reason code of a refused request, e.g. ``fal_spend_cap_reached``.

    Raises:
        ValueError: a cap that is not a finite number >= 0.
    """

    def __init__(self, cap_usd: float | None, *, code: str = "spend_cap_reached") -> None:
        if cap_usd is not None and not (isinstance(cap_usd, (int, float)) and math.isfinite(cap_usd) and cap_usd >= 0):
            raise ValueError(f"{code}: a spend cap is a finite number of USD >= 0, got {cap_usd!r}")
        self.cap_usd = cap_usd
        self.code = code
        self._lock = threading.Lock()
        #: notified when a journal write of a held cost returns (:meth:`SpendHold.landing`)
        self._landed = threading.Condition(self._lock)
        self._landing = 0
        self._reserved_usd = 0.0

    @contextlib.contextmanager
    def reserve(self, journal: PaidJournal, price_usd: float) -> Iterator[SpendHold]:
        """Holds ``price_usd`` against the cap while one request is being sent; the journal
        row written inside the block (at the estimated price) takes it over. The hold it yields
        can be settled at the request's real cost once read.

        Raises:
            PaidCallFailed: ``<code>: ...`` when the cap is reached or the request would pass
                it; nothing is sent.
        """
        cap = self.cap_usd
        price_usd = price_usd if math.isfinite(price_usd) and price_usd > 0 else 0.0
        # Check and reserve under one lock: no call of this or another batch can slip in.
        with self._lock:
            deadline = time.monotonic() + LANDING_WAIT_S
            while True:
                committed = journal.spent_usd() + self._reserved_usd
                # a spend that is not a number (a journal row of NaN) counts as the cap reached
                over = cap is not None and (
                    not committed == committed or committed >= cap - 1e-9 or committed + price_usd > cap + 1e-9
                )
                # a cost being journaled may be counted twice (in the journal and in its hold):
                # a refusal waits for the writes in progress (one database write; they do not
                # need this thread) and checks again
                left = deadline - time.monotonic()
                if not (over and self._landing and left > 0):
                    break
                self._landed.wait(left)
            if over:
                raise PaidCallFailed(
                    "failed",
                    f"{self.code}: ${committed:.4f} spent or committed, ${price_usd:.4f} more "
                    f"would reach or exceed spend_cap_usd=${cap:.4f}; no new submissions",
                )
            self._reserved_usd += price_usd
        hold = SpendHold(self, price_usd)
        try:
            yield hold
        finally:
            with self._lock:
                self._reserved_usd -= hold.usd


def backoff_delay(failures: int, first_s: float, cap_s: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before try ``failures + 1``: ``first_s`` doubled per failure, capped at
    ``cap_s`` and jittered by +-50 %, so the retries of one batch do not arrive together."""
    return min(first_s * 2 ** (failures - 1), cap_s) * random.uniform(0.5, 1.5)


def run_sync(coroutine: Any) -> Any:
    """Runs a coroutine to completion from sync code, even when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def reraise_setup_error(errors: BaseExceptionGroup) -> None:
    """Raise the first :class:`~counterfactory.manifests.errors.SetupError` inside a task
    group's errors as itself (a missing key or package is one ``error:`` line, not a group of
    tracebacks); return when there is none, for the caller to re-raise the group."""
    setup = errors.subgroup(SetupError)
    if setup is not None:
        leaf: BaseException = setup
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None


#: what looks like a credential in a message: an Authorization-like header's value, a bearer or
#: basic token, an OpenAI-style ``sk-`` key, a fal ``key_id:key_secret``, a URL's ``user:password@``
#: and a key-like query parameter's value
_CREDENTIALS = [
    (
        re.compile(
            r"(?i)((?:proxy-)?authorization|x-api-key|api-key|x-goog-api-key|cookie)"
            r"""(["']?\s*[:=]\s*["']?)[^"'\r\n,}]+"""
        ),
        r"\1\2[redacted]",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    (re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_-]{8,}"), "[redacted]"),
    (re.compile(r"\b[0-9a-fA-F-]{32,36}:[0-9a-fA-F]{24,}\b"), "[redacted]"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@"), r"\1[redacted]@"),
    (
        re.compile(r"(?i)([?&](?:api[_-]?key|key|token|access_token|secret|password|sig|signature)=)[^&\s\"']+"),
        r"\1[redacted]",
    ),
]


def redact(text: str, secrets: Sequence[str | None] = ()) -> str:
    """``text`` with anything that looks like a credential replaced by ``[redacted]`` (see
    :data:`_CREDENTIALS`), and each of ``secrets`` (a configured key, of 4 characters or more)
    wherever it appears: what an error body or exception message may echo before it is printed
    or stored."""
    out = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, "[redacted]")
    for pattern, replacement in _CREDENTIALS:
        out = pattern.sub(replacement, out)
    return out
