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

Stopping is ordered as Prefect's own test harness orders it: the process's Prefect clients first
send what they still hold (task-run events, API logs) while the server is up, then the server
stops. Stopped the other way round, a run of a few hundred tasks spent 7 s per undelivered event
retrying a closed port at exit, and the server's event recorders, cancelled mid-write, printed
SQLAlchemy tracebacks under the progress bar.

What the server itself logs (its own thread, and SQLAlchemy's asyncio pools, which only the
server uses here) is the server's business, not the run's: it goes to ``prefect-server.log`` in
``PREFECT_HOME``, beside the server's database, and to the console only with
``counterfactory --verbose``.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from counterfactory.manifests.errors import CounterfactoryError

#: how long to wait for the server's start-up (database migrations on a busy machine)
STARTUP_TIMEOUT_S = 600.0
#: how long the process's Prefect clients may take to send what they hold before the server stops
DRAIN_TIMEOUT_S = 120.0
#: the server thread's name: what it logs is the server's own
SERVER_THREAD = "prefect-api"
#: the file in ``PREFECT_HOME`` that receives what the server logs
SERVER_LOG = "prefect-server.log"
#: SQLAlchemy's pools for asyncio engines log under this name; in this process only Prefect's
#: server has one (the ledger's engine is synchronous). A pool's connection can be finalised,
#: and log, on whichever thread collects it.
ASYNC_POOL_LOGGER = "sqlalchemy.pool.impl.Async"


def server_log_path() -> Path:
    """``PREFECT_HOME/prefect-server.log``: where the in-process server's own log lines go."""
    from prefect.settings import get_current_settings

    return Path(get_current_settings().home).expanduser() / SERVER_LOG


def is_server_record(record: logging.LogRecord) -> bool:
    """Whether the in-process server logged ``record`` (its thread, or an asyncio pool's logger)."""
    return record.threadName == SERVER_THREAD or record.name.startswith(ASYNC_POOL_LOGGER)


class _ServerLogRedirect(logging.Filter):
    """On the handlers that print: hands the server's records to its log file instead (unless
    the process is verbose). One record that reaches two printing handlers is written once."""

    def __init__(self) -> None:
        super().__init__()
        self.file: logging.FileHandler | None = None
        self._last: logging.LogRecord | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        from counterfactory.validation.quiet import verbose

        if not is_server_record(record) or verbose():
            return True
        if self.file is not None and record is not self._last:
            self._last = record
            self.file.handle(record)
        return False


_REDIRECT = _ServerLogRedirect()


def _printing_handlers() -> list[logging.Handler]:
    """The handlers that write to the console: on the root logger and on every logger that has
    its own (Prefect's ``uvicorn``, ``fastapi`` and ``prefect._internal`` do not propagate)."""
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    found: dict[int, logging.Handler] = {}
    for logger in loggers:
        for handler in logger.handlers:
            # a stream handler that is not a file's: Prefect's console and debug handlers (stderr)
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                found[id(handler)] = handler
    return list(found.values())


def _redirect_server_logs() -> None:
    """Keep the server's records off the console, into :func:`server_log_path` (idempotent; the
    filter stays for the process's life, for records logged while the server's pool is collected)."""
    path = server_log_path()
    if _REDIRECT.file is None or Path(_REDIRECT.file.baseFilename) != path.resolve():
        if _REDIRECT.file is not None:
            _REDIRECT.file.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
        _REDIRECT.file = handler
    for handler in _printing_handlers():
        if _REDIRECT not in handler.filters:
            handler.addFilter(_REDIRECT)


def drain_prefect_clients(timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Let this process's Prefect clients send what they hold (events, API logs) and stop them;
    the next flow run starts them afresh. Prefect's ``prefect_test_harness`` does this before it
    stops its server, for the same reason."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    # each worker reports "Still processing items: N items remaining..." as a warning of its own
    # logger (named after its class, outside Prefect's level setting) while it drains: news for
    # someone waiting at interpreter exit, noise under a finished run's summary. (The workers share
    # one instance registry, so draining either class can drain both: both are quiet throughout.)
    progress = [logging.getLogger(worker.__name__) for worker in (APILogWorker, EventsWorker)]
    levels = [logger.level for logger in progress]
    for logger in progress:
        logger.setLevel(logging.ERROR)
    try:
        for worker in (APILogWorker, EventsWorker):
            worker.drain_all(timeout=timeout_s, at_exit=False)
    finally:
        for logger, level in zip(progress, levels, strict=True):
            logger.setLevel(level)


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
    _redirect_server_logs()
    thread = threading.Thread(
        target=context.run, args=(server.run,), kwargs={"sockets": [sock]}, name=SERVER_THREAD, daemon=True
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
        try:
            # with the server still up: what the clients hold reaches it, nothing is in flight
            drain_prefect_clients()
        finally:
            if exported:
                os.environ.pop("PREFECT_API_URL", None)
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()
            if _REDIRECT.file is not None:
                _REDIRECT.file.close()  # reopened (appending) if the server's pool logs later
