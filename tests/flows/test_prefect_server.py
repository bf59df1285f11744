"""Against a Prefect server the user runs (``prefect server start`` on 127.0.0.1, ``PREFECT_API_URL``):
a run reports its flow run, task runs, limits and artifacts there, and ``counterfactory
schedule`` serves a deployment whose runs publish a new version only when an input changed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from counterfactory.assets import PHOTOS_DIR
from counterfactory.manifests.release_verify import verify_release
from tests.conftest import REPO

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
GRACE = {
    "id": "grace_hopper",
    "path": "grace_hopper.jpg",
    "licence": "public domain (U.S. Navy)",
    "occupation": "naval officer",
    "presented_gender": "female",
}
ASTRONAUT = {
    "id": "astronaut",
    "path": "astronaut.png",
    "licence": "public domain (NASA)",
    "occupation": "astronaut",
    "presented_gender": "female",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING", **extra})
    return env


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """``prefect server start`` in its own process group and Prefect home; killed with it after."""
    home = tmp_path_factory.mktemp("prefect-server-home")
    port = _free_port()
    log = (home / "server.log").open("wb")
    env = _env(
        PREFECT_HOME=str(home),
        PREFECT_UI_ENABLED="false",
        # the scheduler looks for new deployments every second; late-run relabelling is noise
        PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS="1",
        PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED="false",
        PREFECT_SERVER_SERVICES_FOREMAN_ENABLED="false",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prefect server start did not answer within 300 s"
            time.sleep(0.5)
        yield url
    finally:
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop ``proc`` and everything in its process group; nothing it started outlives this."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children that ignored SIGTERM
    except ProcessLookupError:
        pass


def _spec(folder: Path, name: str, sources: list[dict], **extra) -> Path:
    """Two cells per source with the classical editor and the gates off: the orchestration, fast."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / "meta.yaml"
    tmp = folder / "meta.yaml.tmp"
    tmp.write_text(yaml.safe_dump({"sources": sources}))
    tmp.replace(meta)  # a scheduled run never reads half a file
    spec = {
        "name": name,
        "sources": {"photos": str(PHOTOS_DIR), "metadata": "meta.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": ["Black", "White"], "gender": ["female"]},
            "strata": ["occupation"],
            "templates_per_stratum": 1,
            "seed": 7,
        },
        "prompts": {"face": "face_only_v1"},
        "editor": {"backend": "classical", "max_attempts": 1},
        "gates": {"face": {g: None for g in ("face", "identity", "expression", "locality", "skin")}},
        "release": {"name": name, "version": "0.1.0"},
        **extra,
    }
    path = folder / "spec.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(spec))
    return path


def _client(url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class _Bound:
        def __enter__(self):
            self._settings = temporary_settings(updates={PREFECT_API_URL: url})
            self._settings.__enter__()
            self._client = get_client(sync_client=True)
            return self._client.__enter__()

        def __exit__(self, *exc):
            self._client.__exit__(*exc)
            self._settings.__exit__(*exc)

    return _Bound()


def test_a_run_reports_to_the_users_prefect_server(prefect_server, tmp_path):
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )

    spec = _spec(tmp_path, "server-run", [GRACE], run={"gpu_slots": 2})
    out = tmp_path / "out"
    result = subprocess.run(
        CLI + ["run", str(spec), "--out", str(out), "--no-progress", "--publish", "--allow-incomplete"],
        cwd=REPO,
        env=_env(PREFECT_API_URL=prefect_server),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    release = out / "releases" / "server-run" / "0.1.0"
    assert verify_release(release) == []

    with _client(prefect_server) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["counterfactory-run"])))
        assert len(runs) == 1 and runs[0].state.is_completed()
        run = runs[0]
        # the ledger's run is this flow run
        import sqlite3

        with sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode=ro", uri=True) as db:
            assert db.execute("SELECT run_id FROM runs").fetchall() == [(run.id.hex,)]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        names = sorted(t.name for t in tasks)
        templates = [n for n in names if n.startswith("template-")]
        assert len(templates) == 1 and len(templates[0]) == len("template-grace_hopper-") + 16
        assert all(t.state.is_completed() for t in tasks)
        # the spec's limit is on the server, active
        limit = client.read_global_concurrency_limit_by_name("counterfactory-gpu")
        assert limit.limit == 2 and limit.active
        artifacts = {
            a.key: a
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
            )
        }
    assert {"server-run-cells", "server-run-progress", "server-run-report", "server-run-summary"} <= set(artifacts)
    table = artifacts["server-run-cells"].data
    table = json.loads(table) if isinstance(table, str) else table
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    total = table[-1]
    assert total["group"] == "all" and total["cells"] == len(items) == 2
    for status in ("accepted", "needs_review", "rejected", "failed"):
        assert total[status] == sum(i["status"] == status for i in items)
    assert artifacts["server-run-progress"].data == 100.0
    assert (release / "report.html").as_uri() in str(artifacts["server-run-report"].data)


def _log(out: Path) -> list[dict]:
    path = out / "schedule.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _wait_for(check, timeout_s: float, what: str, proc: subprocess.Popen, log_path: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"schedule stopped: {log_path.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s: {log_path.read_text()[-3000:]}")


def test_scheduled_runs_publish_only_when_an_input_changed(prefect_server, tmp_path):
    root = tmp_path / "study"
    spec = _spec(root, "sched-study", [GRACE])
    out = tmp_path / "out"
    releases = out / "releases" / "sched-study"
    log_path = tmp_path / "schedule.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            CLI + ["schedule", str(spec), "--out", str(out), "--interval", "3", "--allow-incomplete"],
            cwd=REPO,
            env=_env(PREFECT_API_URL=prefect_server),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            lines = _wait_for(lambda: len(_log(out)) >= 2 and _log(out), 300, "two scheduled runs", proc, log_path)
            first, second = lines[0], lines[1]
            assert first["published"] == "0.1.0" and first["editor_calls"] == 3  # two cells and the noise floor
            # nothing changed: no version, and no attempt paid for again
            assert second["published"] is None and second["previous"] == "0.1.0" and second["editor_calls"] == 0
            assert sorted(p.name for p in releases.iterdir()) == ["0.1.0"]

            _spec(root, "sched-study", [GRACE, ASTRONAUT])  # a new photo in the pool

            # the run going on at the change may already see it (the spec is read after the run's
            # start is logged), so take the first run after the second that published anything
            def after_change():
                return [r for r in _log(out)[2:] if r.get("published")]

            later = _wait_for(after_change, 300, "a run that publishes the change", proc, log_path)[0]
        finally:
            children = _children(proc.pid)
            proc.send_signal(signal.SIGINT)  # Ctrl-C, to the command alone: it must end what it started
            try:
                code = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                code = None
            leftover = [pid for pid in children if _alive(pid)]
            _stop_group(proc)
    elapsed = time.monotonic() - started
    assert code is not None, "schedule did not stop on SIGINT"
    # every process the command started (the served flow runs) ended with it
    assert leftover == []

    assert later["published"] == "0.1.1" and later["previous"] == "0.1.0"
    assert later["editor_calls"] == 3  # only the new photo's two cells and its noise floor were paid for
    assert sum(r.get("editor_calls", 0) for r in _log(out)[2:]) == 3  # and never again after
    v2 = releases / "0.1.1"
    assert verify_release(v2) == []
    diff = json.loads((v2 / "diff.json").read_text())
    assert diff["a"]["version"] == "0.1.0" and diff["b"]["version"] == "0.1.1"
    assert {row["template_id"] for row in diff["added"]} == {"astronaut"} and len(diff["added"]) == 2
    assert diff["removed"] == [] and diff["changed"] == []
    assert any("2 added" in c for c in diff["changes"])
    # every version in the folder is one that a run logged as published
    published = {r["published"] for r in _log(out) if r["published"]}
    assert published == {"0.1.0", "0.1.1"} == {p.name for p in releases.iterdir() if not p.name.startswith(".")}
    print(f"scheduled-run test: {elapsed:.0f} s from `schedule` to Ctrl-C")


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` now (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
