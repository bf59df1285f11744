"""``counterfactory ask RELEASE --model M --backend B``: every trial (or a protocol's) asked of a
model, one answer per trial x model x sample, in the answers ledger beside the release.

As the editors do: an answer's id hashes the trial, the model lineage and the decoding settings
(:func:`~counterfactory.validation.scoring.answers.answer_id`), so a re-run asks only what the
ledger lacks; each answer is committed the moment it returns, so SIGKILL loses only requests in
flight; at most ``concurrency`` requests are in flight (that many workers, each one request at a
time); transport errors are retried with backoff; a spend cap stops new requests once the
model's answers have cost that much; refusals are answers like any other reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.registry import ANSWER_BACKENDS
from counterfactory.validation.scoring.answers import AnswersLedger, answer_id, ledger_path
from counterfactory.validation.scoring.backends import TransportError
from counterfactory.validation.scoring.score import load_release


class AskError(CounterfactoryError, ValueError):
    """``ask`` cannot start: an unknown protocol or backend, a trial without its images."""


@dataclass
class AskSummary:
    """What one ``ask`` run did."""

    trials: int = 0
    wanted: int = 0
    already: int = 0
    asked: int = 0
    failed: int = 0
    retries: int = 0
    spent_usd: float = 0.0
    stopped_at_cap: bool = False
    seconds: float = 0.0
    ledger: str = ""
    errors: list[str] = field(default_factory=list)


def _images(release: Path, trial: dict[str, Any]) -> list[tuple[bytes, str]]:
    paths = trial.get("image_paths")
    if trial["images"] and not paths:
        raise AskError(f"trial {trial['trial_id']} names images but not their paths in the release")
    out = []
    for rel in paths or []:
        p = release / rel
        out.append((p.read_bytes(), p.suffix))
    return out


def ask(
    release: Path,
    *,
    backend: str,
    options: dict[str, Any],
    protocols: Sequence[str] = (),
    samples: int = 1,
    concurrency: int = 4,
    max_spend: float | None = None,
    retries: int = 4,
    ledger: Path | None = None,
    on_answer: Callable[[int, int], None] | None = None,
) -> AskSummary:
    """Ask the model every wanted trial x sample the ledger does not hold yet; returns a summary."""
    release = Path(release)
    _, trials = load_release(release)
    known_protocols = sorted({t["protocol"] for t in trials})
    for p in protocols:
        if p not in known_protocols:
            raise AskError(f"--protocol {p}: this release's trials have {', '.join(known_protocols)}")
    if backend not in ANSWER_BACKENDS:
        raise AskError(f"--backend {backend}: one of {', '.join(ANSWER_BACKENDS.names())}")
    if concurrency < 1 or samples < 1:
        raise AskError("--concurrency and --samples must be at least 1")
    plugin = ANSWER_BACKENDS.get(backend)
    client = plugin.factory(plugin.options.model_validate(options))
    lineage = client.lineage()
    model = str(lineage.get("model"))
    wanted = [t for t in trials if not protocols or t["protocol"] in protocols]
    store = AnswersLedger(ledger or ledger_path(release))
    summary = AskSummary(trials=len(wanted), wanted=len(wanted) * samples, ledger=str(store.path))
    known = store.known()
    todo = []
    for t in wanted:
        decoding = dict(t.get("decoding") or {})
        for s in range(samples):
            aid = answer_id(t, lineage, decoding, s)
            if aid in known:
                summary.already += 1
            else:
                todo.append((aid, t, decoding, s))

    def request(item: tuple[str, dict[str, Any], dict[str, Any], int]) -> tuple[str, list, dict[str, Any], int]:
        _, t, decoding, s = item
        return t["prompt"], _images(release, t), decoding, s

    def commit(item: tuple[str, dict[str, Any], dict[str, Any], int], got: dict[str, Any], seconds: float) -> None:
        aid, t, decoding, s = item
        store.add(
            {
                "answer_id": aid,
                "trial_id": t["trial_id"],
                "prompt_sha256": t["prompt_sha256"],
                "protocol": t["protocol"],
                "model": model,
                "backend": backend,
                "lineage": lineage,
                "decoding": decoding,
                "sample": s,
                "reply": got.get("reply"),
                "finish_reason": got.get("finish_reason"),
                "tokens_in": got.get("tokens_in"),
                "tokens_out": got.get("tokens_out"),
                "cost_usd": float(got.get("cost_usd") or 0.0),
                "seconds": seconds,
            }
        )
        if on_answer is not None:
            on_answer(summary.asked, len(todo))

    try:
        run_requests(
            client,
            todo,
            request,
            commit,
            summary,
            concurrency=concurrency,
            retries=retries,
            max_spend=max_spend,
            spent=store.spent_usd(model),
            name=lambda item: item[1]["trial_id"],
        )
    finally:
        store.close()
    return summary


def run_requests(
    client: Any,
    items: Sequence[Any],
    request: Callable[[Any], tuple[str, list, dict[str, Any], int]],
    commit: Callable[[Any, dict[str, Any], float], None],
    summary: AskSummary,
    *,
    concurrency: int,
    retries: int,
    max_spend: float | None,
    spent: float,
    name: Callable[[Any], str],
) -> None:
    """Send ``items`` with ``concurrency`` workers (so never more in flight), each request built by
    ``request(item)`` as ``(prompt, images, decoding, sample)`` and committed by ``commit(item,
    reply, seconds)`` the moment it returns; transport errors retried with backoff; no new request
    once ``spent`` (plus what these cost) reaches ``max_spend``. Fills ``summary``.

    The commits run on one writer thread, one after another, and a worker waits for its own
    before taking the next item: the event loop keeps sending and reading while SQLite writes
    (a fixed-latency server returns a whole wave of answers at once, and committing them on the
    loop delayed the wave's next requests by the sum of their commits)."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="answers-writer")

    async def run() -> None:
        nonlocal spent
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)

        async def worker() -> None:
            nonlocal spent
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if max_spend is not None and spent >= max_spend:
                    summary.stopped_at_cap = True
                    return
                prompt, images, decoding, sample = request(item)
                for attempt in range(retries + 1):
                    began = time.monotonic()
                    try:
                        got = await client.answer(prompt, images, decoding, sample)
                    except TransportError as exc:
                        if attempt == retries:
                            summary.failed += 1
                            summary.errors.append(f"{name(item)}: {exc}")
                            break
                        summary.retries += 1
                        await asyncio.sleep(min(0.1 * 2**attempt, 5.0))
                        continue
                    spent += float(got.get("cost_usd") or 0.0)
                    summary.asked += 1
                    await loop.run_in_executor(writer, commit, item, got, time.monotonic() - began)
                    break

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    finally:
        writer.shutdown(wait=True)
    summary.spent_usd = spent
    summary.seconds = time.monotonic() - start
