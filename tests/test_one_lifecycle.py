"""One cell lifecycle and one ``run_spec``, read from the source with ``ast``.

A cell's next attempt is decided in one place (:func:`counterfactory.manifests.lifecycle.fill_cells`
with :func:`~counterfactory.manifests.lifecycle.needs_next_attempt`); running, resuming and
publishing are policies over it. A second loop over attempt numbers anywhere in the package is
how the three copies of the lifecycle came to be, so this test refuses one: any ``for`` loop (or
comprehension) whose variable is an attempt number or that counts through a ``range`` of them,
or a ``while`` loop whose condition names one (``attempt_no``, ``max_attempts``), outside
``manifests/lifecycle.py``. Passing an attempt number to a function inside a loop is not a loop
over attempts.
"""

from __future__ import annotations

import ast

from tests.test_imports import modules

ATTEMPT_NUMBER_NAMES = {"attempt_no", "max_attempts", "attempt_number"}
THE_LIFECYCLE = "counterfactory.manifests.lifecycle"


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _attempt_loops(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            # the loop variable is an attempt number, or it counts through a range of them
            counting = isinstance(node.iter, ast.Call) and getattr(node.iter.func, "id", "") == "range"
            head = _names(node.target) | (_names(node.iter) if counting else set())
        elif isinstance(node, ast.While):
            head = _names(node.test)
        else:
            continue
        if head & ATTEMPT_NUMBER_NAMES:
            lines.append(node.lineno if hasattr(node, "lineno") else node.iter.lineno)
    return lines


def test_only_the_lifecycle_module_loops_over_attempt_numbers():
    found = {}
    for name, (path, _) in modules().items():
        lines = _attempt_loops(ast.parse(path.read_text(), str(path)))
        if lines:
            found[name] = lines
    assert set(found) == {THE_LIFECYCLE}, f"attempt-number loops outside {THE_LIFECYCLE}: {found}"
    assert len(found[THE_LIFECYCLE]) == 1, found


def test_the_detector_sees_a_second_loop():
    # the rule above must be able to fail: a policy that counts attempts itself is found
    policy = "def settle(cell, max_attempts):\n    for attempt_no in range(1, max_attempts + 1):\n        pass\n"
    assert _attempt_loops(ast.parse(policy)) == [2]
    assert _attempt_loops(ast.parse("while n < spec.max_attempts:\n    n += 1\n")) == [1]
    assert _attempt_loops(ast.parse("for cell in cells:\n    pass\n")) == []
    assert _attempt_loops(ast.parse("[plan(c, attempt_no) for c in cells]")) == []


def test_there_is_one_run_spec():
    defined = [
        name
        for name, (path, _) in modules().items()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run_spec"
    ]
    assert defined == ["counterfactory.flows.resume"]
