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

Nothing a server sends is trusted: a reply the backend cannot read as an answer (a shape it does
not know, token counts that are not counts, a body over its bound) is an error row for that
answer (:func:`checked_reply`: paid for once, never asked again, not scored). The questions are
built lazily, a chunk at a time, so ``--samples`` (at most :data:`MAX_SAMPLES`) of a large bank
sends its first request at once; the ledger must lie outside the sealed release.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.paid import PaidAnswer, PaidCall, PaidReading, redact, run_sync
from counterfactory.manifests.release_folder import MAX_IMAGE_BYTES, RELEASE_JSON, TRIALS, ReleaseFolder
from counterfactory.manifests.safefiles import read_regular
from counterfactory.manifests.vocabulary import FAILED, REFUSED
from counterfactory.validation.scoring.answers import AnswersLedger, answer_id, check_ledger_place, ledger_path
from counterfactory.validation.scoring.backends import MAX_REPLY_BYTES, ReplyError, token_count
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS

#: the most answers ``ask --samples`` asks of one trial
MAX_SAMPLES = 10_000
#: questions handed to the paid client at a time (at least, and per request slot): the rest are
#: not built until these are done, so ``--samples 10000`` of a large bank starts at once
CHUNK_QUESTIONS = 1024


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
    invalid: int = 0
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
        questions: Iterable[Question],
        commit: Commit,
        *,
        spent_before: float,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        self.store, self.commit, self.on_answer = store, commit, on_answer
        self.questions = {q.key: q for q in questions}
        # every journaled request not yet answered (the questions come in chunks: a request of
        # a later chunk's question is committed spend all the same)
        self._requests = store.requests()
        self._costs = {k: _usd(cost) for k, (_, cost) in self._requests.items()}
        self.answers_usd = _usd(spent_before)
        self.answered = 0
        #: (name, why) of each reply recorded as an error row
        self.invalid: list[tuple[str, str]] = []
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
        if got is None and state == REFUSED:
            got = {"reply": None, "finish_reason": "content_filter", "refusal_reason": data.get("reason")}
        cost_usd = _usd(cost_usd)
        if got is None:
            self.store.save_request(key, dict(data), cost_usd)
            with self._lock:
                self._requests[key] = (dict(data), cost_usd)
                self._costs[key] = cost_usd
            return
        settles = key if key in self._requests else None
        seconds = time.monotonic() - self.started.pop(key, time.monotonic())
        question = self.questions[key]
        self.commit(question, {**got, "cost_usd": cost_usd}, round(seconds, 4), settles)
        with self._lock:
            self._requests.pop(key, None)
            self._costs.pop(key, None)
            self.answers_usd += cost_usd
            self.answered += 1
            if got.get("error"):
                self.invalid.append((question.name, str(got["error"])))
        if self.on_answer is not None:
            self.on_answer()

    def spent_usd(self) -> float:
        with self._lock:
            return self.answers_usd + sum(self._costs.values())


def _usd(value: Any) -> float:
    """A spend as a USD amount the cap can add: a negative or NaN one counts as nothing (a
    ledger never holds a negative spend; an infinite one stops the cap, as it should)."""
    try:
        usd = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return usd if usd > 0 else 0.0  # NaN > 0 is False


def check_amounts(amounts: Mapping[str, float | None]) -> None:
    """Each of ``amounts`` (option -> USD, ``None`` when not given) a finite number >= 0.

    Raises:
        AskError: the first that is NaN, an infinity or negative, naming its option.
    """
    for flag, usd in amounts.items():
        if usd is not None and not (isinstance(usd, (int, float)) and math.isfinite(usd) and usd >= 0):
            raise AskError(f"{flag} {usd}: not a finite number of USD >= 0; give an amount such as {flag} 5")


def check_max_spend(max_spend: float | None) -> float | None:
    """``--max-spend`` when it is a finite number of USD >= 0.

    Raises:
        AskError: NaN, an infinity or a negative amount.
    """
    if max_spend is None:
        return None
    if isinstance(max_spend, bool) or not isinstance(max_spend, (int, float)) or not math.isfinite(max_spend):
        raise AskError(f"--max-spend {max_spend}: not a finite number of USD; give an amount >= 0, e.g. --max-spend 5")
    if max_spend < 0:
        raise AskError(f"--max-spend {max_spend}: a negative cap; give an amount >= 0, e.g. --max-spend 5")
    return float(max_spend)


def checked_reply(got: Any, max_bytes: int = MAX_REPLY_BYTES) -> dict[str, Any]:
    """A backend's reading of one reply, as an answer's fields, whatever backend made it.

    Raises:
        ReplyError: not a mapping, a reply that is not text or is over ``max_bytes``, a finish
            reason that is not a short string, token counts that are not counts, or a cost that
            is not a finite USD amount >= 0.
    """
    if not isinstance(got, Mapping):
        raise ReplyError(f"the backend read the reply as a {type(got).__name__}, not an answer")
    reply = got.get("reply")
    if reply is not None and not isinstance(reply, str):
        raise ReplyError(f"the reply is a {type(reply).__name__}, not text")
    if reply is not None and len(reply.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ReplyError(f"the reply's text is over {max_bytes:,} bytes")
    finish = got.get("finish_reason")
    if finish is not None and not (isinstance(finish, str) and len(finish) <= 64):
        raise ReplyError("the finish reason is not a short string")
    cost = got.get("cost_usd")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        raise ReplyError(f"the reply's cost {cost!r} is not a USD amount >= 0")
    return {
        **got,
        "reply": reply,
        "finish_reason": finish,
        "tokens_in": token_count(got.get("tokens_in"), "tokens_in"),
        "tokens_out": token_count(got.get("tokens_out"), "tokens_out"),
        "cost_usd": float(cost),
    }


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
    questions: Iterable[Question],
    store: AnswersLedger,
    commit: Commit,
    summary: AskSummary,
    *,
    concurrency: int,
    retries: int,
    max_spend: float | None,
    spent_before: float,
    on_answer: Callable[[int, int], None] | None = None,
    total: int | None = None,
) -> None:
    """Send ``questions`` through ``backend``'s paid client with the answers ledger as its
    journal, each answer committed by ``commit`` as it returns; fills ``summary``.

    ``questions`` is read lazily, a chunk at a time (:data:`CHUNK_QUESTIONS`, or 64 per request
    slot when more): the first requests go out before the rest are built, and at most a chunk
    of them is in memory. Once the spend cap refuses a question no further chunk is built. A
    reply the backend cannot read, or whose reading is not an answer (:func:`checked_reply`),
    is committed as an error row for that answer (no reply, ``finish_reason`` ``error``, the
    reason in ``error``, the estimated cost): paid for once, never asked again.
    ``total``: the number of questions, for ``on_answer`` (the answers so far, the total)."""
    start = time.monotonic()
    journal = LedgerJournal(
        store,
        (),
        commit,
        spent_before=spent_before,
        on_answer=None if on_answer is None else lambda: on_answer(journal.answered, total or 0),
    )
    client = backend.client(concurrency=concurrency, spend_cap_usd=max_spend, max_retries=retries)
    options = getattr(backend, "options", None)
    estimate = _usd(getattr(options, "estimated_usd_per_question", 0.0))
    max_bytes = int(getattr(options, "max_reply_bytes", MAX_REPLY_BYTES) or MAX_REPLY_BYTES)
    secrets = tuple(getattr(backend, "secrets", ()) or ())

    def arguments(question: Question) -> dict[str, Any]:
        journal.started[question.key] = time.monotonic()
        # a backend that seeds its own sampling (transformers) takes the answer id: two trials
        # asking the same prompt of the same image (a noise repeat) must not draw the same sample
        extra = {"answer_id": question.key} if getattr(backend, "takes_answer_id", False) else {}
        return backend.arguments(
            question.prompt, _read_images(question), dict(question.decoding), question.sample, **extra
        )

    async def read(call: PaidCall, result: dict[str, Any], transfer: Any) -> PaidReading:
        try:
            got = checked_reply(backend.read(result), max_bytes)
        except (ReplyError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            why = exc if isinstance(exc, ReplyError) else f"the reply could not be read ({type(exc).__name__}: {exc})"
            got = {
                "reply": None,
                "finish_reason": "error",
                "tokens_in": None,
                "tokens_out": None,
                "cost_usd": estimate,
                "error": redact(str(why), secrets)[:500],
            }
        journal.read[call.key] = got
        return PaidReading(got, got["cost_usd"])

    size = max(CHUNK_QUESTIONS, 64 * concurrency)
    pending = iter(questions)

    async def run() -> None:
        try:
            while chunk := list(itertools.islice(pending, size)):
                journal.questions = {q.key: q for q in chunk}
                calls = [PaidCall(q.key, lambda q=q: arguments(q)) for q in chunk]
                got = await client.arun_many(calls, read, journal)
                _tally(got, {q.key: q.name for q in chunk}, summary, secrets)
                if summary.stopped_at_cap:
                    break
        finally:
            await backend.aclose()

    run_sync(run())
    summary.asked += journal.answered - len(journal.invalid)
    summary.invalid += len(journal.invalid)
    summary.errors += [f"{name}: {why}" for name, why in journal.invalid]
    summary.spent_usd = journal.answers_usd
    summary.seconds = time.monotonic() - start


def _tally(
    answers: Sequence[PaidAnswer], names: Mapping[str, str], summary: AskSummary, secrets: Sequence[str]
) -> None:
    """The retries, the failures (their reasons redacted, whichever client wrote them) and the
    cap's refusals of one chunk's answers, into ``summary``."""
    for a in answers:
        summary.retries += max(a.submit_tries - 1, 0)
        if a.status != FAILED:
            continue
        if a.reason and "_spend_cap_reached:" in a.reason:
            summary.stopped_at_cap = True
        else:
            summary.failed += 1
            summary.errors.append(redact(f"{names[a.key]}: {a.reason}", secrets))


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
    """Ask the model every wanted trial x sample the ledger does not hold yet; returns a summary.

    Raises:
        AskError: an unknown protocol or backend, ``samples`` outside 1..:data:`MAX_SAMPLES`,
            a ``max_spend`` that is not a finite amount >= 0, a ledger inside the release
            folder, a trial without its images.
    """
    release = Path(release)
    max_spend = check_max_spend(max_spend)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise AskError(
            f"--samples {samples}: ask at most {MAX_SAMPLES:,} answers per trial (at least 1); "
            "a noise estimate needs a handful"
        )
    if concurrency < 1:
        raise AskError("--concurrency and --samples must be at least 1")
    store_path = check_ledger_place(release, ledger or ledger_path(release))
    # every image path a trial names is checked before anything is asked (ReleaseFolder)
    folder = ReleaseFolder(release, need=(RELEASE_JSON, TRIALS))
    trials = folder.trials()
    known_protocols = sorted({t["protocol"] for t in trials})
    for p in protocols:
        if p not in known_protocols:
            raise AskError(f"--protocol {p}: this release's trials have {', '.join(known_protocols)}")
    if backend not in ANSWER_BACKENDS:
        raise AskError(f"--backend {backend}: one of {', '.join(ANSWER_BACKENDS.names())}")
    wanted = [t for t in trials if not protocols or t["protocol"] in protocols]
    for t in wanted:
        if t["images"] and not t.get("image_paths"):
            raise AskError(
                f"trial {t['trial_id']} names images but not their paths in the release; "
                "publish the release again with this version of counterfactory"
            )
    client = answer_backend(backend, options)
    lineage = client.lineage()
    model = str(lineage.get("model"))
    store = AnswersLedger(store_path)
    summary = AskSummary(trials=len(wanted), wanted=len(wanted) * samples, ledger=str(store.path))
    known = store.known()

    def todo() -> Iterator[Question]:
        """The questions the ledger lacks, built one at a time as the client takes them."""
        for t in wanted:
            decoding = dict(t.get("decoding") or {})
            where = f"{folder.file(TRIALS)} (trial {t['trial_id']})"
            images = tuple(folder.image(rel, where) for rel in t.get("image_paths") or [])
            for s in range(samples):
                aid = answer_id(t, lineage, decoding, s)
                if aid in known:
                    summary.already += 1
                    continue
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
                yield Question(aid, t["trial_id"], t["prompt"], images, decoding, s, row)

    def commit(question: Question, got: dict[str, Any], seconds: float, settles: str | None) -> None:
        fields = {k: got.get(k) for k in ("reply", "finish_reason", "tokens_in", "tokens_out", "error")}
        store.commit_answer(
            {**question.row, **fields, "cost_usd": got["cost_usd"], "seconds": seconds}, settles=settles
        )

    try:
        ask_questions(
            client,
            todo(),
            store,
            commit,
            summary,
            concurrency=concurrency,
            retries=retries,
            max_spend=max_spend,
            spent_before=store.spent_usd(model),
            on_answer=on_answer,
            total=summary.wanted,
        )
    finally:
        store.close()
    return summary
