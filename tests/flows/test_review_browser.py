"""End to end in Debian's Chromium, driven by Playwright: a reviewer signs in, reviews the whole
queue with the keyboard only, runs the blinded spot-the-edit test, and the next release carries
the decisions with zero editor calls.

Set COUNTERFACTORY_UPDATE_SCREENSHOT=1 to refresh docs/review-page.png, the README's screenshot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import text

from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import review_queue
from counterfactory.manifests.spec import load_spec
from tests.conftest import REPO
from tests.flows.review_setup import run_and_publish, serving, write_spec

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = REPO / "docs" / "review-page.png"


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (Playwright's own browser download is not used)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _add_reviewer(out: Path, spec: Path, name: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "counterfactory.flows.cli",
            "review",
            "add-reviewer",
            name,
            "--out",
            str(out),
            "--spec",
            str(spec),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    token = done.stdout.strip().splitlines()[-1]
    assert len(token) >= 40
    return token


def _queue(out: Path, spec: Path):
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        return review_queue(ledger, load_spec(spec).review)
    finally:
        ledger.close()


def test_keyboard_review_blinded_mode_and_the_next_release(browser, run_copy, tmp_path):
    """What the page must show comes from the run's own review queue (needs_review items plus
    the audit sample, rate 1.0): a recalibration that moves a verdict changes what is expected,
    not whether the page shows it."""
    spec, out = run_copy
    queue = _queue(out, spec)
    by_id = {item.attempt_id: item for item in queue}
    n = len(queue)
    assert n >= 3 and any(i.verdict == "accepted" for i in queue), [(i.cell_id, i.verdict) for i in queue]
    # the blinded test shows the final candidates a release could carry (gate verdicts)
    blinded = sum(i.final and i.verdict in ("accepted", "needs_review") for i in queue)
    head = queue[0]
    token = _add_reviewer(out, spec, "ann")
    with serving(out, spec) as base:
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(120_000)
        page.goto(f"{base}/login")
        page.keyboard.type(token)
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.url.endswith("/queue")
        assert page.inner_text("#left") == str(n)
        first = page.get_attribute("#item", "data-attempt")
        assert first == head.attempt_id
        assert page.inner_text("#gate-verdict") == head.verdict
        for code in head.reasons[:1]:
            assert code in page.inner_text("#gate-reasons")
        # the views, by key: mask overlay, heat map, face zoom, flicker
        page.keyboard.press("m")
        assert page.is_visible("#pane-candidate .overlay")
        page.keyboard.press("h")
        assert page.is_visible("#img-heat")
        page.wait_for_function("document.getElementById('img-candidate').complete")
        page.keyboard.press("z")
        zoom = page.evaluate(
            """() => { const c = document.getElementById('zoom-candidate');
                       const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                       let lit = 0; for (let i = 0; i < d.length; i += 4) lit += d[i] + d[i + 1] + d[i + 2] > 0;
                       return [c.width, c.height, lit]; }"""
        )
        assert zoom[0] > 50 and zoom[1] > 50 and zoom[2] > zoom[0] * zoom[1] // 2
        shot = tmp_path / "review-page.png"
        # the panes are at full resolution; the screenshot zooms the page out to show them all
        page.evaluate("document.body.style.zoom = '0.35'")
        page.screenshot(path=str(shot))
        page.evaluate("document.body.style.zoom = ''")
        with Image.open(shot) as im:
            assert im.size == (1500, 950)
        if os.environ.get("COUNTERFACTORY_UPDATE_SCREENSHOT"):
            SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
        page.keyboard.press("f")
        seen = set()
        for _ in range(8):
            page.wait_for_timeout(230)
            # both read in one script, so a swap cannot fall between them
            seen.add(
                tuple(
                    page.evaluate(
                        "() => ['img-source', 'img-candidate'].map(id => "
                        "document.getElementById(id).getBoundingClientRect().width > 0)"
                    )
                )
            )
        assert seen == {(True, False), (False, True)}  # one at a time, in the same place, both shown
        page.keyboard.press("f")

        # decide everything with the keyboard: skip the first, come back to it at the end;
        # rejected: reject as a face deformation; the first accepted: reject with a typed
        # reason ("other"); everything else: accept
        with page.expect_navigation():
            page.keyboard.press("s")
        assert page.inner_text("#left") == str(n) and page.get_attribute("#item", "data-attempt") != first
        decided = {}
        overridden = []
        while page.query_selector("#item") is not None:
            attempt = page.get_attribute("#item", "data-attempt")
            verdict = page.inner_text("#gate-verdict")
            condition = page.inner_text("#condition")
            item = by_id[attempt]  # the page shows what the queue holds
            assert verdict == item.verdict
            assert all(value in condition for value in item.condition.values())
            if verdict == "rejected":
                page.keyboard.press("r")
                with page.expect_navigation():
                    page.keyboard.press("2")  # face deformation
                decided[attempt] = "reject"
            elif verdict == "accepted" and not overridden:
                page.keyboard.press("r")
                page.keyboard.press("8")  # other: type what, then Enter
                page.keyboard.type("halo along the hairline")
                with page.expect_navigation():
                    page.keyboard.press("Enter")
                overridden.append(attempt)
                decided[attempt] = "reject"
            else:
                with page.expect_navigation():
                    page.keyboard.press("a")
                decided[attempt] = "accept"
        assert page.is_visible("#empty") and page.inner_text("#left") == "0"
        assert len(decided) == n and list(decided)[-1] == first and set(decided) == set(by_id)
        assert len(overridden) == 1

        # blinded spot-the-edit: no labels; click where the edit is, or say "not edited"
        with page.expect_navigation():
            page.keyboard.press("b")
        trials = 0
        while page.query_selector("#trial") is not None:
            body = page.inner_text("body")
            assert "candidate" not in body and "source" not in body.replace("source", "", 0)
            if trials == 0:
                with page.expect_navigation():
                    page.keyboard.press("n")
            else:
                box = page.query_selector("#blind-image").bounding_box()
                with page.expect_navigation():
                    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.3)
            trials += 1
        assert trials == blinded
        stats = json.loads(page.goto(f"{base}/stats").text())
        assert stats["queue"]["resolved"] == n and stats["spot_the_edit"]["overall"]["trials"] == blinded

    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    with ledger.engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT r.name, d.attempt_id, d.decision, d.reason, d.note, d.mode FROM review_decisions d "
                "JOIN reviewers r USING (reviewer_id) ORDER BY d.decision_id"
            )
        ).all()
        trials_rows = c.execute(text("SELECT shown, said_edited, click_x FROM spot_trials")).all()
    ledger.close()
    assert [r.decision for r in rows].count("skip") == 1 and len(rows) == n + 1
    assert {r.name for r in rows} == {"ann"}
    assert {(r.attempt_id, r.reason, r.note) for r in rows if r.reason == "other"} == {
        (overridden[0], "other", "halo along the hairline")
    }
    assert len(trials_rows) == blinded and sum(t.click_x is not None for t in trials_rows) == max(blinded - 1, 0)

    # the next release: zero editor calls, decisions in the manifest rows
    sealed, calls = run_and_publish(write_spec(spec.parent, version="0.2.0"), out)
    assert calls == 0
    items = {r["item_id"]: r for r in map(json.loads, (sealed.path / "items.jsonl").read_text().splitlines())}
    manifest = {r["item_id"]: r for r in map(json.loads, (sealed.path / "manifest.jsonl").read_text().splitlines())}
    reviewed = items[first]
    assert reviewed["review"]["gate_verdict"] == head.verdict
    assert [d["decision"] for d in reviewed["review"]["decisions"]] == ["skip", decided[first]]
    assert reviewed["review"]["decisions"][1]["reviewer"] == "ann"
    if head.final:
        expected = "accepted" if decided[first] == "accept" else "rejected"
        assert reviewed["status"] == expected and (first in manifest) == (expected == "accepted")
    override = items[overridden[0]]
    assert override["status"] == "rejected" and override["item_id"] not in manifest
    assert override["reasons"][0] == "review_rejected: other"
    stats = json.loads((sealed.path / "stats.json").read_text())
    assert stats["editor_calls_this_run"] == 0
    assert stats["review"]["waiting"]["total"] == 0
    assert stats["review"]["override"]["accepted"]["hits"] == 1
    assert 'id="review-progress"' in (sealed.path / "report.html").read_text()
    # the re-run asks nobody again: every queued candidate is still decided
    after = _queue(out, spec)
    assert len(after) == n and all(i.resolution.state == "resolved" for i in after)
