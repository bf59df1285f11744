"""Retries only for transient failures: the classification, and Prefect acting on it."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import httpx
import pytest
from prefect import flow
from sqlalchemy.exc import OperationalError

from counterfactory.flows import run as run_module
from counterfactory.flows.engine.release import IncompleteGridError
from counterfactory.flows.retries import is_transient
from counterfactory.flows.server import prefect_api
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.spec import SpecError


def _locked() -> OperationalError:
    return OperationalError("UPDATE attempts ...", {}, sqlite3.OperationalError("database is locked"))


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


def test_transient_errors_are_network_timeouts_and_busy_databases():
    assert is_transient(httpx.ConnectError("connection refused"))
    assert is_transient(httpx.ReadTimeout("read timed out"))
    assert is_transient(TimeoutError())
    assert is_transient(ConnectionResetError())
    assert is_transient(_locked())
    # a wrapper of a transient error is transient
    assert is_transient(_raised_from(RuntimeError("batch failed"), httpx.ConnectError("refused")))


def test_bad_input_setup_and_refusals_are_never_retried():
    assert not is_transient(ValueError("photo is 16-bit CMYK"))
    assert not is_transient(OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: attempts")))
    assert not is_transient(SpecError("spec.yaml: field `design.axes`"))
    assert not is_transient(IncompleteGridError("the grid is incomplete"))
    # a setup error stays one even when a network error was behind it (a key check that failed)
    assert not is_transient(_raised_from(SetupError("fal key rejected"), httpx.ConnectError("refused")))
    assert not is_transient(None)


@pytest.mark.slow
def test_prefect_retries_a_template_after_a_transient_error_only(monkeypatch):
    calls = []

    def flaky(spec, ws, prepared, cells, editor, stack):
        calls.append(prepared.id)
        if prepared.id == "transient" and len(calls) == 1:
            raise _locked()
        if prepared.id == "bad":
            raise SetupError("the model file is missing")
        return prepared.id

    monkeypatch.setattr(run_module.template, "process_template", flaky)
    task = run_module.template_task.with_options(retry_delay_seconds=0)

    @flow
    def one(template: str):
        state = task(None, None, SimpleNamespace(id=template), [], None, None, "0" * 64, return_state=True)
        return state.type.value

    with prefect_api():
        assert one("transient") == "COMPLETED" and calls == ["transient", "transient"]
        calls.clear()
        assert one("bad") == "FAILED" and calls == ["bad"]
