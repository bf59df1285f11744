"""The review site over a real run: bad input is refused and changes nothing, on SQLite and on
PostgreSQL two reviewers deciding the same item at the same moment are both kept.

The browser tests are in test_review_browser.py.
"""

from __future__ import annotations

import http.client
import io
import re
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image
from sqlalchemy import text

from counterfactory.flows.review_app import ReviewSite
from counterfactory.manifests.ledger import Base, Ledger
from counterfactory.manifests.review import add_reviewer, review_queue
from counterfactory.manifests.spec import load_spec
from counterfactory.validation.review_stats import review_summary
from tests.conftest import REPO
from tests.flows.review_setup import free_port, serving
from tests.manifests.pg import postgres_server

pytestmark = pytest.mark.slow


def _counts(url: str) -> tuple[int, int]:
    ledger = Ledger(url)
    try:
        with ledger.engine.connect() as c:
            return (
                c.execute(text("SELECT count(*) FROM review_decisions")).scalar_one(),
                c.execute(text("SELECT count(*) FROM spot_trials")).scalar_one(),
            )
    finally:
        ledger.close()


def _raw_get(base: str, path: str, cookie: str) -> tuple[int, bytes]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", path, headers={"Cookie": cookie})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _page(client: httpx.Client) -> dict[str, str]:
    page = client.get("/queue")
    assert page.status_code == 200, page.text[:500]
    found = re.search(r'data-attempt="(\w+)" data-seen="(\d+)" data-csrf="(\w+)"', page.text)
    assert found, page.text[:2000]
    return dict(zip(("attempt_id", "seen", "csrf"), found.groups()))


def test_bad_input_gets_a_clear_4xx_and_changes_nothing(run_copy):
    spec, out = run_copy
    url = f"sqlite:///{out / 'ledger.sqlite'}"
    ledger = Ledger(url)
    token = add_reviewer(ledger, "ann")
    ledger.close()
    with serving(out, spec) as base:
        anon = httpx.Client(base_url=base, timeout=120)
        wrong = httpx.Client(base_url=base, timeout=120, headers={"Authorization": "Bearer not-a-token"})
        for client, phrase in ((anon, "token is required"), (wrong, "not a reviewer")):
            for path in ("/queue", "/blind", "/stats", f"/img/{'0' * 64}", "/static/review.js"):
                r = client.get(path)
                assert r.status_code == 401 and phrase in r.text, (path, r.status_code)
            r = client.post("/api/decisions", data={"attempt_id": "0" * 64, "decision": "accept", "seen": 0})
            assert r.status_code == 401
        ann = httpx.Client(base_url=base, timeout=120)
        assert ann.post("/login", data={"token": token}).status_code == 303
        form = _page(ann)
        # images only by sha256 from the store: no path reaches the filesystem. Sent raw
        # (http.client), so that no client-side normalisation hides the dots from the server.
        cookie = f"cf_review={token}"
        secret_paths = [
            "/img/../../ledger.sqlite",
            "/img/..%2F..%2Fledger.sqlite",
            "/img/%2Fetc%2Fpasswd",
            "/img//etc/passwd",
            "/img/" + str(out / "ledger.sqlite"),
            "/img/" + "A" * 64,
            "/img/" + "0" * 63,
        ]
        for path in secret_paths:
            status, body = _raw_get(base, path, cookie)
            assert 400 <= status < 500 and b"SQLite" not in body and b"root:" not in body, (path, status)
        r = ann.get("/img/" + "0" * 64)
        assert r.status_code == 404 and "no image" in r.json()["error"]
        good = dict(form, decision="accept")
        refusals = [
            ({**good, "attempt_id": "f" * 64}, {}, 404),  # unknown item
            ({**good, "attempt_id": "../../ledger"}, {}, 422),  # malformed id
            ({k: v for k, v in good.items() if k != "decision"}, {}, 422),  # missing field
            ({**good, "seen": "many"}, {}, 422),
            ({**good, "decision": "reject", "reason": "dislike"}, {}, 400),
            ({**good, "csrf": ""}, {}, 403),  # no CSRF token
            ({**good, "csrf": "0" * 64}, {}, 403),
            (good, {"Origin": "http://evil.example"}, 403),  # cross-site, even with the right token
            (good, {"Sec-Fetch-Site": "cross-site"}, 403),
        ]
        for data, headers, status in refusals:
            r = ann.post("/api/decisions", data=data, headers=headers)
            assert r.status_code == status, (data, headers, r.status_code, r.text)
        r = ann.post("/api/decisions", json=good)  # not a form
        assert r.status_code == 422
        r = ann.post("/api/spot", data={"trial": "nope", "answer": "edited", "csrf": form["csrf"]})
        assert r.status_code == 404
        r = ann.post("/api/spot", data={"trial": "nope", "answer": "maybe", "csrf": form["csrf"]})
        assert r.status_code == 422
        trial = re.search(r'data-trial="([\w-]+)"', ann.get("/blind").text).group(1)
        for bad in ({"x": "nan", "y": "1"}, {"x": "inf", "y": "1"}):
            r = ann.post("/api/spot", data={"trial": trial, "answer": "edited", "csrf": form["csrf"], **bad})
            assert r.status_code == 400, bad
        r = ann.post(
            "/api/spot",
            data={"trial": trial, "answer": "edited", "csrf": form["csrf"]},
            headers={"Origin": "http://evil.example"},
        )
        assert r.status_code == 403
        r = ann.post("/login", data={"token": token}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        assert _counts(url) == (0, 0)
        # and the same decision, well formed, is taken once
        assert ann.post("/api/decisions", data=good).status_code == 200
        r = ann.post("/api/decisions", data=good)
        assert r.status_code == 409 and "already" in r.json()["error"]
    assert _counts(url) == (1, 0)


def _copy_ledger(source_url: str, target_url: str) -> None:
    """The run's sources, attempts and candidates, written to another database through the ledger API."""
    src, dst = Ledger(source_url), Ledger(target_url)
    try:
        for s in src.sources():
            dst.record_source(s.source_id, s.path, sha256=s.sha256, status=s.status, reason=s.reason, meta=s.meta)
        for a in src.attempts():
            dst.start_attempt(
                a.attempt_id,
                cell_id=a.cell_id,
                attempt_no=a.attempt_no,
                seed=a.seed,
                backend=a.backend,
                lineage=a.lineage,
                prompt=a.prompt,
            )
            dst.finish_attempt(a.attempt_id, status=a.status, output_sha256=a.output_sha256, reason=a.reason)
        for c in src.candidates():
            dst.record_candidate(
                c.attempt_id,
                cell_id=c.cell_id,
                judge_key=c.judge_key,
                image_sha256=c.image_sha256,
                alignment=c.alignment,
                verdict=c.verdict,
                reasons=c.reasons,
                gates=c.gates,
            )
    finally:
        src.close()
        dst.close()


def test_postgres_two_reviewers_at_the_same_moment_are_both_kept(run_copy):
    spec_path, out = run_copy
    with postgres_server() as pg:
        _copy_ledger(f"sqlite:///{out / 'ledger.sqlite'}", pg)
        spec = yaml.safe_load(spec_path.read_text())
        spec["ledger_url"] = pg
        spec_path.write_text(yaml.safe_dump(spec))
        ledger = Ledger(pg)
        tokens = {name: add_reviewer(ledger, name) for name in ("ann", "bob", "cat")}
        ledger.close()
        with serving(out, spec_path) as base:
            clients = {}
            for name, token in tokens.items():
                clients[name] = httpx.Client(base_url=base, timeout=120)
                assert clients[name].post("/login", data={"token": token}).status_code == 303
            forms = {name: _page(clients[name]) for name in ("ann", "bob")}
            assert forms["ann"]["attempt_id"] == forms["bob"]["attempt_id"]
            barrier = threading.Barrier(2)
            answers = {}

            def decide(name, fields):
                data = dict(forms[name], **fields)
                barrier.wait()
                answers[name] = clients[name].post("/api/decisions", data=data)

            threads = [
                threading.Thread(target=decide, args=("ann", {"decision": "accept"})),
                threading.Thread(target=decide, args=("bob", {"decision": "reject", "reason": "skin_tone_shift"})),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert {n: r.status_code for n, r in answers.items()} == {"ann": 200, "bob": 200}
            # the disagreement is visible: the item comes back, flagged, to a third reviewer
            page = clients["cat"].get("/queue").text
            assert f'data-attempt="{forms["ann"]["attempt_id"]}"' in page and 'id="disputed"' in page
            assert "ann accept" in page and "bob reject (skin_tone_shift)" in page
            stats = clients["cat"].get("/stats").json()
            assert stats["queue"]["disputed"] == 1
            third = _page(clients["cat"])
            r = clients["cat"].post("/api/decisions", data=dict(third, decision="reject", reason="skin_tone_shift"))
            assert r.json() == {"state": "resolved", "outcome": "rejected", "votes": 3}
        engine = Ledger(pg).engine
        with engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT r.name, d.decision, d.mode FROM review_decisions d JOIN reviewers r USING (reviewer_id) "
                    "ORDER BY d.decision_id"
                )
            ).all()
        assert sorted(rows[:2]) == [("ann", "accept", "queue"), ("bob", "reject", "queue")]
        assert rows[2] == ("cat", "reject", "tiebreak")
        Base.metadata.drop_all(engine)
        engine.dispose()


def test_spot_the_edit_scores_clicks_against_the_dilated_edit_mask(run_copy):
    spec_path, out = run_copy
    spec = load_spec(spec_path)
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    tokens = [add_reviewer(ledger, name) for name in ("ann", "bob")]
    # each reviewer sees every final candidate a release could carry (gate verdicts), once
    blinded = sum(i.final and i.verdict in ("accepted", "needs_review") for i in review_queue(ledger, spec.review))
    assert blinded >= 1
    # the masks as the site computes them, keyed by image size (the two templates differ)
    site = ReviewSite(out, spec, ledger)
    regions = {}
    for template in ("grace_hopper", "biden_blue_room"):
        region = site.template_view(template).spot_region
        regions[(region.shape[1], region.shape[0])] = region
    by_click = {}
    with serving(out, spec_path) as base:
        for token, inside in zip(tokens, (True, False)):
            client = httpx.Client(base_url=base, timeout=120)
            assert client.post("/login", data={"token": token}).status_code == 303
            answers = []
            while True:
                page = client.get("/blind").text
                found = re.search(r'data-trial="([\w-]+)" data-csrf="(\w+)"', page)
                if not found:
                    break
                trial, csrf = found.groups()
                assert "candidate" not in page  # no label says what is shown
                with Image.open(io.BytesIO(client.get(f"/blind/image/{trial}").content)) as im:
                    region = regions[im.size]
                ys, xs = np.nonzero(region)
                x, y = (float(np.median(xs)), float(np.median(ys))) if inside else (2.0, 2.0)
                assert bool(region[int(y), int(x)]) is inside
                r = client.post("/api/spot", data={"trial": trial, "csrf": csrf, "answer": "edited", "x": x, "y": y})
                answers.append(r.json())
                # a trial is answered once
                again = client.post("/api/spot", data={"trial": trial, "csrf": csrf, "answer": "edited"})
                assert again.status_code == 404
            assert len(answers) == blinded
            by_click[inside] = answers
            for a in answers:
                assert a["localised"] == (inside if a["shown"] == "candidate" else None)
    stats = review_summary(ledger, spec.review)["spot_the_edit"]["overall"]
    ledger.close()
    assert stats["trials"] == 2 * blinded
    # ann clicked inside the mask every time, bob outside: only ann's candidate trials are localised
    shown = {k: sum(a["shown"] == "candidate" for a in v) for k, v in by_click.items()}
    assert stats["localisation"]["n"] == shown[True] + shown[False]
    assert stats["localisation"]["hits"] == shown[True]
    # everyone said "edited": right exactly on the candidate trials
    assert stats["detection"]["hits"] == shown[True] + shown[False]


def test_review_serve_command_uses_the_newest_release_spec(run_copy):
    spec_path, out = run_copy
    port = free_port()
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    token = add_reviewer(ledger, "ann")
    n = len(review_queue(ledger, load_spec(spec_path).review))
    ledger.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "counterfactory.flows.cli", "review", "serve", str(out), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/stats", headers={"Authorization": f"Bearer {token}"})
                break
            except httpx.TransportError:
                assert server.poll() is None and time.time() < deadline, server.stdout.read()[-2000:]
                time.sleep(0.3)
        assert r.status_code == 200 and r.json()["queue"]["total"] == n
    finally:
        server.terminate()
        server.wait(timeout=30)
    # a folder with no release and no --spec: told what to pass
    empty = out.parent / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory.flows.cli", "review", "serve", str(empty)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--spec" in done.stderr


def test_queue_filters_and_counter(run_copy):
    spec_path, out = run_copy
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    token = add_reviewer(ledger, "ann")
    # expected counts from the ledger, so the test follows the gates' verdicts on these photos
    queue = review_queue(ledger, load_spec(spec_path).review)
    ledger.close()
    n_all = len(queue)
    assert n_all >= 2

    def expect(keep) -> int:
        return sum(1 for i in queue if keep(i))

    with serving(out, spec_path) as base:
        client = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {token}"})

        def view(**params):
            page = client.get("/queue", params=params).text
            left = int(re.search(r'<b id="left">(\d+)</b>', page).group(1))
            verdict = re.search(r'id="gate-verdict">(\w+)<', page)
            return left, verdict.group(1) if verdict else None, page

        left, _, page = view()
        # the gate record with metrics and thresholds is on the page
        assert left == n_all and "detection_score" in page and "min_detection_score" in page
        for verdict in ("needs_review", "accepted", "rejected"):
            n = expect(lambda i, v=verdict: i.verdict == v)
            assert view(verdict=verdict)[:2] == (n, verdict if n else None)
        left, _, page = view(template="grace_hopper")
        assert left == expect(lambda i: i.template_id == "grace_hopper") and "<b>grace_hopper</b>" in page
        # a reason some queued item carries: the filter shows exactly the items carrying it
        code = next(r for i in queue for r in i.reasons)
        n = expect(lambda i: code in i.reasons)
        assert n >= 1 and view(reason=code)[0] == n
        assert view(condition="female · White")[0] == expect(lambda i: i.condition["race"] == "White")
        assert view(state="disputed")[:2] == (0, None) and view(state="open")[0] == n_all
        form = _page(client)
        client.post("/api/decisions", data=dict(form, decision="accept"))
        assert view()[0] == n_all - 1
