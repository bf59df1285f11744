"""A small real run for the review tests, and the review site served by uvicorn in a thread on
127.0.0.1.

The run is made the way users make it: :func:`cli_run` is ``counterfactory run ... --publish``
in a subprocess, and :func:`run_and_publish` (for a second release over the same folder)
takes the same path as that command (sources checked with the image store, so the ledger's
source rows carry the run's kept source check)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
import yaml

from counterfactory.assets import PHOTOS_DIR
from counterfactory.flows.engine import execute, run_folder, sources, template
from counterfactory.flows.engine.release import publish_release
from counterfactory.flows.engine.spec import load_spec
from counterfactory.flows.review_app import ReviewSite, create_app
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.release import SealedRelease
from tests.conftest import REPO

# On these two real photos the real gates give accepted, needs_review and rejected verdicts
# (which cell gets which moves with the calibration): tests read what they expect from the
# run's ledger and review queue.
METADATA = {
    "sources": [
        {
            "id": "grace_hopper",
            "path": "grace_hopper.jpg",
            "licence": "public domain (U.S. Navy)",
            "occupation": "naval officer",
            "presented_gender": "female",
        },
        {
            "id": "biden_blue_room",
            "path": "biden_blue_room.jpg",
            "licence": "public domain (White House)",
            "occupation": "politician",
            "presented_gender": "male",
        },
    ]
}


def write_spec(folder: Path, *, version: str = "0.1.0", ledger_url: str | None = None, **review) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.yaml").write_text(yaml.safe_dump(METADATA))
    spec = {
        "name": "review-test",
        "sources": {"photos": str(PHOTOS_DIR), "metadata": "meta.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": ["Black", "White"], "gender": ["female"]},
            "strata": ["occupation"],
            "templates_per_stratum": 1,
            "seed": 7,
        },
        "prompts": {"face": "face_only_v1"},
        "editor": {"backend": "classical", "max_attempts": 2},
        # a near-copy goes to review (identity above the band): grace_hopper's lighter edit scores 0.964
        "gates": {"face": {"identity": {"max_cosine": 0.96}}},
        "release": {"name": "review-test", "version": version},
        "review": {"audit_accepted_rate": 1.0, "audit_rejected_rate": 1.0, **review},
    }
    if ledger_url:
        spec["ledger_url"] = ledger_url
    path = folder / f"spec-{version}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_and_publish(spec_path: Path, out: Path) -> tuple[SealedRelease, int]:
    """Every step of ``counterfactory run`` without Prefect; returns the release and its editor calls."""
    spec = load_spec(spec_path)
    ws = run_folder.open_workspace(spec, out)
    try:
        editor = execute.build_editor(spec)
        stack = execute.build_gate_stack(spec)
        prepared, failed = sources.prepare_sources(spec, ws.ledger, ws.store)
        grid = sources.plan_grid(spec, prepared)
        by_id = {p.id: p for p in prepared}
        outcomes = []
        for source_id in sorted({c.source_id for c in grid.cells}):
            cells = [c for c in grid.cells if c.source_id == source_id]
            outcomes.append(template.process_template(spec, ws, by_id[source_id], cells, editor, stack))
        calls = sum(o.editor_calls for o in outcomes)
        sealed = publish_release(spec, ws, prepared, failed, outcomes, grid, allow_incomplete=True)
        return sealed, calls
    finally:
        ws.ledger.close()


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``counterfactory ARGS`` in a subprocess, from the repository root; fails the test on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


def cli_run(spec_path: Path, out: Path) -> int:
    """``counterfactory run SPEC --out OUT --publish --allow-incomplete``; returns the editor calls
    the ledger recorded (attempts started)."""
    cli("run", str(spec_path), "--out", str(out), "--publish", "--allow-incomplete")
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        return len(ledger.attempts())
    finally:
        ledger.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(out: Path, spec_path: Path) -> Iterator[str]:
    """Serve the review site for ``out`` on 127.0.0.1 in a thread; stops it on exit."""
    spec = load_spec(spec_path)
    ledger = Ledger(spec.ledger_url or f"sqlite:///{out / 'ledger.sqlite'}")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(ReviewSite(out, spec, ledger)), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the review site did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        ledger.close()
