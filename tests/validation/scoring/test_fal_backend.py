"""``counterfactory ask --backend fal`` against the local fake fal queue (real HTTPS on
127.0.0.1, :mod:`tests.generation.fal_server`, which speaks fal's vision router): the limb-pairs
release of ``limb_ask.yaml``, made once by the real command line, asked through the command
line's ``main``. Every answer is recorded with the router's ``usage.cost``; a re-run asks
nothing; SIGKILL mid-run and a resume pay each question once (the fake counts the submissions
it accepted); the spend cap stops new questions; a refusal (the model's words, or fal's
content-policy block) is an answer.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from counterfactory.manifests.release import read_jsonl
from tests.flows.unchanged import cli_env

pytest.importorskip("fal_client")
pytest.importorskip("trustme")
from tests.generation.fal_server import Behaviour, FalServer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "google/gemini-2.5-flash"
PRICE = 0.0005595  # usage.cost of the example answer in fal's documentation of the router
ANSWER = "4"
#: the queue's status polls at the fake's pace (fal's own default is 0.25 s)
FAST = ("--backend-option", "poll_interval_s=0.01", "--backend-option", "backoff_s=0.01")


@pytest.fixture(scope="module")
def release(limb_ask_release) -> Path:
    return limb_ask_release  # the session's (tests/validation/conftest.py)


@pytest.fixture(scope="module")
def trials(release) -> list[dict]:
    return read_jsonl(release / "trials.jsonl")


@pytest.fixture(scope="module")
def server():
    with FalServer(latency_s=0.05, price_usd=PRICE) as fake, fake.patch_environment():
        yield fake


@pytest.fixture(autouse=True)
def _fresh(server):
    server.reset()
    server.default_answer = ANSWER


def _ask(release: Path, ledger: Path, *extra: str):
    from counterfactory.flows.cli import main

    args = ["ask", str(release), "--backend", "fal", "--model", MODEL, "--ledger", str(ledger), *FAST, *extra]
    return CliRunner().invoke(main, args)


def _rows(ledger: Path, table: str = "answers") -> list[dict]:
    if not ledger.exists():
        return []
    try:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(f"select * from {table}")]  # noqa: S608
    except sqlite3.OperationalError:  # not created yet
        return []


def _paid(server: FalServer) -> int:
    return sum(server.paid_submits.values())


def _pixels(release: Path, rel: str) -> np.ndarray:
    with Image.open(io.BytesIO((release / rel).read_bytes())) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def test_answers_are_recorded_with_the_routers_cost_and_a_rerun_asks_nothing(release, trials, server, tmp_path):
    ledger = tmp_path / "answers.sqlite"
    done = _ask(release, ledger, "--concurrency", "4")
    assert done.exit_code == 0, (done.output, done.exception)
    assert f"{len(trials)} asked, 0 already answered, 0 failed" in done.output
    rows = _rows(ledger)
    assert len(rows) == len(trials) == _paid(server)
    assert {r["trial_id"] for r in rows} == {t["trial_id"] for t in trials}
    assert {(r["reply"], r["backend"], r["model"]) for r in rows} == {(ANSWER, "fal", MODEL)}
    # each answer costs what the router billed (usage.cost), and the CLI reports their sum
    assert all(r["cost_usd"] == pytest.approx(PRICE) for r in rows)
    assert f"${PRICE * len(trials):.4f} spent" in done.output
    assert server.billed_usd() == pytest.approx(PRICE * len(trials))
    # the router got the trial's prompt, the model and the trial's decoding settings
    by_prompt = {t["prompt"]: t for t in trials}
    for job in server.jobs.values():
        trial = by_prompt[job.arguments["prompt"]]
        assert job.app == "openrouter/router" and job.arguments["model"] == MODEL
        for name in ("temperature", "max_tokens"):
            assert job.arguments.get(name) == (trial.get("decoding") or {}).get(name)
    assert _rows(ledger, "requests") == []  # every journaled request settled by its answer

    again = _ask(release, ledger, "--concurrency", "4")
    assert again.exit_code == 0, (again.output, again.exception)
    assert f"0 asked, {len(trials)} already answered" in again.output
    assert _paid(server) == len(trials) and len(_rows(ledger)) == len(trials)


def test_sigkill_mid_run_then_resume_pays_each_question_once(release, trials, server, tmp_path):
    ledger = tmp_path / "answers.sqlite"
    bound = 2
    env = cli_env() | server.env()
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    cmd = [sys.executable, "-m", "counterfactory", "ask", str(release), "--backend", "fal", "--model", MODEL]
    cmd += ["--ledger", str(ledger), "--concurrency", str(bound), *FAST]
    server.latency_s = 0.1
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while len(_rows(ledger)) < len(trials) // 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        # hold fal's queue: no request finishes, so no slot frees and nothing new is submitted;
        # kill once both slots hold a request whose id is journaled
        server.hold()
        journaled: set[str] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            open_ids = {i for i, j in server.jobs.items() if not j.collected}
            journaled = {json.loads(r["data"])["request_id"] for r in _rows(ledger, "requests")}
            if len(open_ids) == bound and open_ids <= journaled:
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        server.release()
    answered, paid = len(_rows(ledger)), _paid(server)
    assert 0 < answered < len(trials) and paid == answered + bound and len(journaled) == bound

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(trials) - answered} asked, {answered} already answered, 0 failed" in done.stdout
    # the two killed in flight were fetched by their journaled ids, not submitted again:
    # every question paid once, every answer recorded once, each at its billed cost
    assert _paid(server) == len(trials) and max(server.paid_submits.values()) <= sum(
        1 for t in trials if t["prompt"] == trials[0]["prompt"]
    )
    assert all(server.jobs[i].collected for i in journaled)
    rows = _rows(ledger)
    assert len(rows) == len({r["answer_id"] for r in rows}) == len(trials)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(server.billed_usd())
    assert _rows(ledger, "requests") == []
    third = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and f"0 asked, {len(trials)} already answered" in third.stdout
    assert _paid(server) == len(trials)


def test_the_spend_cap_stops_new_questions_and_a_higher_cap_goes_on(release, trials, server, tmp_path):
    ledger = tmp_path / "answers.sqlite"
    # by hand, one at a time: a question is sent while the answers' cost so far plus its
    # estimate (0.002) stays within 0.0035: after 0, 1 and 2 answers at PRICE (0.0020, 0.0026,
    # 0.0031); after 3 (0.0037) it would pass the cap, so the fourth is not sent
    capped = ["--concurrency", "1", "--estimated-usd-per-question", "0.002", "--max-spend", "0.0035"]
    first = _ask(release, ledger, *capped)
    assert first.exit_code == 0, (first.output, first.exception)
    assert "3 asked" in first.output and "stopped at the spend cap" in first.output
    assert len(_rows(ledger)) == 3 == _paid(server)
    rest = _ask(release, ledger, "--concurrency", "4", "--max-spend", "1")
    assert rest.exit_code == 0, (rest.output, rest.exception)
    assert f"{len(trials) - 3} asked, 3 already answered" in rest.output
    assert "spend cap" not in rest.output and _paid(server) == len(trials)


def test_a_refusal_is_an_answer(release, trials, server, tmp_path):
    ledger = tmp_path / "answers.sqlite"
    # the model declines one image in words; fal's content checker blocks one prompt
    declined = "I can't help with judging a real person's abilities from a photo."
    image = trials[0]["image_paths"][0]
    server.answer(_pixels(release, image), declined)
    blocked = next(t["prompt"] for t in trials if t["prompt"] != trials[0]["prompt"])
    server.behave(blocked, Behaviour(outcome="policy"))
    done = _ask(release, ledger, "--concurrency", "4")
    assert done.exit_code == 0, (done.output, done.exception)
    assert f"{len(trials)} asked, 0 already answered, 0 failed" in done.output
    rows = {r["trial_id"]: r for r in _rows(ledger)}
    declining = {t["trial_id"] for t in trials if t["image_paths"][0] == image and t["prompt"] != blocked}
    assert declining and {rows[i]["reply"] for i in declining} == {declined}
    policy = [r for r in rows.values() if r["finish_reason"] == "content_filter"]
    assert policy and all(r["reply"] is None for r in policy)
    assert {r["trial_id"] for r in policy} == {t["trial_id"] for t in trials if t["prompt"] == blocked}
    again = _ask(release, ledger, "--concurrency", "4")
    assert f"0 asked, {len(trials)} already answered" in again.output and _paid(server) == len(trials)


def test_without_a_fal_key_ask_says_how_to_set_one(release, server, tmp_path, monkeypatch):
    monkeypatch.delenv("FAL_KEY", raising=False)
    monkeypatch.delenv("FAL_KEY_ID", raising=False)
    done = _ask(release, tmp_path / "answers.sqlite")
    assert done.exit_code == 2
    assert done.output.strip().splitlines()[-1].startswith("error: FAL_KEY is not set")
    assert _paid(server) == 0
