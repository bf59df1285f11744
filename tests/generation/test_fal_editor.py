"""FalEditor against a local fake of fal's queue API (``fal_server.py``), over real HTTPS.

The fake's model returns ``255 - input``, so every expected image comes from the request,
not from the code under test. Its counters see every submission by payload hash, which is
what "never pay twice" is checked against.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pydantic
import pytest

from counterfactory.generation.editors import make_editor
from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.fal import DEFAULT_PRICES_USD, FalEditor, FalOptions
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import MemoryJournal
from tests.generation.fal_server import Behaviour, FalServer

PRICE = DEFAULT_PRICES_USD["fal-ai/nano-banana/edit"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    with FalServer(latency_s=0.1, price_usd=PRICE) as fake, fake.patch_environment():
        yield fake


@pytest.fixture(autouse=True)
def _fresh(server):
    server.reset()
    server.latency_s = 0.1


def _image(seed: int, shape: tuple[int, int] = (48, 64)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def _requests(n: int) -> list[EditRequest]:
    return [EditRequest(f"att-{i}", _image(i), f"make the person {i}", seed=i) for i in range(n)]


def _editor(**options) -> FalEditor:
    options = {"backoff_s": 0.02, "poll_interval_s": 0.02, "timeout_s": 10.0, **options}
    return FalEditor(FalOptions(**options))


def test_round_trip_is_lossless_and_accounted(server, grace):
    requests = [
        EditRequest("a", grace, "make the person Black and female", 11),
        EditRequest("b", _image(2, (33, 17)), "make the person East Asian and male", 12),
    ]
    journal = MemoryJournal()
    editor = make_editor("fal", FalOptions(backoff_s=0.02, poll_interval_s=0.02, arguments={"aspect_ratio": "auto"}))
    editor.prepare()
    results = editor.edit_many(requests, journal=journal)

    for request, result in zip(requests, results, strict=True):
        assert result.status == "ok", result.reason
        job = server.jobs[result.metadata["request_id"]]
        assert np.array_equal(job.input_image, request.image)  # PNG in: the server saw every pixel
        assert result.image.dtype == np.uint8 and result.image.shape == request.image.shape
        assert np.array_equal(result.image, server.outputs[job.request_id])
        assert np.array_equal(result.image, 255 - request.image)
        assert job.arguments == {
            "prompt": request.prompt,
            "seed": request.seed,
            "num_images": 1,
            "output_format": "png",
            "sync_mode": False,
            "aspect_ratio": "auto",
        }
        assert result.cost_usd == pytest.approx(PRICE)
        assert result.metadata["endpoint"] == "fal-ai/nano-banana/edit"
        assert result.metadata["seconds"] >= server.latency_s
        assert result.metadata["resumed"] is False
        row = journal.load(request.attempt_id)
        assert row["request_id"] == job.request_id and row["state"] == "completed"
    assert journal.spent_usd() == pytest.approx(2 * PRICE) == pytest.approx(server.billed_usd())
    assert sorted(server.paid_submits.values()) == [1, 1]
    assert editor.lineage()["arguments"] == {"aspect_ratio": "auto"}


@pytest.mark.slow
def test_concurrency_bound_is_reached_and_never_exceeded(server):
    server.latency_s = 0.3
    started = time.monotonic()
    results = _editor(concurrency=3).edit_many(_requests(10))
    elapsed = time.monotonic() - started

    assert [r.status for r in results] == ["ok"] * 10
    assert server.max_in_flight == 3
    assert elapsed >= 4 * 0.3  # ceil(10 / 3) waves of 0.3 s


@pytest.mark.slow
def test_bounds_hold_across_batches_running_in_parallel_threads(server):
    """The flow runs several templates at once, each its own edit_many on one editor: the
    concurrency bound and the spend cap are per editor, not per batch."""
    from concurrent.futures import ThreadPoolExecutor

    server.latency_s = 0.3
    editor = _editor(concurrency=3, spend_cap_usd=7.5 * PRICE)
    journal = MemoryJournal()
    batches = [[EditRequest(f"t{t}-{i}", _image(10 * t + i), f"p{t}-{i}", i) for i in range(5)] for t in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [r for batch in pool.map(lambda b: editor.edit_many(b, journal), batches) for r in batch]

    assert server.max_in_flight == 3
    assert sorted(r.status for r in results) == ["failed"] * 3 + ["ok"] * 7
    assert sum(server.paid_submits.values()) == 7
    assert journal.spent_usd() == pytest.approx(7 * PRICE)


def test_transient_errors_are_retried_without_paying_twice(server):
    server.behave("flaky", Behaviour(submit_errors=(429, 503, 500), status_errors=(503, 502)))
    [result] = _editor(max_retries=3).edit_many([EditRequest("f", _image(3), "flaky", 3)])

    assert result.status == "ok", result.reason
    assert np.array_equal(result.image, 255 - _image(3))
    [digest] = server.submit_attempts
    assert server.submit_attempts[digest] == 4  # 429 (fal-client's own retry), 503, 500, then accepted
    assert server.paid_submits[digest] == 1
    assert result.metadata["submit_tries"] == 3  # fal-client absorbs the 429 before we see it


def test_retries_stop_at_max_retries(server):
    server.behave("down", Behaviour(submit_errors=(503, 503, 503)))
    journal = MemoryJournal()
    [result] = _editor(max_retries=1).edit_many([EditRequest("d", _image(4), "down", 4)], journal)

    assert result.status == "failed"
    assert result.reason.startswith("fal_unavailable:") and "HTTP 503" in result.reason
    assert sum(server.submit_attempts.values()) == 2
    assert not server.paid_submits and journal.load("d") is None and journal.spent_usd() == 0


@pytest.mark.slow
def test_timeout_fails_the_item_and_keeps_its_request_id(server):
    server.behave("stall", Behaviour(outcome="stall"))
    server.behave("silent", Behaviour(status_errors=(0,)))  # the status poll is never answered
    requests = [
        EditRequest("s", _image(5), "stall", 5),
        EditRequest("q", _image(6), "silent", 6),
        EditRequest("o", _image(7), "fine", 7),
    ]
    journal = MemoryJournal()
    started = time.monotonic()
    stalled, silent, fine = _editor(timeout_s=1.0, concurrency=3).edit_many(requests, journal)

    assert time.monotonic() - started < 5
    for result in (stalled, silent):
        assert result.status == "failed"
        assert result.reason.startswith("fal_timeout:"), result.reason
        assert result.metadata["request_id"] in result.reason
        # abandoned, so fal is asked to cancel it; the id stays journalled and a re-run fetches it
        assert server.cancel_calls[result.metadata["request_id"]] == 1
        assert result.metadata["pending_request_id"] == result.metadata["request_id"]
    # the stalled job was still running: fal accepts the cancel
    assert stalled.metadata["cancelled"] is True and stalled.reason.endswith("; cancelled at fal")
    assert journal.load("s")["state"] == "cancelled"
    # the silent one had finished (only its status polls hung): ALREADY_COMPLETED, so it stays
    # "submitted", its result waiting to be fetched
    assert "cancelled" not in silent.metadata and journal.load("q")["state"] == "submitted"
    assert server.cancelled == {stalled.metadata["request_id"]}
    assert fine.status == "ok" and "cancelled" not in fine.metadata


@pytest.mark.parametrize(
    ("outcome", "status", "reason", "cost"),
    [
        ("nsfw", "refused", "fal_nsfw: the safety checker flagged the output", PRICE),
        ("no_images", "refused", "fal_no_images: the model returned no image", 0.0),
        ("refusal_text", "refused", "fal_refusal: I'm unable to make that edit", PRICE),
        (
            "policy",
            "refused",
            "fal_content_policy: The content was flagged by a content checker.",
            0.0,
        ),
        ("invalid", "failed", "fal_rejected: result HTTP 422: Unsupported image format", 0.0),
        ("error", "failed", "fal_job_failed: runner_disconnected: Runner disconnected", 0.0),
    ],
)
def test_refusals_and_failed_jobs_carry_the_servers_reason(server, outcome, status, reason, cost):
    server.behave("edit", Behaviour(outcome=outcome))
    journal = MemoryJournal()
    [result] = _editor().edit_many([EditRequest("r", _image(8), "edit", 8)], journal)

    assert result.status == status
    assert result.image is None
    assert result.reason.startswith(reason), result.reason
    assert result.cost_usd == pytest.approx(cost) == pytest.approx(journal.spent_usd())
    assert journal.load("r")["state"] == {"refused": "refused", "failed": "failed"}[status]
    if outcome == "policy":
        assert "model_moderated" in result.reason


def test_spend_cap_stops_new_submissions(server):
    journal = MemoryJournal()
    cap = 2.5 * PRICE  # two fit, the third would not
    results = _editor(concurrency=5, spend_cap_usd=cap).edit_many(_requests(5), journal)

    assert sorted(r.status for r in results) == ["failed"] * 3 + ["ok"] * 2
    for result in results:
        if result.status == "failed":
            assert result.reason.startswith("fal_spend_cap_reached:"), result.reason
            assert result.metadata["request_id"] is None
    assert sum(server.paid_submits.values()) == 2  # all five started at once; none slipped past
    assert journal.spent_usd() == pytest.approx(2 * PRICE)


@pytest.mark.slow
def test_rerun_fetches_a_paid_request_instead_of_paying_again_even_at_the_cap(server):
    # running at once: the cancel sent at the time-out comes too late, fal finishes and bills it
    server.behave("make the person 0", Behaviour(latency_s=1.0, queued_s=0.0))
    journal = MemoryJournal()
    [first] = _editor(timeout_s=0.3).edit_many(_requests(1), journal)
    assert first.reason.startswith("fal_timeout:") and first.metadata["cancelled"] is True
    paid_id = first.metadata["request_id"]

    # The cap is already used up by the paid request: it is still fetched, the new one is not sent.
    again, new = _editor(spend_cap_usd=PRICE).edit_many(_requests(2), journal)

    assert again.status == "ok" and again.metadata["resumed"] is True
    assert again.metadata["request_id"] == paid_id and again.metadata["submit_tries"] == 0
    assert np.array_equal(again.image, 255 - _image(0))
    assert new.status == "failed" and new.reason.startswith("fal_spend_cap_reached:")
    assert list(server.paid_submits.values()) == [1]
    assert journal.spent_usd() == pytest.approx(PRICE)


def test_an_id_the_server_does_not_know_is_submitted_again(server):
    journal = MemoryJournal()
    journal.save(
        "att-0",
        {"request_id": "expired-id", "endpoint": "fal-ai/nano-banana/edit", "state": "submitted"},
        cost_usd=PRICE,
    )
    [result] = _editor().edit_many(_requests(1), journal)

    assert result.status == "ok"
    assert result.metadata["lost_request_ids"] == ["expired-id"]
    assert result.metadata["resumed"] is False and result.metadata["submit_tries"] == 1
    assert list(server.paid_submits.values()) == [1]
    assert journal.load("att-0")["request_id"] == result.metadata["request_id"]


def test_duplicates_bad_inputs_and_running_event_loops(server):
    good = _requests(1)[0]
    bad = EditRequest("bad", _image(9).astype(np.float32), "edit", 9)
    editor = _editor()

    async def inside_a_loop():
        return editor.edit_many([good, bad, good]), await editor.aedit_many([good])

    (first, failed, same), (again,) = asyncio.run(inside_a_loop())

    assert first.status == same.status == again.status == "ok"
    assert failed.status == "failed" and failed.reason.startswith("fal_bad_input:")
    assert "float32" in failed.reason
    assert sum(server.paid_submits.values()) == 2  # once per edit_many call without a shared journal


def test_setup_error_without_key(server, monkeypatch):
    for name in ("FAL_KEY", "FAL_KEY_ID", "FAL_KEY_SECRET"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SetupError, match=r"FAL_KEY is not set.*export FAL_KEY="):
        _editor().prepare()


def test_setup_error_for_a_rejected_key(server, monkeypatch):
    monkeypatch.setenv("FAL_KEY", "wrong:key")
    with pytest.raises(SetupError, match=r"fal rejected the key in FAL_KEY \(HTTP 401"):
        _editor().edit_many(_requests(1))
    assert not server.submit_attempts


def test_setup_error_when_the_account_may_not_submit(server, monkeypatch):
    # The key passes the probe in prepare(); the first submission's 403 stops the batch.
    monkeypatch.setenv("FAL_KEY", server.locked_keys[0])
    with pytest.raises(SetupError, match=r"HTTP 403: User is locked. Reason: Exhausted"):
        _editor(concurrency=4).edit_many(_requests(6))
    assert not server.paid_submits


@pytest.mark.slow
def test_setup_error_when_fal_cannot_be_reached(server):
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    with server.patch_environment(host=closed):
        with pytest.raises(SetupError, match=f"cannot reach fal's queue at https://{closed}/"):
            _editor(timeout_s=1.5).prepare()


def test_setup_error_for_an_unknown_endpoint(server):
    with pytest.raises(SetupError) as error:
        _editor(endpoint="nano banana").prepare()
    assert "fal-ai/nano-banana/edit" in str(error.value)
    assert "fal-ai/nano-banana-pro/edit" in str(error.value)

    with pytest.raises(SetupError, match="no price known"):
        _editor(endpoint="fal-ai/flux-pro/kontext").prepare()

    ghost = _editor(endpoint="fal-ai/no-such-app/edit", prices_usd={"fal-ai/no-such-app/edit": 0.01})
    with pytest.raises(SetupError, match=r"no app at endpoint 'fal-ai/no-such-app/edit' \(HTTP 404"):
        ghost.edit_many(_requests(3))
    assert not server.paid_submits


def test_setup_error_without_fal_client(monkeypatch):
    monkeypatch.setitem(sys.modules, "fal_client", None)
    with pytest.raises(SetupError, match=r"pip install 'counterfactory\[remote\]'"):
        _editor().prepare()


def test_options_refuse_arguments_the_backend_owns():
    with pytest.raises(pydantic.ValidationError, match="output_format"):
        FalOptions(arguments={"output_format": "jpeg"})


_CHILD = """
import json, sys
import numpy as np
from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.fal import FalEditor, FalOptions
from counterfactory.manifests.ledger import Ledger

url, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
requests = [
    EditRequest(f"kill-{i}", np.random.default_rng(i).integers(0, 256, (40, 56, 3), dtype=np.uint8),
                f"edit number {i}", i)
    for i in range(n)
]
editor = FalEditor(FalOptions(concurrency=4, poll_interval_s=0.05, backoff_s=0.05, timeout_s=30))
results = editor.edit_many(requests, journal=Ledger(url).journal("fal"))
np.savez(out + ".npz", **{r.attempt_id: r.image for r in results if r.image is not None})
with open(out, "w") as f:
    json.dump([{"attempt_id": r.attempt_id, "status": r.status, "reason": r.reason,
                "resumed": r.metadata["resumed"], "request_id": r.metadata["request_id"]}
               for r in results], f)
"""


@pytest.mark.slow
def test_killed_batch_resumes_without_submitting_anything_twice(server, tmp_path):
    from counterfactory.manifests.ledger import Ledger

    url, out, n = f"sqlite:///{tmp_path / 'ledger.sqlite'}", str(tmp_path / "results.json"), 8
    journal = Ledger(url).journal("fal")  # creates the tables before the child opens them
    attempt_ids = [f"kill-{i}" for i in range(n)]
    env = {**os.environ, **server.env()}
    command = [sys.executable, "-c", _CHILD, url, out, str(n)]
    server.latency_s = 3.0  # long enough for the first four to be pending at the kill

    child = subprocess.Popen(command, env=env, cwd=REPO)
    deadline = time.monotonic() + 30
    while sum(1 for a in attempt_ids if (journal.load(a) or {}).get("state") == "submitted") < 4:
        assert child.poll() is None, "the child ended before it was killed"
        assert time.monotonic() < deadline, "the child never had four requests in flight"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = {a: journal.load(a) for a in attempt_ids}
    pending = {a: row["request_id"] for a, row in before.items() if row}
    assert len(pending) == 4 and sum(server.paid_submits.values()) == 4
    assert server.result_calls == 0 and not Path(out).exists()

    server.latency_s = 0.2
    subprocess.run(command, env=env, cwd=REPO, check=True, timeout=60)

    rows = json.loads(Path(out).read_text())
    images = np.load(out + ".npz")
    assert [r["status"] for r in rows] == ["ok"] * n, rows
    for i, row in enumerate(rows):
        expected = 255 - np.random.default_rng(i).integers(0, 256, (40, 56, 3), dtype=np.uint8)
        assert np.array_equal(images[row["attempt_id"]], expected)
        if row["attempt_id"] in pending:
            assert row["resumed"] is True and row["request_id"] == pending[row["attempt_id"]]
        else:
            assert row["resumed"] is False
    assert len(server.paid_submits) == n and set(server.paid_submits.values()) == {1}
    assert set(server.submit_attempts.values()) == {1}
    assert journal.spent_usd() == pytest.approx(n * PRICE) == pytest.approx(server.billed_usd())


def test_requests_the_aspect_ratio_nearest_the_source(server, grace):
    # grace is 512 x 600 (0.853): 4:5 (0.8) is nearer than 1:1 or 3:4 on a log scale
    wide = _image(3, (300, 640))  # 2.13: nearest 21:9 (2.33) beats 16:9 (1.78)
    editor = _editor()
    editor.prepare()
    results = editor.edit_many([EditRequest("g", grace, "p", 1), EditRequest("w", wide, "p", 2)])
    sent = [server.jobs[r.metadata["request_id"]].arguments["aspect_ratio"] for r in results]
    assert sent == ["4:5", "21:9"]
    assert editor.lineage()["aspect_ratio"] == "nearest_to_source"
    # switched off, or set by the spec, nothing is chosen for the user
    assert _editor(match_aspect_ratio=False).lineage()["aspect_ratio"] is None
    assert _editor(arguments={"aspect_ratio": "1:1"}).lineage()["aspect_ratio"] is None


# -- abandoned requests are cancelled at fal ----------------------------------------------

QUEUED = Behaviour(latency_s=30.0, queued_s=30.0)  # waits in fal's queue far beyond any test


def test_a_timed_out_queued_request_is_cancelled_unbilled_and_resubmitted_as_the_same_attempt(server):
    server.behave("make the person 0", QUEUED)
    journal = MemoryJournal()
    [first] = _editor(timeout_s=0.3).edit_many(_requests(1), journal)
    cancelled_id = first.metadata["request_id"]
    assert first.reason.startswith("fal_timeout:") and first.metadata["cancelled"] is True
    # fal stopped it in its queue: it holds no slot and will never bill
    assert server.cancelled == {cancelled_id} and server.stats()["in_flight"] == 0
    assert server.billed_usd() == 0
    assert journal.load("att-0")["state"] == "cancelled"
    assert journal.spent_usd() == pytest.approx(PRICE)  # still committed until fal's word on it

    server.behave("make the person 0", Behaviour(latency_s=0.05))
    [again] = _editor().edit_many(_requests(1), journal)
    # fal reports the cancelled job as ended without a result: the same attempt (same seed)
    # is submitted again, and it is bought once in all
    assert again.status == "ok" and again.metadata["lost_request_ids"] == [cancelled_id]
    assert again.metadata["seed"] == 0 and again.metadata["submit_tries"] == 1
    assert np.array_equal(again.image, 255 - _image(0))
    assert list(server.billed_per_payload().values()) == [1]
    assert journal.spent_usd() == pytest.approx(PRICE) == pytest.approx(server.billed_usd())


def test_status_polls_that_give_up_cancel_the_request(server):
    server.behave("make the person 0", Behaviour(latency_s=30.0, queued_s=30.0, status_errors=(503,) * 5))
    journal = MemoryJournal()
    [result] = _editor(max_retries=1).edit_many(_requests(1), journal)
    assert result.reason.startswith("fal_unavailable: status failed 2 time(s)"), result.reason
    assert result.metadata["cancelled"] is True and server.cancelled == {result.metadata["request_id"]}
    assert journal.load("att-0")["state"] == "cancelled" and server.billed_usd() == 0


@pytest.mark.slow
def test_a_cancelled_batch_cancels_its_requests_at_fal(server):
    from counterfactory.manifests.paid.fal_cancel import open_requests

    for i in range(3):
        server.behave(f"make the person {i}", QUEUED)
    journal = MemoryJournal()
    editor = _editor(concurrency=3)

    async def give_up() -> None:
        await asyncio.wait_for(editor.aedit_many(_requests(3), journal), timeout=1.0)

    with pytest.raises(TimeoutError):
        asyncio.run(give_up())
    rows = [journal.load(f"att-{i}") for i in range(3)]
    assert [r["state"] for r in rows] == ["cancelled"] * 3
    assert {r["cancelled_because"] for r in rows} == {"call_cancelled"}
    assert server.cancelled == {r["request_id"] for r in rows} and server.billed_usd() == 0
    assert open_requests() == []


_STOPPED_CHILD = """
import sys
import numpy as np
from counterfactory.flows.stopping import install_stop_handlers
from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.fal import FalEditor, FalOptions
from counterfactory.manifests.ledger import Ledger

install_stop_handlers()  # what the command line installs
url, n = sys.argv[1], int(sys.argv[2])
requests = [
    EditRequest(f"stop-{i}", np.random.default_rng(i).integers(0, 256, (40, 56, 3), dtype=np.uint8),
                f"stop number {i}", i)
    for i in range(n)
]
editor = FalEditor(FalOptions(concurrency=4, poll_interval_s=0.05, backoff_s=0.05, timeout_s=60))
results = editor.edit_many(requests, journal=Ledger(url).journal("fal"))
print("statuses", sorted(r.status for r in results))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill", "int"])
def test_a_stopped_run_cancels_what_it_left_in_fals_queue(server, tmp_path, how):
    """SIGKILL is the reproduction (nothing can cancel: the four requests stay in fal's queue,
    to run and bill for nobody); SIGINT (and SIGTERM: the same handler) cancels them before the
    process exits, and the next run buys each attempt once: a cancelled job that was already
    running is fetched."""
    from counterfactory.manifests.ledger import Ledger

    url, n = f"sqlite:///{tmp_path / 'ledger.sqlite'}", 6
    journal = Ledger(url).journal("fal")
    ids = [f"stop-{i}" for i in range(n)]
    # the first one is running when the stop comes (the cancel cannot stop it), three are queued
    server.behave("stop number 0", Behaviour(latency_s=2.0, queued_s=0.0))
    for i in (1, 2, 3):
        server.behave(f"stop number {i}", QUEUED)
    env = {**os.environ, **server.env()}
    command = [sys.executable, "-c", _STOPPED_CHILD, url, str(n)]
    child = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while sum(1 for a in ids if (journal.load(a) or {}).get("state") == "submitted") < 4:
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the child never had four requests in flight"
        time.sleep(0.05)
    stopped_at = time.monotonic()
    child.send_signal(how)
    _, stderr = child.communicate(timeout=30)
    assert time.monotonic() - stopped_at < 5
    submitted = {a: journal.load(a)["request_id"] for a in ids[:4]}

    if how == signal.SIGKILL:
        assert child.returncode == -signal.SIGKILL
        assert server.stats()["cancel_calls"] == 0
        assert not any(server.jobs[r].cancelled for r in submitted.values())  # queued, to be billed
        assert all(journal.load(a)["state"] == "submitted" for a in ids[:4])
        return
    assert child.returncode == 128 + how, stderr
    assert "cancelled 4 paid fal request(s) in flight" in stderr
    assert server.cancelled == set(submitted.values())
    assert all(journal.load(a)["state"] == "cancelled" for a in ids[:4])
    assert all(server.jobs[submitted[a]].cancelled for a in ids[1:4])  # stopped in the queue
    assert not server.jobs[submitted["stop-0"]].cancelled  # it was running; it finishes and bills

    for i in range(1, 4):
        server.behave(f"stop number {i}", Behaviour(latency_s=0.1))
    time.sleep(max(0.0, 2.2 - (time.monotonic() - stopped_at)))  # the running one has finished
    resumed = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "statuses ['ok', 'ok', 'ok', 'ok', 'ok', 'ok']" in resumed.stdout
    assert journal.load("stop-0")["request_id"] == submitted["stop-0"]  # fetched, not bought again
    assert all(journal.load(a)["request_id"] != submitted[a] for a in ids[1:4])  # resubmitted
    billed = server.billed_per_payload()
    assert len(billed) == n and set(billed.values()) == {1}
    assert journal.spent_usd() == pytest.approx(n * PRICE) == pytest.approx(server.billed_usd())


# -- a status-poll outage: the slot stays with the request until fal says it ended ---------

# Running at once (a cancel cannot stop it), and for longer than the polls' retry budget
# (max_retries=0: one failed poll gives up) but less than the outage.
RUNNING = Behaviour(latency_s=0.08, queued_s=0.0)
OUTAGE_S = 0.15


def _outage_round(server, ask, *, bound: int, n: int, outage_s: float) -> None:
    """An outage of status polls longer than the retry budget, then a resume.

    ``ask(indices, journal)`` sends the calls of those indices and returns ``(status, reason,
    request id)`` per call; the server's jobs were reset and their behaviours set by the caller.
    """
    journal = MemoryJournal()
    server.status_outage(outage_s)
    first = ask(list(range(n)), journal)
    gave_up = [i for i, (status, _, _) in enumerate(first) if status != "ok"]
    # the polls gave up (no retry is left); each such call is paid and pending
    assert gave_up, first
    for i in gave_up:
        assert first[i][1].startswith("fal_unavailable: status failed"), first[i]
        assert first[i][2] is not None
    time.sleep(server.outage_left_s())  # a run waits before it fetches again (RESUME_WAITS_S)
    again = ask(gave_up, journal)  # and fetches them by their journalled ids
    assert [status for status, _, _ in again] == ["ok"] * len(gave_up), again
    assert [r for _, _, r in again] == [first[i][2] for i in gave_up]
    assert server.stats()["outage_answers"] > 0
    # fal never ran more than the bound of ours at once, and ran that many (the bound is used)
    assert server.max_unfinished() == bound
    # nothing was bought twice: one accepted submission per payload, each billed once
    assert len(server.paid_submits) == n and set(server.paid_submits.values()) == {1}
    assert set(server.billed_per_payload().values()) == {1}


# the first round in the quick tier, all twenty in the slow one
@pytest.mark.parametrize("rep", [0, *(pytest.param(r, marks=pytest.mark.slow) for r in range(1, 20))])
def test_a_status_outage_never_runs_more_than_the_bound_at_fal(server, rep):
    """Issue 25. Every status poll answers 503 for longer than the retry budget. The jobs are
    running (a cancel cannot stop them), so a slot freed when the polls gave up let a further
    request start while fal still ran the first: bound + 1 at fal. Twenty rounds."""
    bound, n = 3, 6
    requests = [EditRequest(f"o{rep}-{i}", _image(60 + i, (16, 16)), f"outage {rep} {i}", i) for i in range(n)]
    for r in requests:
        server.behave(r.prompt, RUNNING)
    editor = _editor(concurrency=bound, max_retries=0, backoff_s=0.002, poll_interval_s=0.003)
    editor.prepare()  # the key check polls a status too: before the outage

    def ask(indices, journal):
        results = editor.edit_many([requests[i] for i in indices], journal)
        return [(r.status, r.reason, r.metadata["request_id"]) for r in results]

    _outage_round(server, ask, bound=bound, n=n, outage_s=OUTAGE_S)
    assert editor.queue.parked() == []  # every slot came back once fal answered again


@pytest.mark.slow
def test_vlm_questions_keep_their_slots_through_a_status_outage(server):
    from counterfactory.validation.backends.vlm import VisionAsker
    from counterfactory.validation.scoring.fal_backend import FalAnswerOptions, FalVisionRouter

    bound, n, prompt = 2, 5, "what group does this person present as?"
    for rep in range(5):
        server.reset()
        server.behave(prompt, RUNNING)
        options = FalAnswerOptions(
            model="google/gemini-2.5-flash",
            backoff_s=0.002,
            poll_interval_s=0.003,
            timeout_s=10.0,
            estimated_usd_per_question=0.001,
        )
        client = VisionAsker(
            FalVisionRouter(options), concurrency=bound, spend_cap_usd=None, max_retries=0, decoding={}
        )
        client.client.prepare()
        images = [_image(200 + 10 * rep + i, (16, 16)) for i in range(n)]

        def ask(indices, journal, client=client, images=images):
            answers = client.ask_many([images[i] for i in indices], prompt, journal)
            return [(a.status, a.reason, a.request_id) for _, a in answers]

        _outage_round(server, ask, bound=bound, n=n, outage_s=OUTAGE_S)
        assert client.client.parked() == []
        client.close()


@pytest.mark.slow
def test_the_prefect_fal_slot_is_held_until_fal_says_the_request_ended(server):
    """``run.fal_max_concurrency: 3`` with an editor allowed more (``concurrency=6``): the
    bound is the Prefect limit's, whose slots the batch holds (``flows/limits.py``). A batch
    whose polls gave up keeps them until fal says its requests ended, so the next batch cannot
    start a fourth request meanwhile."""
    from counterfactory.flows.limits import LimitedEditor, apply_limits
    from counterfactory.flows.server import prefect_api

    bound, n = 3, 6
    requests = [EditRequest(f"p-{i}", _image(80 + i, (16, 16)), f"prefect outage {i}", i) for i in range(n)]
    for r in requests:  # longer than a Prefect slot takes to be freed and taken again
        server.behave(r.prompt, Behaviour(latency_s=1.0, queued_s=0.0))
    editor = _editor(concurrency=2 * bound, max_retries=0, backoff_s=0.002, poll_interval_s=0.003)
    editor.prepare()
    with prefect_api():
        apply_limits({"test-fal-outage": bound})
        limited = LimitedEditor(editor, "test-fal-outage", bound, occupy_per_request=True)

        def ask(indices, journal):
            results = limited.edit_many([requests[i] for i in indices], journal)
            return [(r.status, r.reason, r.metadata["request_id"]) for r in results]

        _outage_round(server, ask, bound=bound, n=n, outage_s=1.5)
    assert editor.queue.parked() == []


def test_a_call_waits_for_a_parked_slot_then_fails_without_submitting(server):
    """One slot, taken by a request whose polls gave up and whose cancel fal only accepted (it
    runs on): the next call waits for fal's word for ``timeout_s``, then fails unsubmitted.
    Once fal answers again, the parked slot comes back."""
    running, waiting = EditRequest("r", _image(90), "still running", 1), EditRequest("w", _image(91), "waits", 2)
    server.behave(running.prompt, Behaviour(latency_s=0.4, queued_s=0.0))
    editor = _editor(concurrency=1, max_retries=0, backoff_s=0.002, poll_interval_s=0.003, timeout_s=0.2)
    editor.prepare()
    server.status_outage(0.6)
    first, second = editor.edit_many([running, waiting], MemoryJournal())

    assert first.reason.startswith("fal_unavailable: status failed"), first.reason
    assert first.metadata["cancelled"] is True and first.metadata["pending_request_id"]
    assert second.status == "failed" and second.metadata["request_id"] is None
    assert second.reason.startswith("fal_unavailable: all 1 slot(s) held for timeout_s=0.2 s"), second.reason
    assert len(server.paid_submits) == 1 and server.max_unfinished() == 1
    assert editor.queue.parked() == [first.metadata["request_id"]]
    assert editor.queue.wait_parked(timeout_s=5.0) == []  # the outage ends, the job finishes
    assert editor.queue.parked() == []
