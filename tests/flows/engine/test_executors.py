"""The local executor (``flows/engine/executors.py``) is this process: it edits through the
engine's ``run_edits`` with the output callback handed on, and judges through ``judge_attempts``
with the floor and the floor flag as given."""

from __future__ import annotations

from counterfactory.flows.engine import execute
from counterfactory.flows.engine.executors import LOCAL, LocalExecutor


def test_the_local_executor_runs_the_engine_in_this_process(monkeypatch):
    calls = []

    def run_edits(ws, editor, plans, lineage, *, on_output=None):
        calls.append(("edit", ws, editor, tuple(plans), lineage, on_output))
        on_output("a1", "image")
        return len(plans)

    def judge_attempts(spec, ws, prepared, plans, stack, jkey, floor, as_floor):
        calls.append(("judge", jkey, floor, as_floor))
        return [("accepted", [])] * len(plans)

    monkeypatch.setattr(execute, "run_edits", run_edits)
    monkeypatch.setattr(execute, "judge_attempts", judge_attempts)
    handed = []
    assert isinstance(LOCAL, LocalExecutor)
    assert LOCAL.edit("ws", "editor", ["p1", "p2"], {"k": 1}, on_output=lambda *a: handed.append(a)) == 2
    assert handed == [("a1", "image")]  # this process hands each output back as it is committed
    assert LOCAL.judge("spec", "ws", "prep", ["p1"], "stack", "j1", {"t1": 0.1}, True) == [("accepted", [])]
    assert calls[1] == ("judge", "j1", {"t1": 0.1}, True)
    assert LOCAL.judge("spec", "ws", "prep", [], "stack", "j2") == []
    assert calls[2] == ("judge", "j2", None, False)  # no floor, not the floor's own judgement
