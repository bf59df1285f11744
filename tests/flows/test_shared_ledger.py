"""Two `counterfactory run` workers on one spec and one PostgreSQL ledger, at the same time.

This is how a lab spreads a study over machines: every worker runs the same spec, with its
own `--out` (each holds its folder's run lock), against the spec's shared `ledger_url` and
shared `store_dir`. The attempt claims (migration 0003: a row lock decides simultaneous
claims, a live run's claim keeps others off) must make each paid edit happen once in all.
Editor calls are counted outside the code under test: by the local fal queue, per payload.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from tests.conftest import REPO
from tests.generation.fal_server import FalServer
from tests.manifests.pg import postgres_server

pytest.importorskip("psycopg")
pytest.importorskip("fal_client")

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
PHOTOS = ("astronaut", "grace_hopper")


def _spec(tmp_path: Path, ledger_url: str, store: Path) -> Path:
    """demo-face on two photos and a 2 x 2 grid (8 cells), edited by `fal` on the local queue."""
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    metadata = yaml.safe_load((REPO / "assets/photos/metadata.yaml").read_text())
    metadata["sources"] = [s for s in metadata["sources"] if s["id"] in PHOTOS]
    (tmp_path / "metadata.yaml").write_text(yaml.safe_dump(metadata))
    spec["sources"] = {"photos": str(REPO / "assets/photos"), "metadata": str(tmp_path / "metadata.yaml")}
    spec["design"]["axes"] = {"race": ["Black", "White"], "gender": ["female", "male"]}
    spec["design"]["strata"] = ["occupation"]
    spec["editor"] = {
        "backend": "fal",
        "max_attempts": 2,
        "fal": {"concurrency": 2, "poll_interval_s": 0.05, "backoff_s": 0.05},
    }
    spec["ledger_url"] = ledger_url
    spec["store_dir"] = str(store)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_two_workers_on_one_postgres_ledger_pay_each_edit_once(tmp_path):
    with postgres_server() as url, FalServer(latency_s=0.3, model="copy") as server:
        spec = _spec(tmp_path, url, tmp_path / "store")
        env = {**os.environ, **server.env(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        # Nothing finishes until both workers are editing: one worker has at most 2 requests in
        # flight (concurrency 2), so a third held submission proves the other is submitting too.
        server.hold()
        workers = []
        try:
            for i in range(2):
                # each worker its own Prefect home, as on its own machine
                home = {"PREFECT_HOME": str(tmp_path / f"prefect-{i}")}
                command = CLI + ["run", str(spec), "--out", str(tmp_path / f"worker-{i}"), "--no-progress"]
                workers.append(
                    subprocess.Popen(
                        command,
                        cwd=REPO,
                        env={**env, **home},
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            deadline = time.monotonic() + 240
            while server.stats()["paid_submits"] < 3:
                ended = [w for w in workers if w.poll() is not None]
                assert not ended, f"a worker ended early: rc {ended[0].returncode}: {ended[0].stderr.read()[-3000:]}"
                assert time.monotonic() < deadline, "the two workers never edited at the same time"
                time.sleep(0.1)
            server.release()
            results = [w.communicate(timeout=180) for w in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        for worker, (out, err) in zip(workers, results, strict=True):
            assert worker.returncode == 0, (out[-2000:], err[-3000:])
        engine = create_engine(url)
        with engine.connect() as db:
            attempts = db.execute(text("select attempt_id, cell_id, status, calls, claimed_by from attempts")).all()
            judged = db.execute(text("select count(distinct attempt_id) from candidates")).scalar()
            runs = db.execute(text("select count(*) from runs")).scalar()
        engine.dispose()
        billed = server.billed_per_payload()

    # the fake returns the photo unchanged: every face cell fills with its first seed (review);
    # each template also spent its one noise-floor request
    cells = [a for a in attempts if not a.cell_id.endswith("|floor")]
    floors = [a for a in attempts if a.cell_id.endswith("|floor")]
    assert len(cells) == 8 and all(a.status == "ok" for a in attempts), attempts
    assert sorted(a.cell_id.split("|")[0] for a in floors) == sorted({a.cell_id.split("|")[0] for a in cells})
    paid = len(attempts)
    assert judged == paid and runs == 2
    # each attempt's editor was called exactly once across both workers: by the ledger's
    # count and by the queue's, which sees every paid request
    assert [a.calls for a in attempts] == [1] * paid
    assert len(billed) == paid and set(billed.values()) == {1}, billed
    assert server.stats()["paid_submits"] == paid
    # the claims shared the grid out: both workers edited
    assert len({a.claimed_by for a in attempts}) == 2
    calls = [int(out.split("editor calls: ")[1].split()[0]) for out, _ in results]
    assert sum(calls) == paid and min(calls) > 0, calls
