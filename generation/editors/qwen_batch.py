"""The GPU batch worker: one thread owns a loaded pipeline and feeds it batches.

Every ``QwenEditor.edit_many`` call, from any thread, hands its requests to the worker of the
loaded pipeline (:meth:`BatchWorker.submit`) and waits for their futures. The worker takes
requests from a bounded queue, gathers up to ``batch_size`` that can share one pipeline call
(same pipeline, same source size, same editor settings), runs the call, and resolves the
futures. So in a flow whose templates run on several threads, one template's alignment and
gates (CPU) run while the GPU denoises the next batch, and requests of different templates
fill one batch; the bounded queue makes a caller that is ahead wait instead of piling up
sources in memory. Requests keep their own seeded generators, so a request computes the same
image whichever batch it lands in, up to the float summation order a batch changes (at most
one grey level on a few pixels; :mod:`counterfactory.generation.editors.qwen`).

The worker knows nothing about diffusers: it runs ``run(key, payloads) -> results`` (one
result per payload, in order) and times it, which is what ``benchmarks/gpu_qwen.py`` reads to
report the share of a batch job the pipeline was busy.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

#: how long the worker waits for more requests to fill a batch once it has one: tiny next to a
#: diffusion call (seconds), long enough for other template threads to hand theirs over
DEFAULT_LINGER_S = 0.02


@dataclass
class BatchStats:
    """What the worker did since it started (or since :meth:`BatchWorker.reset_stats`).

    Attributes:
        batches: pipeline calls made.
        items: requests they served.
        busy_s: seconds inside ``run`` (the pipeline calls, with their pre- and post-processing).
        largest_batch: most requests served by one call.
        queue_high_water: most requests waiting in the queue at once (bounded by ``max_queue``).
        started: ``time.perf_counter()`` when counting started.
    """

    batches: int = 0
    items: int = 0
    busy_s: float = 0.0
    largest_batch: int = 0
    queue_high_water: int = 0
    started: float = field(default_factory=time.perf_counter)

    def busy_share(self, wall_s: float | None = None) -> float:
        """``busy_s`` over ``wall_s`` (default: seconds since counting started), in [0, 1]."""
        wall = wall_s if wall_s is not None else time.perf_counter() - self.started
        return min(1.0, self.busy_s / wall) if wall > 0 else 0.0


@dataclass
class _Item:
    key: Hashable
    max_batch: int
    #: requests handed over together (one caller's chunk); they stay in one batch
    payloads: list[Any]
    future: Future


_STOP = object()


class BatchWorker:
    """A thread that runs ``run(key, payloads)`` on batches of compatible submitted chunks.

    Args:
        run: called on the worker thread with a batch key and 1..``max_batch`` payloads that
            share it; returns one result per payload, in order. An exception fails every future
            of that batch.
        max_queue: chunks that may wait at once; :meth:`submit` blocks while it is full.
        linger_s: how long to wait for more items to fill a batch that is not full.
        name: the thread's name.
    """

    def __init__(
        self,
        run: Callable[[Hashable, list[Any]], Sequence[Any]],
        *,
        max_queue: int = 8,
        linger_s: float = DEFAULT_LINGER_S,
        name: str = "batch-worker",
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self._run = run
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._max_queue = max_queue
        self._linger_s = linger_s
        self._held: list[_Item] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.stats = BatchStats()

    # -- callers -------------------------------------------------------------------------

    def submit(self, key: Hashable, payloads: Sequence[Any], *, max_batch: int = 1) -> Future:
        """Queue a chunk of 1..``max_batch`` payloads that run in one batch; its future resolves
        to their results, in order. Blocks while the queue is full.

        Chunks share a batch only when their ``key`` and ``max_batch`` are equal and their
        sizes fit in ``max_batch`` together; a chunk is never split, so one caller handing
        over full chunks gets exactly those batches, whoever else is submitting.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if not 1 <= len(payloads) <= max_batch:
            raise ValueError(f"a chunk holds 1..{max_batch} payloads, got {len(payloads)}")
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch worker is closed")
        future: Future = Future()
        self._queue.put(_Item(key, max_batch, list(payloads), future))
        self.stats.queue_high_water = max(self.stats.queue_high_water, self._queue.qsize())
        return future

    def reset_stats(self) -> None:
        self.stats = BatchStats()

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ---------------------------------------------------------------

    def _next(self) -> _Item | object:
        if self._held:
            return self._held.pop(0)
        return self._queue.get()

    def _fill(self, batch: list[_Item]) -> bool:
        """Add compatible items to ``batch`` (held ones first, then the queue, waiting at most
        ``linger_s``); items that cannot join are held for later batches, in arrival order.
        Returns False once the stop marker was seen."""
        first = batch[0]

        def size() -> int:
            return sum(len(item.payloads) for item in batch)

        def fits(item: _Item) -> bool:
            return (
                item.key == first.key
                and item.max_batch == first.max_batch
                and size() + len(item.payloads) <= first.max_batch
            )

        for item in list(self._held):
            if size() >= first.max_batch:
                return True
            if fits(item):
                self._held.remove(item)
                batch.append(item)
        deadline = time.perf_counter() + self._linger_s
        while size() < first.max_batch and len(self._held) < self._max_queue:
            remaining = deadline - time.perf_counter()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            if fits(item):
                batch.append(item)
            else:
                self._held.append(item)
        return True

    def _loop(self) -> None:
        running = True
        while running or self._held:
            first = self._next()
            if first is _STOP:
                running = False
                continue
            batch = [first]
            running = self._fill(batch) and running
            live = [item for item in batch if item.future.set_running_or_notify_cancel()]
            if not live:
                continue
            payloads = [p for item in live for p in item.payloads]
            stats = self.stats  # a batch counts where it started, even if reset_stats() runs meanwhile
            start = time.perf_counter()
            try:
                results = list(self._run(first.key, payloads))
                if len(results) != len(payloads):
                    raise RuntimeError(f"the batch function returned {len(results)} results for {len(payloads)} items")
            except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch
                for item in live:
                    item.future.set_exception(exc)
                continue
            finally:
                stats.busy_s += time.perf_counter() - start
                stats.batches += 1
                stats.items += len(payloads)
                stats.largest_batch = max(stats.largest_batch, len(payloads))
            at = 0
            for item in live:
                item.future.set_result(results[at : at + len(item.payloads)])
                at += len(item.payloads)


__all__ = ["DEFAULT_LINGER_S", "BatchStats", "BatchWorker"]
