"""The schedule command's checks and version rules, without a server (the served runs are in
test_prefect_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from counterfactory.flows.schedule import ScheduleError, latest_release, make_schedule, next_version
from tests.conftest import REPO


@pytest.mark.parametrize(
    "cron",
    ["61 * * * *", "* * * *", "every day", "0 3 32 * *", "H 3 * * *", ""],
)
def test_a_cron_that_does_not_parse_is_refused_with_how_to_write_one(cron):
    with pytest.raises(ScheduleError, match=r"does not parse .*five fields: minute hour day-of-month month"):
        make_schedule(cron=cron)


def test_schedule_arguments():
    assert make_schedule(cron="0 3 * * *").cron == "0 3 * * *"
    assert make_schedule(cron="*/15 * * * *", timezone="Europe/Berlin").timezone == "Europe/Berlin"
    assert make_schedule(interval=3).interval == timedelta(seconds=3)
    with pytest.raises(ScheduleError, match="exactly one"):
        make_schedule()
    with pytest.raises(ScheduleError, match="exactly one"):
        make_schedule(cron="0 3 * * *", interval=60)
    with pytest.raises(ScheduleError, match="positive number of seconds"):
        make_schedule(interval=0)
    with pytest.raises(ScheduleError, match="IANA name"):
        make_schedule(cron="0 3 * * *", timezone="Mars/Olympus")


def test_next_version_counts_patches_and_follows_a_raised_spec_version():
    assert next_version(None, "0.1.0") == "0.1.0"
    assert next_version("0.1.0", "0.1.0") == "0.1.1"
    assert next_version("0.1.9", "0.1.0") == "0.1.10"
    assert next_version("0.1.3", "0.2.0") == "0.2.0"  # the author raised the spec's version
    assert next_version("1.0.0", "0.2.0") == "1.0.1"


def test_latest_release_is_the_newest_sealed_version(tmp_path):
    for version in ("0.1.2", "0.1.10", "0.1.9", ".0.2.0.staging-1-x", "notes"):
        (tmp_path / "study" / version).mkdir(parents=True)
    for version in ("0.1.2", "0.1.10", "0.1.9"):
        (tmp_path / "study" / version / "release.json").write_text(json.dumps({"version": version}))
        (tmp_path / "study" / version / "checksums.sha256").write_text("")  # sealed: both files (is_release)
    assert latest_release(tmp_path, "study").name == "0.1.10"
    assert latest_release(tmp_path, "other") is None


@pytest.mark.slow
def test_the_command_stops_on_a_bad_cron_before_anything_starts(tmp_path, specs_dir):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "counterfactory.flows.cli", "schedule", str(specs_dir / "demo-face.yaml"),
         "--out", str(out), "--cron", "0 25 * * *"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--cron '0 25 * * *' does not parse" in result.stderr and "e.g. '0 3 * * *'" in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_without_a_server_the_command_runs_one_with_its_scheduler(monkeypatch):
    """`schedule` without PREFECT_API_URL serves Prefect's API with its scheduler in-process:
    a deployment's schedule turns into flow runs, and the flow runs' processes find the server."""
    import os

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule

    from counterfactory.flows.server import prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with prefect_api(services=True) as url:
        assert url and os.environ["PREFECT_API_URL"] == url  # child processes inherit it
        with get_client(sync_client=True) as client:
            flow_id = client.create_flow_from_name("scheduler-probe")
            schedule = DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(minutes=10)))
            deployment = client.create_deployment(flow_id, "probe", schedules=[schedule])
            runs = []
            deadline = time.monotonic() + 120
            while not runs and time.monotonic() < deadline:
                time.sleep(1)
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment]))
                )
    assert runs and all(r.state.is_scheduled() for r in runs)
    assert "PREFECT_API_URL" not in os.environ


@pytest.mark.slow
def test_a_failed_scheduled_run_is_logged_with_its_error(tmp_path, specs_dir):
    from counterfactory.flows.engine.run_folder import SCHEDULE_LOG
    from counterfactory.flows.schedule import regenerate_flow
    from counterfactory.manifests.runlock import RunFolderError, RunFolderLock

    out = tmp_path / "out"
    out.mkdir()
    with RunFolderLock(out), pytest.raises(RunFolderError):
        # another run holds the folder: this one stops before any work, and says so in the log
        regenerate_flow.fn(str(specs_dir / "demo-face.yaml"), str(out))
    (line,) = [json.loads(x) for x in (out / SCHEDULE_LOG).read_text().splitlines()]
    assert line["published"] is None and line["error"].startswith("RunFolderError")
    assert not (out / "releases").exists() and not (out / "ledger.sqlite").exists()
