"""``counterfactory ask RELEASE --model M --backend B``: every trial (or a protocol's) asked of a
model, one answer per trial x model x sample, in the answers ledger beside the release.

Each question (trial x sample) is one :class:`~counterfactory.manifests.paid.PaidCall` keyed by
its answer id, sent by the paid-request client its backend names
(:mod:`counterfactory.manifests.paid`: the ``openai`` backend's ``DirectClient``, the ``fal``
backend's ``FalQueue``), with the answers ledger as that client's journal
(:class:`LedgerJournal`). So, as the editors do: an answer's id hashes the trial, the model
lineage and the decoding settings (:func:`~counterfactory.validation.scoring.answers.answer_id`),
and a re-run asks only what the ledger lacks; each answer is committed the moment it returns
(the ``openai`` client writes on a writer thread, off the event loop), so SIGKILL loses only
requests in flight, and a fal request in flight is fetched by its journaled request id on
resume, not paid twice; at most ``concurrency`` requests are in flight; transport errors are
retried with backoff; a spend cap refuses a new request once the model's answers, plus what is
in flight at its estimated price, would pass it; refusals are answers like any other reply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.paid import PaidAnswer, PaidCall, PaidReading, run_sync
from counterfactory.manifests.registry import ANSWER_BACKENDS
from counterfactory.manifests.release_folder import MAX_IMAGE_BYTES, RELEASE_JSON, TRIALS, ReleaseFolder
from counterfactory.manifests.safefiles import read_regular
from counterfactory.validation.scoring.answers import AnswersLedger, answer_id, ledger_path


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


@dataclass(frozen=True)
class Question:
    """One request of an ``ask`` or ``judge`` run.

    Attributes:
        key: its answer (or judgement) id: the paid call's key.
        name: what a message calls it (the trial id).
        prompt: the text asked.
        image_paths: the image files sent with it, in order.
        decoding: the decoding settings.
        sample: the sample index.
        row: the answer's (or judgement's) fields other than the reply's.
    """

    key: str
    name: str
    prompt: str
    image_paths: tuple[Path, ...]
    decoding: Mapping[str, Any]
    sample: int
    row: Mapping[str, Any]


#: ``commit(question, reply_fields, seconds, settles)``: writes one answer (or judgement) row now,
#: dropping the journaled request ``settles`` in the same transaction
Commit = Callable[[Question, dict[str, Any], float, "str | None"], None]


class LedgerJournal:
    """The answers ledger as the :class:`~counterfactory.manifests.paid.PaidJournal` of one run.

    A call's row that says its result was read (``completed``, with the reader's fields for it)
    commits the answer itself, and a row fal wrote for a content-policy block (``refused``)
    commits an answer with no reply (``finish_reason`` ``content_filter``, as OpenAI reports a
    filtered completion): either way the answer is in the ledger the moment it returns. Any
    other row (a fal request id journaled before the wait) goes to the ledger's ``requests``
    table until its answer settles it. ``spent_usd`` (what the spend cap reads) is this run's
    model's answers before the run, the answers since and the journaled requests not yet
    answered, kept in memory so the cap's check costs no query.
    """

    def __init__(
        self,
        store: AnswersLedger,
        questions: Sequence[Question],
        commit: Commit,
        *,
        spent_before: float,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        self.store, self.commit, self.on_answer = store, commit, on_answer
        self.questions = {q.key: q for q in questions}
        self._requests = store.requests(self.questions)
        self._costs = {k: cost for k, (_, cost) in self._requests.items()}
        self.answers_usd = float(spent_before)
        self.answered = 0
        self._lock = threading.Lock()
        #: key -> the reader's reply fields, until the client's journal row commits them
        self.read: dict[str, dict[str, Any]] = {}
        #: key -> when its request was built (the answer's ``seconds``)
        self.started: dict[str, float] = {}

    def load(self, key: str) -> dict[str, Any] | None:
        found = self._requests.get(key)
        return dict(found[0]) if found else None

    def save(self, key: str, data: Mapping[str, Any], *, cost_usd: float = 0.0) -> None:
        state = data.get("state")
        got = self.read.pop(key, None) if state == "completed" else None
        if got is None and state == "refused":
            got = {"reply": None, "finish_reason": "content_filter", "refusal_reason": data.get("reason")}
        if got is None:
            self.store.save_request(key, dict(data), cost_usd)
            with self._lock:
                self._requests[key] = (dict(data), float(cost_usd))
                self._costs[key] = float(cost_usd)
            return
        settles = key if key in self._requests else None
        seconds = time.monotonic() - self.started.pop(key, time.monotonic())
        self.commit(self.questions[key], {**got, "cost_usd": float(cost_usd)}, round(seconds, 4), settles)
        with self._lock:
            self._requests.pop(key, None)
            self._costs.pop(key, None)
            self.answers_usd += float(cost_usd)
            self.answered += 1
        if self.on_answer is not None:
            self.on_answer()

    def spent_usd(self) -> float:
        with self._lock:
            return self.answers_usd + sum(self._costs.values())


def answer_backend(name: str, options: Mapping[str, Any]) -> Any:
    """The registered answer backend ``name`` built from ``options``.

    Raises:
        AskError: an unknown backend, or options it does not take.
    """
    if name not in ANSWER_BACKENDS:
        raise AskError(f"--backend {name}: one of {', '.join(ANSWER_BACKENDS.names())}")
    plugin = ANSWER_BACKENDS.get(name)
    try:
        parsed = plugin.options.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise AskError(f"--backend {name}: {problems}; fix the --backend-option named") from None
    return plugin.factory(parsed)


def _read_images(question: Question) -> list[tuple[bytes, str]]:
    # the paths ReleaseFolder.image kept inside the release; read as regular, single-link,
    # bounded files again on the open descriptor (a file swapped since is refused, never sent)
    return [(read_regular(p, MAX_IMAGE_BYTES, single_link=True), p.suffix) for p in question.image_paths]


def ask_questions(
    backend: Any,
    questions: Sequence[Question],
    store: AnswersLedger,
    commit: Commit,
    summary: AskSummary,
    *,
    concurrency: int,
    retries: int,
    max_spend: float | None,
    spent_before: float,
    on_answer: Callable[[int, int], None] | None = None,
) -> None:
    """Send ``questions`` through ``backend``'s paid client with the answers ledger as its
    journal, each answer committed by ``commit`` as it returns; fills ``summary``."""
    start = time.monotonic()
    journal = LedgerJournal(
        store,
        questions,
        commit,
        spent_before=spent_before,
        on_answer=None if on_answer is None else lambda: on_answer(journal.answered, len(questions)),
    )
    client = backend.client(concurrency=concurrency, spend_cap_usd=max_spend, max_retries=retries)

    def arguments(question: Question) -> dict[str, Any]:
        journal.started[question.key] = time.monotonic()
        # a backend that seeds its own sampling (transformers) takes the answer id: two trials
        # asking the same prompt of the same image (a noise repeat) must not draw the same sample
        extra = {"answer_id": question.key} if getattr(backend, "takes_answer_id", False) else {}
        return backend.arguments(
            question.prompt, _read_images(question), dict(question.decoding), question.sample, **extra
        )

    async def read(call: PaidCall, result: dict[str, Any], transfer: Any) -> PaidReading:
        got = backend.read(result)
        journal.read[call.key] = got
        return PaidReading(got, float(got.get("cost_usd") or 0.0))

    calls = [PaidCall(q.key, lambda q=q: arguments(q)) for q in questions]

    async def run() -> list[PaidAnswer]:
        try:
            return await client.arun_many(calls, read, journal) if calls else []
        finally:
            await backend.aclose()

    answers = run_sync(run())
    names = {q.key: q.name for q in questions}
    for a in answers:
        summary.retries += max(a.submit_tries - 1, 0)
        if a.status != "failed":
            continue
        if a.reason and "_spend_cap_reached:" in a.reason:
            summary.stopped_at_cap = True
        else:
            summary.failed += 1
            summary.errors.append(f"{names[a.key]}: {a.reason}")
    summary.asked += journal.answered
    summary.spent_usd = journal.answers_usd
    summary.seconds = time.monotonic() - start


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
    # every image path a trial names is checked before anything is asked (ReleaseFolder)
    folder = ReleaseFolder(release, need=(RELEASE_JSON, TRIALS))
    trials = folder.trials()
    known_protocols = sorted({t["protocol"] for t in trials})
    for p in protocols:
        if p not in known_protocols:
            raise AskError(f"--protocol {p}: this release's trials have {', '.join(known_protocols)}")
    if backend not in ANSWER_BACKENDS:
        raise AskError(f"--backend {backend}: one of {', '.join(ANSWER_BACKENDS.names())}")
    if concurrency < 1 or samples < 1:
        raise AskError("--concurrency and --samples must be at least 1")
    client = answer_backend(backend, options)
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
                continue
            paths = t.get("image_paths")
            if t["images"] and not paths:
                store.close()
                raise AskError(
                    f"trial {t['trial_id']} names images but not their paths in the release; "
                    "publish the release again with this version of counterfactory"
                )
            row = {
                "answer_id": aid,
                "trial_id": t["trial_id"],
                "prompt_sha256": t["prompt_sha256"],
                "protocol": t["protocol"],
                "model": model,
                "backend": backend,
                "lineage": lineage,
                "decoding": decoding,
                "sample": s,
            }
            images = tuple(folder.image(rel, f"{folder.file(TRIALS)} (trial {t['trial_id']})") for rel in paths or [])
            todo.append(Question(aid, t["trial_id"], t["prompt"], images, decoding, s, row))

    def commit(question: Question, got: dict[str, Any], seconds: float, settles: str | None) -> None:
        fields = {k: got.get(k) for k in ("reply", "finish_reason", "tokens_in", "tokens_out")}
        store.commit_answer(
            {**question.row, **fields, "cost_usd": got["cost_usd"], "seconds": seconds}, settles=settles
        )

    try:
        ask_questions(
            client,
            todo,
            store,
            commit,
            summary,
            concurrency=concurrency,
            retries=retries,
            max_spend=max_spend,
            spent_before=store.spent_usd(model),
            on_answer=on_answer,
        )
    finally:
        store.close()
    return summary
