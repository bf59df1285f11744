"""The paid-request interface (manifests/paid): the spend cap, and DirectClient, the client of
one-request calls, keeping the promises every paid client keeps (bounded concurrency, the cap,
retries of transport errors, each result journaled when it returns and read back on resume)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from counterfactory.manifests.paid import MemoryJournal, PaidCall, PaidCallFailed, PaidClient, PaidReading, SpendCap
from counterfactory.manifests.paid.direct import DirectClient
from counterfactory.manifests.paid.fal import FalQueue, FalQueueOptions


class Flaky(ConnectionError):
    """A transport failure the client is told to retry."""


class Server:
    """A paid service: answers ``{"echo": x, "cost": c}``, counting requests and those in flight."""

    def __init__(self, *, fail_first: int = 0, delay_s: float = 0.01) -> None:
        self.requests, self.in_flight, self.most_in_flight = 0, 0, 0
        self.fail_first, self.delay_s = fail_first, delay_s

    async def send(self, arguments: dict) -> dict:
        self.requests += 1
        if self.requests <= self.fail_first:
            raise Flaky(f"connection reset ({self.requests})")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        return {"echo": arguments["x"], "cost": 0.5}


async def read(call: PaidCall, result: dict, transfer: object) -> PaidReading:
    if result["echo"] == "refuse":
        raise PaidCallFailed("refused", "x_refusal: no")
    return PaidReading(result["echo"], result["cost"])


def calls(*values: str) -> list[PaidCall]:
    return [PaidCall(f"key-{v}", lambda v=v: {"x": v}) for v in values]


def client(server: Server, **options) -> DirectClient:
    return DirectClient(server.send, name="x", transient=(Flaky,), backoff_s=0.0, **options)


def test_both_clients_are_paid_clients():
    assert isinstance(client(Server()), PaidClient)
    assert isinstance(FalQueue("fal-ai/nano-banana/edit", FalQueueOptions(), estimate_usd=0.039), PaidClient)


def test_at_most_concurrency_requests_are_in_flight_and_answers_keep_their_order():
    server = Server(delay_s=0.02)
    answers = client(server, concurrency=2).run_many(calls("a", "b", "c", "d", "e", "f"), read)
    assert [a.value for a in answers] == ["a", "b", "c", "d", "e", "f"]
    assert server.most_in_flight == 2 and server.requests == 6


def test_a_key_asked_twice_in_a_batch_is_one_request():
    server = Server()
    answers = client(server).run_many(calls("a", "a", "b"), read)
    assert [a.key for a in answers] == ["key-a", "key-a", "key-b"] and server.requests == 2


def test_transport_errors_are_retried_then_reported():
    server = Server(fail_first=2)
    (answer,) = client(server, max_retries=2).run_many(calls("a"), read)
    assert answer.status == "ok" and answer.submit_tries == 3
    server = Server(fail_first=5)
    (answer,) = client(server, max_retries=1).run_many(calls("a"), read)
    assert answer.status == "failed" and answer.reason.startswith("x_unavailable: the request failed 2 time(s)")
    assert "Flaky: connection reset (2)" in answer.reason


def test_the_spend_cap_counts_the_journal_and_stops_new_requests():
    journal = MemoryJournal()
    journal.save("earlier", {}, cost_usd=1.0)
    server = Server()
    answers = client(server, concurrency=1, spend_cap_usd=2.0, estimate_usd=0.5).run_many(
        calls("a", "b", "c"), read, journal
    )
    # 1.0 spent before; a and b at 0.5 each reach the cap, c would pass it and is not sent
    assert [a.status for a in answers] == ["ok", "ok", "failed"]
    assert answers[2].reason.startswith("x_spend_cap_reached: $2.0000 spent or committed")
    assert server.requests == 2 and journal.spent_usd() == pytest.approx(2.0)


def test_each_result_is_journaled_when_it_returns_and_read_back_instead_of_paid_again():
    journal = MemoryJournal()
    first = client(Server()).run_many(calls("a", "refuse"), read, journal)
    assert [a.status for a in first] == ["ok", "refused"]
    assert journal.load("key-a")["result"] == {"echo": "a", "cost": 0.5}
    # the refusal's result was paid for: it is kept too, at the estimate, and read again
    assert journal.load("key-refuse")["state"] == "completed"
    again = Server()
    second = client(again).run_many(calls("a", "refuse", "b"), read, journal)
    assert [(a.status, a.resumed) for a in second] == [("ok", True), ("refused", True), ("ok", False)]
    assert again.requests == 1  # only b


def test_the_spend_cap_reserves_what_is_in_flight():
    cap, journal = SpendCap(1.0, code="y_spend_cap_reached"), MemoryJournal()
    with cap.reserve(journal, 0.6):
        with pytest.raises(PaidCallFailed, match=r"^y_spend_cap_reached: \$0\.6000 spent or committed"):
            with cap.reserve(journal, 0.6):
                pass
    with cap.reserve(journal, 0.6):  # released: room again
        pass


class SlowJournal(MemoryJournal):
    """A journal whose writes take 20 ms each, noting the thread each ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def save(self, key: str, data, *, cost_usd: float = 0.0) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(0.02)
        super().save(key, data, cost_usd=cost_usd)


def test_journal_writes_run_on_one_writer_thread_while_the_loop_keeps_sending():
    server, journal = Server(delay_s=0.02), SlowJournal()

    async def run() -> tuple[str, list]:
        answers = await client(server, concurrency=4).arun_many(calls(*"abcdefghijkl"), read, journal)
        return threading.current_thread().name, answers

    loop_thread, answers = asyncio.run(run())
    assert [a.status for a in answers] == ["ok"] * 12 and len(journal.threads) == 1
    assert loop_thread not in journal.threads
    # a slot is freed when its answer returns, not when it is written: with writes slower than
    # the requests, the bound is still reached, never passed
    assert server.most_in_flight == 4 and journal.spent_usd() == pytest.approx(6.0)


class CountsThenWaits(MemoryJournal):
    """A journal that counts a row's cost, then takes 30 ms more before its write returns (the
    answers ledger commits the answer, then reports progress): the window in which the row is
    in the journal's spend and its hold is still held."""

    def save(self, key: str, data, *, cost_usd: float = 0.0) -> None:
        super().save(key, data, cost_usd=cost_usd)
        time.sleep(0.03)


def test_an_answer_being_journaled_is_counted_once_against_the_cap():
    # $0.50 an answer, a $2.00 cap, no estimate: four answers reach it, the fifth is refused.
    # The next request is checked while the last answer's row is being written; counting the
    # answer both in the journal and in its hold refused it at $1.50 (seen in CI: ask stopped
    # at $30 of a $40 cap)
    server, journal = Server(delay_s=0.0), CountsThenWaits()
    answers = client(server, concurrency=1, spend_cap_usd=2.0).run_many(calls(*"abcdef"), read, journal)
    assert [a.status for a in answers] == ["ok"] * 4 + ["failed"] * 2
    assert answers[4].reason.startswith("x_spend_cap_reached: $2.0000 spent or committed")
    assert server.requests == 4 and journal.spent_usd() == pytest.approx(2.0)
