"""Prefect's API server in this process, for the life of one run.

Prefect's own "ephemeral" server is a separate ``uvicorn`` process: a run killed with SIGKILL
leaves it behind (~200 MB each, for good), and under load it often misses Prefect's 20 s
start-up deadline. Serving the same app from a thread of the run's own process removes both
problems: the server cannot outlive the process, however it dies, and start-up waits as long
as the server thread is alive and making progress.

A user who points ``PREFECT_API_URL`` at a server of their own keeps it: nothing starts then.

``services=True`` (``counterfactory schedule``) also runs the server's background services, the
scheduler among them, which turns a deployment's schedule into flow runs; the served flow runs
are child processes that reach this server through ``PREFECT_API_URL`` in their environment.
"""

from __future__ import annotations

import contextvars
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from counterfactory.manifests.errors import CounterfactoryError

#: how long to wait for the server's start-up (database migrations on a busy machine)
STARTUP_TIMEOUT_S = 600.0


def _service_settings() -> dict:
    from prefect.settings import (
        PREFECT_SERVER_SERVICES_FOREMAN_ENABLED,
        PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED,
        PREFECT_UI_ENABLED,
    )

    return {
        PREFECT_UI_ENABLED: False,
        PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED: False,
        PREFECT_SERVER_SERVICES_FOREMAN_ENABLED: False,
    }


class PrefectServerError(CounterfactoryError, RuntimeError):
    """The in-process Prefect API server could not start."""


@contextmanager
def prefect_api(*, startup_timeout_s: float = STARTUP_TIMEOUT_S, services: bool = False) -> Iterator[str | None]:
    """Serve Prefect's API from a daemon thread on ``127.0.0.1`` and point Prefect's clients at it.

    Yields the API URL (``None`` when the user configured ``PREFECT_API_URL`` themselves, which
    is then used as it is). The server stops when the block ends; as a daemon thread it also
    ends with the process on any signal. ``services`` also runs Prefect's background services
    (the scheduler, late runs, ...), without the UI, and exports the URL to this process's
    environment for the child processes it starts.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return

    import uvicorn
    from prefect.server.api.server import create_app

    context = contextvars.copy_context()
    if services:
        # the scheduler, no UI; the late-runs and foreman services only relabel runs and
        # workers, and their writes contend for the SQLite database with the runs themselves.
        # The server thread runs in this context, so it sees these settings.
        with temporary_settings(updates=_service_settings()):
            app = create_app(ephemeral=False, webserver_only=False, final=True, ignore_cache=True)
            context = contextvars.copy_context()
    else:
        # ephemeral: no UI and no background services, as Prefect's own temporary server
        app = create_app(ephemeral=True, final=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config None: uvicorn leaves the process's logging alone. Its default dictConfig
    # clears every existing handler, and clearing Prefect's API log handler waits (up to 5 s)
    # for it to drain to a server that is gone: 5 s of every run after the first in a process
    # (the scheduler's, a benchmark's; benchmarks/import_vs_measure.py measured it)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on", log_config=None))
    thread = threading.Thread(
        target=context.run, args=(server.run,), kwargs={"sockets": [sock]}, name="prefect-api", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            sock.close()
            raise PrefectServerError(
                "Prefect's API server stopped during start-up; check PREFECT_HOME's database "
                "(delete PREFECT_HOME to start it afresh: it holds no counterfactory state)"
            )
        if time.monotonic() > deadline:
            server.should_exit = True
            raise PrefectServerError(f"Prefect's API server did not start within {startup_timeout_s:.0f} s")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/api"
    exported = services and "PREFECT_API_URL" not in os.environ
    if exported:
        os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if exported:
            os.environ.pop("PREFECT_API_URL", None)
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
