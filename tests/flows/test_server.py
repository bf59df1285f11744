"""The in-process Prefect server stops quietly: the process's clients send what they hold first,
and what the server itself logs goes to ``PREFECT_HOME/prefect-server.log``, not under a run's
summary (CI once failed on a demo that printed SQLAlchemy's "Exception during reset or similar"
traceback from the server's pool as it stopped)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

# a line of Prefect's console format: "01:06:13.586 | ERROR   | prefect.server... - ..."
PREFECT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \| +(WARNING|ERROR|CRITICAL) +\|", re.MULTILINE)

FLOW = textwrap.dedent(
    """
    import os, sys
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner
    from counterfactory.flows.server import prefect_api

    @task
    def one(i):
        return i

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def many(n):
        return sum(f.result() for f in [one.submit(i) for i in range(n)])

    with prefect_api():
        print("sum", many(int(sys.argv[1])))
    """
)


def _python(tmp_path: Path, code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "COUNTERFACTORY_"))}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        # the hang it guards against: before the clients were drained, each event still queued
        # at exit cost 7 s of retries against the closed port (300 tasks: ~900 events)
        timeout=300,
        env={**base, "PREFECT_HOME": str(tmp_path / "prefect-home"), **env},
    )


@pytest.mark.slow
def test_a_flow_of_hundreds_of_tasks_stops_its_server_without_a_line_on_the_console(tmp_path):
    result = _python(tmp_path, FLOW, "300")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sum 44850" in result.stdout
    # no Prefect warning or error (undelivered events, "Still processing items", the server's
    # recorders cancelled mid-write) and no traceback
    assert not PREFECT_LINE.search(result.stderr), result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


POOL_RECORD = textwrap.dedent(
    """
    import logging, os
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from counterfactory.flows.server import prefect_api

    with prefect_api():
        pass
    # what SQLAlchemy logs when the server's asyncio pool is collected after the server stopped
    logging.getLogger("sqlalchemy.pool.impl.AsyncAdaptedQueuePool").error("Exception during reset or similar")
    # anything else still prints
    logging.getLogger("counterfactory.elsewhere").warning("a warning of the run's own")
    """
)


@pytest.mark.slow
def test_what_the_server_logs_goes_to_its_file_and_verbose_prints_it(tmp_path):
    quiet = _python(tmp_path, POOL_RECORD)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "Exception during reset" not in quiet.stderr
    assert "a warning of the run's own" in quiet.stderr
    log = (tmp_path / "prefect-home" / "prefect-server.log").read_text()
    assert "ERROR sqlalchemy.pool.impl.AsyncAdaptedQueuePool [MainThread] Exception during reset or similar" in log
    assert "a warning of the run's own" not in log

    loud = _python(tmp_path, POOL_RECORD, COUNTERFACTORY_VERBOSE="1")
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert "Exception during reset or similar" in loud.stderr
