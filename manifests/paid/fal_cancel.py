"""The fal requests this process has submitted and not collected, and cancelling them when it
stops (:func:`cancel_open_requests`, called by the command line's SIGINT/SIGTERM handler).

fal bills a request that runs whether or not anybody collects its result, so a process that
stops cancels its open requests at fal (``PUT .../requests/<id>/cancel``) and journals each one
fal accepted to cancel as ``cancelled``; the next run fetches the rest by their journalled ids.
:class:`~counterfactory.manifests.paid.fal.FalQueue` tracks a request here from its submission
until fal says it ended.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from counterfactory.manifests.paid.base import PaidJournal

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenRequest:
    """A request fal accepted that this process has not collected: what cancelling it takes."""

    key: str
    endpoint: str
    request_id: str
    api_key: str
    journal: PaidJournal
    estimate_usd: float


_OPEN: dict[str, OpenRequest] = {}
_OPEN_LOCK = threading.Lock()


def track(entry: OpenRequest) -> None:
    """Note a request fal accepted: a stop from now on cancels it."""
    with _OPEN_LOCK:
        _OPEN[entry.request_id] = entry


def untrack(request_id: str) -> None:
    """Forget a request fal said ended (or that was cancelled): nothing left for a stop to cancel."""
    with _OPEN_LOCK:
        _OPEN.pop(request_id, None)


def open_requests() -> list[str]:
    """Ids of the requests this process has submitted and not yet collected."""
    with _OPEN_LOCK:
        return list(_OPEN)


def cancel_open_requests(timeout_s: float = 3.0) -> list[str]:
    """Cancels, at fal, every request this process has submitted and not collected, and
    journals each one fal accepted to cancel as ``cancelled``; returns their ids.

    For a process about to exit (the command line's SIGINT/SIGTERM handler): synchronous,
    safe to call from a signal handler, and bounded by ``timeout_s`` seconds in all, as the
    work runs in its own threads and is left behind when the time is up (a request whose
    cancel did not get through stays ``submitted``, and the next run fetches it).
    """
    with _OPEN_LOCK:
        entries = list(_OPEN.values())
    if not entries:
        return []
    done: list[str] = []

    def cancel_all() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(entries))) as pool:
            for request_id in pool.map(lambda e: _cancel_now(e, timeout_s), entries):
                if request_id is not None:
                    done.append(request_id)

    worker = threading.Thread(target=cancel_all, name="fal-cancel", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return list(done)


def _cancel_now(entry: OpenRequest, timeout_s: float) -> str | None:
    """One ``PUT .../cancel`` without retries; the request id when fal accepted it."""
    import fal_client
    import httpx

    handle = fal_client.client.SyncRequestHandle.from_request_id(None, entry.endpoint, entry.request_id)  # type: ignore[arg-type]
    try:
        response = httpx.put(handle.cancel_url, headers={"Authorization": f"Key {entry.api_key}"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        logger.warning("fal: could not cancel request %s (%s)", entry.request_id, exc)
        return None
    if response.status_code >= 300:  # 400 ALREADY_COMPLETED: the next run fetches the result
        return None
    row = {
        "request_id": entry.request_id,
        "endpoint": entry.endpoint,
        "state": "cancelled",
        "saved_at": time.time(),
        "cancelled_because": "process_stopped",
    }
    with contextlib.suppress(Exception):  # the journal may be mid-write in a stopped thread
        entry.journal.save(entry.key, row, cost_usd=entry.estimate_usd)
    with _OPEN_LOCK:
        _OPEN.pop(entry.request_id, None)
    return entry.request_id
