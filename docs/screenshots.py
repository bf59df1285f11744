"""Make the docs' review-page screenshot (docs/review-page.png) from a real demo run, in Chromium.

    python docs/screenshots.py                  # README command 1 into a temporary folder first
    python docs/screenshots.py --out out/demo-face --to docs/review-page.png

It adds a reviewer to the run folder, serves the review site with ``counterfactory review serve``,
signs in with Debian's Chromium (through Playwright, no browser download) at 1366x768, opens the
first item the gates sent to review and takes the screenshot. It refuses (exit 1, nothing
written) when the page does not fit that screen: both images, the decision bar and the metric
that decided the item must be visible without scrolling (tests/flows/test_review_browser.py
regenerates it the same way).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SIZE = (1366, 768)

#: what must be on screen, each as a JavaScript test run on the page
CHECKS = """() => {
  const rect = (el) => el ? el.getBoundingClientRect() : null;
  const inside = (r, box) => r && r.width > 0 && r.height > 0 && r.left >= box.left - 0.5 && r.top >= box.top - 0.5
    && r.right <= box.right + 0.5 && r.bottom <= box.bottom + 0.5;
  const screen = {left: 0, top: 0, right: innerWidth, bottom: innerHeight};
  const byId = (id) => inside(rect(document.getElementById(id)), screen);
  const decides = document.querySelector('#flags .decides');
  const flags = rect(document.getElementById('flags'));
  const page = document.scrollingElement;
  return {
    images: byId('img-source') && byId('img-candidate'),
    decision_bar: byId('decide') && byId('accept'),
    deciding_metric: !!decides && inside(rect(decides), flags) && inside(rect(decides), screen),
    no_scroll: !(page.scrollHeight > innerHeight + 1 || window.scrollY > 0),
  };
}"""


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "counterfactory", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"counterfactory {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shoot(out: Path, dest: Path, *, size: tuple[int, int] = SIZE, chromium: str = CHROMIUM) -> dict[str, bool]:
    """Screenshot the review page of run folder ``out`` into ``dest``; what :data:`CHECKS` found.

    ``dest`` is written only when every check holds."""
    from playwright.sync_api import sync_playwright

    token = _cli("review", "add-reviewer", f"docs-{time.time_ns()}", "--out", str(out)).splitlines()[-1]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "counterfactory", "review", "serve", str(out), "--port", str(port)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/login", timeout=5).close()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit("the review site did not start") from None
                time.sleep(0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": size[0], "height": size[1]})
                page.set_default_timeout(120_000)
                page.goto(f"{base}/login")
                page.fill("#token", token)
                with page.expect_navigation():
                    page.press("#token", "Enter")
                # an item the gates sent to people, with the metric that sent it
                page.goto(f"{base}/queue?verdict=needs_review")
                page.wait_for_function(
                    "() => ['img-source', 'img-candidate'].every(id => { const i = document.getElementById(id);"
                    " return i && i.complete && i.naturalWidth > 0; })"
                )
                found = page.evaluate(CHECKS)
                if all(found.values()):
                    shot = Path(tempfile.mkdtemp()) / "review-page.png"
                    page.screenshot(path=str(shot))
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(shot, dest)
                return found
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="a finished demo run folder (default: run the demo first)")
    parser.add_argument("--to", type=Path, default=REPO / "docs" / "review-page.png")
    args = parser.parse_args()
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="cf-docs-")) / "demo-face"
        _cli(
            "run", "assets/specs/demo-face.yaml", "--out", str(out), "--no-progress", "--publish", "--allow-incomplete"
        )
    found = shoot(out, args.to)
    print(", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in found.items()))
    if not all(found.values()):
        print(f"the review page does not fit {SIZE[0]}x{SIZE[1]}: {args.to} left as it was", file=sys.stderr)
        return 1
    print(f"wrote {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
