"""``ask`` trusts nothing a server or a user gives it (issue 44, the ask side).

Each test is a break of issue 44 as it states it, against an OpenAI-compatible endpoint served
in-process on 127.0.0.1 (:class:`Endpoint`: a reply the test writes, every request recorded),
on the synthetic release of :mod:`tests.validation.standin_vlm` (single-image salary trials).
Through the command line (``CliRunner``, in this process) an error is one ``error:`` line and
exit status 2.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from counterfactory.flows.cli import main
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import MemoryJournal, PaidCall, PaidReading, redact
from counterfactory.manifests.paid.direct import DirectClient
from counterfactory.validation.scoring import ask as ask_module
from counterfactory.validation.scoring.answers import AnswersError, AnswersLedger
from counterfactory.validation.scoring.ask import AskError, ask
from counterfactory.validation.scoring.backends import OpenAIChat, OpenAIOptions
from tests.validation.standin_vlm import synthetic_release

KEY = "sk-test-Zq81vN3pLkT0aa77"

Reply = tuple[int, Any, dict[str, str]]


def completion(content: Any = "42", usage: Any = None, **fields: Any) -> dict[str, Any]:
    """A chat completion whose message content is ``content`` (any JSON) and ``usage`` as given."""
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1} if usage is None else usage,
    }
    body.update(fields)
    return body


class Endpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1: ``respond(request)`` gives ``(status, JSON or
    bytes, headers)`` for each POST; every request's path, headers and body are kept."""

    def __init__(self, respond: Callable[[dict[str, Any]], Reply] | None = None, *, latency_s: float = 0.0):
        self.respond = respond or (lambda request: (200, completion(), {}))
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = {"path": self.path, "headers": headers, "body": json.loads(raw or b"{}")}
                with outer.lock:
                    outer.requests.append(request)
                    outer.in_flight += 1
                    outer.most_in_flight = max(outer.most_in_flight, outer.in_flight)
                try:
                    if outer.latency_s:
                        time.sleep(outer.latency_s)
                    status, payload, headers = outer.respond(request)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def endpoint():
    made: list[Endpoint] = []

    def start(respond=None, **kw) -> Endpoint:
        made.append(Endpoint(respond, **kw))
        return made[-1]

    yield start
    for e in made:
        e.close()


@pytest.fixture
def release(tmp_path) -> Path:
    return synthetic_release(tmp_path, 4)


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["ask", *map(str, args)])


def one_error_line(done: Any) -> str:
    """The one ``error:`` line of a run that exited 2 without a traceback."""
    assert done.exit_code == 2, done.output
    assert isinstance(done.exception, SystemExit), done.exception
    lines = [line for line in done.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.output
    return lines[0]


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("select * from answers")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- 1. credentials


@pytest.mark.parametrize(
    "url",
    [
        "https://alice:hunter2pw@127.0.0.1:9/v1",
        "http://hunter2pw@127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1?api_key=hunter2pw",
    ],
)
def test_a_base_url_with_credentials_is_refused_in_one_line_that_does_not_print_them(tmp_path, release, url):
    ledger = tmp_path / "a.sqlite"
    done = cli(release, "--model", "m", "--base-url", url, "--ledger", ledger)
    line = one_error_line(done)
    assert "--backend openai: base_url:" in line and "refused" in line
    assert "hunter2pw" not in done.output and not ledger.exists()


def test_the_key_goes_only_to_the_configured_host_and_a_redirect_elsewhere_is_not_followed(tmp_path, release, endpoint):
    elsewhere = endpoint()
    here = endpoint(
        lambda r: (307, {}, {"Location": elsewhere.url.replace("127.0.0.1", "localhost") + "/chat/completions"})
    )
    done = cli(release, "--model", "m", "--base-url", here.url, "--ledger", tmp_path / "a.sqlite")
    line = one_error_line(done)
    assert (
        f"127.0.0.1:{here.server.server_address[1]}" in line
        and f"localhost:{elsewhere.server.server_address[1]}" in line
    )
    assert "not followed" in line
    assert elsewhere.requests == []  # neither the images nor the key went there
    assert here.requests and all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in here.requests)


def test_an_error_body_echoing_the_key_is_printed_redacted(tmp_path, release, endpoint):
    def echo(request: dict[str, Any]) -> Reply:
        auth = request["headers"]["authorization"]
        return 401, {"error": {"message": f"bad key; you sent Authorization: {auth} (key {KEY})"}}, {}

    done = cli(release, "--model", "m", "--base-url", endpoint(echo).url, "--ledger", tmp_path / "a.sqlite")
    line = one_error_line(done)
    assert "rejected the key in $OPENAI_API_KEY" in line and "[redacted]" in line
    assert KEY not in done.output and KEY[3:] not in done.output


def test_a_transient_error_body_echoing_the_key_is_redacted_where_the_run_prints_it(tmp_path, release, endpoint):
    e = endpoint(lambda r: (500, {"error": {"message": f"upstream saw {r['headers']['authorization']}"}}, {}))
    done = cli(
        release,
        "--model",
        "m",
        "--base-url",
        e.url,
        "--ledger",
        tmp_path / "a.sqlite",
        "--backend-option",
        "backoff_s=0.01",
    )
    assert done.exit_code == 1 and "trials got no answer" in done.output
    assert "[redacted]" in done.output and KEY not in done.output


def test_redact_cuts_what_looks_like_a_credential():
    text = (
        'Authorization: Bearer abc.def-ghi_jkl {"authorization": "Basic dXNlcjpwYXNz"} sk-proj-0123456789abcdef '
        "https://bob:pw123@host/v1 http://h/v1?api_key=zzzzzz&x=1 key_id 0a1b2c3d-0a1b-0a1b-0a1b-0a1b2c3d4e5f:"
        "0123456789abcdef0123456789abcdef my-own-secret"
    )
    out = redact(text, ["my-own-secret"])
    for secret in ("abc.def", "dXNlcjpwYXNz", "sk-proj", "pw123", "zzzzzz", "0123456789abcdef0123", "my-own-secret"):
        assert secret not in out, out
    assert "http://h/v1?api_key=[redacted]&x=1" in out and "https://[redacted]@host/v1" in out


# ---------------------------------------------------------------- 2. the spend cap


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"prompt_tokens": -28_000_000_000_000, "completion_tokens": 1}, "tokens"),
        ({"prompt_tokens": "12", "completion_tokens": 1}, "not a token count"),
        ({"prompt_tokens": float("nan"), "completion_tokens": 1}, "not a token count"),
        ({"prompt_tokens": float("inf"), "completion_tokens": 1}, "not a token count"),
        ({"prompt_tokens": 2**70, "completion_tokens": 1}, "not a token count"),
        ({"completion_tokens": 1}, "prompt_tokens is missing, and its price is set"),
        ("lots", "usage is a str"),
    ],
)
def test_token_counts_that_are_not_counts_are_an_error_row_paid_once(tmp_path, release, endpoint, usage, why):
    e = endpoint(lambda r: (200, completion(usage=usage), {}))
    ledger = tmp_path / "a.sqlite"
    args = (release, "--model", "m", "--base-url", e.url, "--ledger", ledger, "--usd-per-mtok-in", 2.5)
    done = cli(*args, "--max-spend", 100)
    assert done.exit_code == 1 and "4 replies could not be read as answers" in done.output, done.output
    assert "Traceback" not in done.output and why in done.output
    rows = ledger_rows(ledger)
    assert len(rows) == 4 and all(r["error"] and r["reply"] is None and r["cost_usd"] == 0.0 for r in rows)
    store = AnswersLedger(ledger)
    assert store.spent_usd("m") == 0.0 and store.rows() == [] and len(store.errors()) == 4
    store.close()
    again = cli(*args, "--max-spend", 100)
    assert again.exit_code == 0 and "0 asked, 4 already answered" in again.output
    assert len(e.requests) == 4  # not paid twice


@pytest.mark.parametrize(
    "flag", ["--max-spend", "--usd-per-mtok-in", "--usd-per-mtok-out", "--estimated-usd-per-question"]
)
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_spend_or_price_that_is_not_a_finite_amount_is_refused(tmp_path, release, flag, value):
    done = cli(release, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", flag, value, "--ledger", tmp_path / "a")
    line = one_error_line(done)
    assert f"{flag} {float(value)}: not a finite number of USD >= 0" in line
    assert not (tmp_path / "a").exists()


def test_the_python_api_refuses_the_same_caps_and_prices(release):
    for bad in (float("nan"), float("inf"), -0.01):
        with pytest.raises(AskError, match="--max-spend"):
            ask(release, backend="openai", options={"model": "m", "base_url": "http://127.0.0.1:9/v1"}, max_spend=bad)
    for name in ("usd_per_mtok_in", "usd_per_mtok_out", "estimated_usd_per_question"):
        with pytest.raises(AskError, match=f"--backend openai: {name}"):
            ask(release, backend="openai", options={"model": "m", "base_url": "http://127.0.0.1:9/v1", name: -1.0})


def test_a_ledger_holding_a_negative_spend_does_not_lift_the_cap(tmp_path, release, endpoint):
    ledger = tmp_path / "a.sqlite"
    AnswersLedger(ledger).close()  # the tables; the row below as an older version wrote it
    with sqlite3.connect(ledger) as db:
        db.execute(
            "insert into answers (answer_id, trial_id, prompt_sha256, protocol, model, backend, lineage, decoding, "
            "sample, cost_usd, seconds, created_at) values "
            "('x', 't', 'p', 'salary', 'm', 'openai', '{}', '{}', 0, -28000000.0, 0, '2026-01-01')"
        )
    with pytest.raises(AnswersError, match="cost_usd -1.0 is not a USD amount >= 0"):
        AnswersLedger(ledger).commit_answer({"answer_id": "y", "cost_usd": -1.0})
    # each answer costs $1 (1,000,000 prompt tokens at $1 per million): a cap of $2 stops after 2
    e = endpoint(lambda r: (200, completion(usage={"prompt_tokens": 1_000_000, "completion_tokens": 0}), {}))
    options = {"model": "m", "base_url": e.url, "usd_per_mtok_in": 1.0}
    got = ask(release, backend="openai", options=options, concurrency=1, max_spend=2.0, ledger=ledger)
    assert got.asked == 2 and got.stopped_at_cap and len(e.requests) == 2


def _dollar_each(request: dict[str, Any]) -> Reply:
    return 200, completion(usage={"prompt_tokens": 1_000_000, "completion_tokens": 0}), {}


@pytest.mark.parametrize(("cap", "answers"), [(5.0, 5), (5.01, 6), (4.99, 5), (0.0, 0)])
def test_the_cap_at_its_boundary_one_at_a_time(tmp_path, endpoint, cap, answers):
    # $1 an answer, the default estimate of 0: exactly at the cap nothing more is sent; a cent
    # over it, one more; a cap of 0 sends nothing
    release = synthetic_release(tmp_path, 12)
    e = endpoint(_dollar_each)
    options = {"model": "m", "base_url": e.url, "usd_per_mtok_in": 1.0}
    got = ask(release, backend="openai", options=options, concurrency=1, max_spend=cap, ledger=tmp_path / "a.sqlite")
    assert len(e.requests) == answers and got.asked == answers and got.spent_usd == pytest.approx(answers)
    assert got.stopped_at_cap


@pytest.mark.parametrize("concurrency", [2, 4])
def test_with_an_estimate_of_0_the_cap_lets_at_most_the_questions_in_flight_past_it(tmp_path, endpoint, concurrency):
    # $1 an answer, cap $5: the fifth answer reaches it; at most concurrency - 1 others were in
    # flight then, so at most 5 + concurrency - 1 answers are paid for (the issue saw 12 at 4)
    release = synthetic_release(tmp_path, 30)
    e = endpoint(_dollar_each, latency_s=0.02)
    options = {"model": "m", "base_url": e.url, "usd_per_mtok_in": 1.0}
    got = ask(release, backend="openai", options=options, concurrency=concurrency, max_spend=5.0, ledger=tmp_path / "a")
    assert 5 <= len(e.requests) <= 5 + concurrency - 1 and got.asked == len(e.requests) and got.stopped_at_cap
    assert e.most_in_flight <= concurrency


class SlowJournal(MemoryJournal):
    """A journal whose writes take 30 ms: answers read but not yet journaled pile up."""

    def save(self, key: str, data, *, cost_usd: float = 0.0) -> None:
        time.sleep(0.03)
        super().save(key, data, cost_usd=cost_usd)


def test_the_paid_client_counts_an_answer_from_its_reading_not_from_its_journal_row():
    sent = []

    async def send(arguments: dict) -> dict:
        sent.append(arguments["x"])
        await asyncio.sleep(0.005)
        return {"cost": 1.0}

    async def read(call: PaidCall, result: dict, transfer: object) -> PaidReading:
        return PaidReading(call.key, result["cost"])

    client = DirectClient(send, name="x", concurrency=4, spend_cap_usd=5.0, estimate_usd=0.0)
    calls = [PaidCall(f"k{i}", lambda i=i: {"x": i}) for i in range(40)]
    answers = client.run_many(calls, read, SlowJournal())
    ok = [a for a in answers if a.status == "ok"]
    assert 5 <= len(sent) <= 5 + 4 - 1 and len(ok) == len(sent)


def test_a_reader_cost_that_is_not_an_amount_fails_the_call_at_the_estimate():
    async def send(arguments: dict) -> dict:
        return {}

    async def read(call: PaidCall, result: dict, transfer: object) -> PaidReading:
        return PaidReading(None, -28e6)

    journal = MemoryJournal()
    (answer,) = DirectClient(send, name="x", estimate_usd=0.25).run_many([PaidCall("k", dict)], read, journal)
    assert answer.status == "failed" and answer.reason.startswith("x_bad_cost:")
    assert journal.spent_usd() == 0.25


# ---------------------------------------------------------------- 3. replies bounded in size and shape


def test_content_as_a_list_of_text_parts_is_joined(tmp_path, release, endpoint):
    parts = [{"type": "text", "text": "70,"}, {"type": "text", "text": "000"}]
    e = endpoint(lambda r: (200, completion(content=parts), {}))
    got = ask(release, backend="openai", options={"model": "m", "base_url": e.url}, ledger=tmp_path / "a")
    assert got.asked == 4 and got.invalid == 0
    assert {r["reply"] for r in ledger_rows(tmp_path / "a")} == {"70,000"}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (completion(content={"text": "70000"}), "choices[0].message.content is a dict"),
        (
            completion(content=[{"type": "image_url", "image_url": {}}]),
            "choices[0].message.content[0] is a 'image_url' part",
        ),
        (completion(content=7), "choices[0].message.content is a int"),
        ({"choices": [{"message": "hi"}]}, "choices[0].message is a str"),
        (completion(usage={"prompt_tokens": True, "completion_tokens": 1}), "usage.prompt_tokens is True"),
        ({**completion(), "choices": [{"message": {"content": "x"}, "finish_reason": ["stop"]}]}, "finish_reason"),
    ],
)
def test_odd_reply_shapes_are_an_error_row_not_a_traceback(tmp_path, release, endpoint, body, why):
    e = endpoint(lambda r: (200, body, {}))
    got = ask(release, backend="openai", options={"model": "m", "base_url": e.url}, ledger=tmp_path / "a")
    assert got.invalid == 4 and got.failed == 0 and got.asked == 0
    assert all(why in err for err in got.errors), got.errors
    again = ask(release, backend="openai", options={"model": "m", "base_url": e.url}, ledger=tmp_path / "a")
    assert again.already == 4 and len(e.requests) == 4


def test_a_reply_over_its_bound_is_an_error_not_stored(tmp_path, release, endpoint):
    big = completion(content="x" * 50_000)
    e = endpoint(lambda r: (200, big, {}))
    options = {"model": "m", "base_url": e.url, "max_reply_bytes": 20_000}
    got = ask(release, backend="openai", options=options, ledger=tmp_path / "a")
    assert got.invalid == 4 and all("over max_reply_bytes=20,000" in err for err in got.errors), got.errors
    assert all(r["reply"] is None for r in ledger_rows(tmp_path / "a"))
    assert (tmp_path / "a").stat().st_size < 200_000


def test_a_body_over_its_bound_without_a_length_is_cut_while_read(tmp_path, endpoint):
    # a chunked body (no Content-Length): the counter stops reading it past the bound
    release = synthetic_release(tmp_path, 1)

    class Chunked(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            data = json.dumps(completion(content="y" * 3_000_000)).encode()
            for i in range(0, len(data), 65536):
                chunk = data[i : i + 65536]
                try:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                except OSError:
                    return
            self.wfile.write(b"0\r\n\r\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        got = ask(release, backend="openai", options={"model": "m", "base_url": url}, ledger=tmp_path / "a")
    finally:
        server.shutdown()
        server.server_close()
    assert got.invalid == 1 and "over max_reply_bytes=1,048,576" in got.errors[0]


# ---------------------------------------------------------------- 4. questions streamed


def test_absurd_samples_are_refused_in_one_line(tmp_path, release):
    done = cli(release, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--samples", "100000000")
    line = one_error_line(done)
    assert "--samples 100000000: ask at most 10,000 answers per trial" in line


def test_questions_are_built_as_they_are_sent_not_all_before(tmp_path, endpoint, monkeypatch):
    release = synthetic_release(tmp_path, 3)
    built = []
    first_seen: list[int] = []
    question = ask_module.Question

    def counting(*args: Any) -> Any:
        built.append(1)
        return question(*args)

    def respond(request: dict[str, Any]) -> Reply:
        if not first_seen:
            first_seen.append(len(built))
        return _dollar_each(request)

    monkeypatch.setattr(ask_module, "Question", counting)
    e = endpoint(respond)
    options = {"model": "m", "base_url": e.url, "usd_per_mtok_in": 1.0}
    got = ask(release, backend="openai", options=options, samples=10_000, max_spend=3.0, ledger=tmp_path / "a")
    # 30,000 questions wanted: the first request went out after one chunk was built, and the cap
    # stopped the building
    assert got.wanted == 30_000 and got.stopped_at_cap and len(e.requests) <= 3 + 3
    assert first_seen[0] <= ask_module.CHUNK_QUESTIONS and len(built) <= 2 * ask_module.CHUNK_QUESTIONS


# ---------------------------------------------------------------- 5. the seed


def test_each_request_is_seeded_from_its_answer_id():
    backend = OpenAIChat(OpenAIOptions(model="m", base_url="http://127.0.0.1:9/v1"))
    seeds = {backend.arguments("p", [], {}, 0, answer_id=a)["seed"] for a in ("a" * 64, "b" * 64, "c" * 64)}
    assert len(seeds) == 3 and all(0 <= s < 2**31 for s in seeds)
    assert backend.arguments("p", [], {}, 0, answer_id="a" * 64)["seed"] in seeds  # reproducible


def test_ask_sends_the_seed_of_each_answer_id(tmp_path, endpoint):
    # two trials asking the same prompt of the same image (a noise repeat) are two requests
    release = synthetic_release(tmp_path, 2)
    rows = [json.loads(x) for x in (release / "trials.jsonl").read_text().splitlines()]
    rows[1]["prompt"] = rows[0]["prompt"]
    (release / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    e = endpoint()
    ask(release, backend="openai", options={"model": "m", "base_url": e.url}, ledger=tmp_path / "a")
    bodies = [r["body"] for r in e.requests]
    assert len(bodies) == 2 and bodies[0]["messages"] == bodies[1]["messages"]
    assert bodies[0]["seed"] != bodies[1]["seed"]


# ---------------------------------------------------------------- 6. nothing listening


def test_ask_with_no_server_listening_fails_within_seconds_naming_the_url(tmp_path):
    release = synthetic_release(tmp_path, 40)
    url = f"http://127.0.0.1:{free_port()}/v1"
    start = time.monotonic()
    done = cli(release, "--model", "m", "--base-url", url, "--ledger", tmp_path / "a")
    line = one_error_line(done)
    assert time.monotonic() - start < 15
    assert f"cannot connect to {url}" in line and "is the server running?" in line


def test_a_refused_connection_is_retried_a_couple_of_times_not_per_question(tmp_path):
    backend = OpenAIChat(OpenAIOptions(model="m", base_url=f"http://127.0.0.1:{free_port()}/v1"))
    tries = []
    send = backend.send

    async def counted(body: dict) -> dict:
        tries.append(1)
        return await send(body)

    backend.send = counted
    with pytest.raises(SetupError, match="cannot connect to"):
        ask_module.ask_questions(
            backend,
            (ask_module.Question(f"k{i}", f"t{i}", "p", (), {}, 0, {}) for i in range(40)),
            AnswersLedger(tmp_path / "a"),
            lambda *a: None,
            ask_module.AskSummary(),
            concurrency=1,
            retries=4,
            max_spend=None,
            spent_before=0.0,
        )
    assert len(tries) == 3


# ---------------------------------------------------------------- 7. the ledger outside the release


@pytest.mark.parametrize("inside", ["answers.sqlite", "images/answers.sqlite", "."])
def test_a_ledger_inside_the_release_is_refused(release, inside):
    before = sorted(p.relative_to(release) for p in release.rglob("*"))
    done = cli(release, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--ledger", release / inside)
    line = one_error_line(done)
    assert "inside the release folder" in line and "which is sealed" in line
    assert sorted(p.relative_to(release) for p in release.rglob("*")) == before


def test_a_judge_ledger_inside_the_release_is_refused(release):
    done = cli(release, "--judge", "story", "--of", "m", "--model", "j", "--base-url", "http://127.0.0.1:9/v1",
               "--ledger", release / "j.sqlite")  # fmt: skip
    assert "inside the release folder" in one_error_line(done)


def test_nan_is_not_a_spend(tmp_path):
    assert not math.isnan(ask_module._usd(float("nan"))) and ask_module._usd(-5) == 0.0
