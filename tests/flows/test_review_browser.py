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


def test_keyboard_review_blinded_mode_and_the_next_release(browser, run_copy, tmp_path):
    spec, out = run_copy
    token = _add_reviewer(out, spec, "ann")
    with serving(out, spec) as base:
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(120_000)
        page.goto(f"{base}/login")
        page.keyboard.type(token)
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.url.endswith("/queue")
        # 1 needs_review + the audit sample (rate 1.0): 2 accepted, 2 rejected attempts
        assert page.inner_text("#left") == "5"
        first = page.get_attribute("#item", "data-attempt")
        assert page.inner_text("#gate-verdict") == "needs_review"
        assert "face_low_confidence" in page.inner_text("#gate-reasons")

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

        # decide everything with the keyboard: skip the first, come back to it at the end
        with page.expect_navigation():
            page.keyboard.press("s")
        assert page.inner_text("#left") == "5" and page.get_attribute("#item", "data-attempt") != first
        decided = {}
        while page.query_selector("#item") is not None:
            attempt = page.get_attribute("#item", "data-attempt")
            verdict = page.inner_text("#gate-verdict")
            condition = page.inner_text("#condition")
            if verdict == "rejected":
                page.keyboard.press("r")
                with page.expect_navigation():
                    page.keyboard.press("2")  # face deformation
            elif verdict == "accepted" and "White" in condition:
                page.keyboard.press("r")
                page.keyboard.press("8")  # other: type what, then Enter
                page.keyboard.type("halo along the hairline")
                with page.expect_navigation():
                    page.keyboard.press("Enter")
            else:
                with page.expect_navigation():
                    page.keyboard.press("a")
            decided[attempt] = (verdict, condition)
        assert page.is_visible("#empty") and page.inner_text("#left") == "0"
        assert len(decided) == 5 and list(decided)[-1] == first

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
        assert trials == 3  # the final accepted / needs_review candidates
        stats = json.loads(page.goto(f"{base}/stats").text())
        assert stats["queue"]["resolved"] == 5 and stats["spot_the_edit"]["overall"]["trials"] == 3

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
    assert [r.decision for r in rows].count("skip") == 1 and len(rows) == 6
    assert {r.name for r in rows} == {"ann"}
    assert ("other", "halo along the hairline") in {(r.reason, r.note) for r in rows}
    assert len(trials_rows) == 3 and sum(t.click_x is not None for t in trials_rows) == 2

    # the next release: zero editor calls, decisions in the manifest rows
    sealed, calls = run_and_publish(write_spec(spec.parent, version="0.2.0"), out)
    assert calls == 0
    items = {r["item_id"]: r for r in map(json.loads, (sealed.path / "items.jsonl").read_text().splitlines())}
    manifest = {r["item_id"]: r for r in map(json.loads, (sealed.path / "manifest.jsonl").read_text().splitlines())}
    reviewed = items[first]
    assert reviewed["status"] == "accepted" and first in manifest
    assert reviewed["review"]["gate_verdict"] == "needs_review"
    assert [d["decision"] for d in reviewed["review"]["decisions"]] == ["skip", "accept"]
    assert reviewed["review"]["decisions"][1]["reviewer"] == "ann"
    white = next(r for r in items.values() if r["cell_id"].startswith("grace_hopper") and "White" in r["cell_id"])
    assert white["status"] == "rejected" and white["item_id"] not in manifest
    assert white["reasons"][0] == "review_rejected: other"
    stats = json.loads((sealed.path / "stats.json").read_text())
    assert stats["editor_calls_this_run"] == 0
    assert stats["review"]["waiting"]["total"] == 0
    assert stats["review"]["override"]["accepted"]["hits"] == 1
    assert 'id="review-progress"' in (sealed.path / "report.html").read_text()
    # the re-run asks nobody again: every queued candidate is still decided
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    queue = review_queue(ledger, load_spec(spec).review)
    ledger.close()
    assert len(queue) == 5 and all(i.resolution.state == "resolved" for i in queue)
