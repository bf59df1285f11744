"""The suite under pytest-xdist, as the README's test command runs it (``-n 2 --dist loadgroup``):
each worker has its own Prefect home, and the tests sharing a session's whole-flow run
(:data:`tests.conftest.SHARED_RUNS`) run in one worker, so that the run is made once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("xdist")

TESTS = """
import json, os
import pytest

@pytest.fixture(scope="session")
def review_run():  # stands in for the real one: the group comes from the fixture's name
    return None

def _note(tmp_path_factory, kind, name):
    folder = tmp_path_factory.getbasetemp().parent.parent / "notes"
    folder.mkdir(exist_ok=True)
    record = {"kind": kind, "worker": os.environ["PYTEST_XDIST_WORKER"], "home": os.environ["PREFECT_HOME"]}
    (folder / f"{kind}-{name}.json").write_text(json.dumps(record))

@pytest.mark.parametrize("i", range(6))
def test_shared(review_run, tmp_path_factory, i):
    _note(tmp_path_factory, "shared", i)

@pytest.mark.parametrize("i", range(6))
def test_free(tmp_path_factory, i):
    _note(tmp_path_factory, "free", i)

# reads the shared run only for some parameters, through request.getfixturevalue: marked with its group
@pytest.mark.parametrize("i", [pytest.param(i, marks=[pytest.mark.xdist_group("review-run")]) for i in range(4)])
def test_marked(request, tmp_path_factory, i):
    request.getfixturevalue("review_run")
    _note(tmp_path_factory, "shared", f"marked-{i}")
"""

#: a module with a module-scoped fixture: its tests run in one worker, so it is built once
OTHER = """
import json, os
import pytest

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.getbasetemp().parent.parent / "notes"
    folder.mkdir(exist_ok=True)
    (folder / f"built-{os.environ['PYTEST_XDIST_WORKER']}.json").write_text(json.dumps({"kind": "built"}))
    return True

@pytest.mark.parametrize("i", range(8))
def test_module(built, tmp_path_factory, i):
    folder = tmp_path_factory.getbasetemp().parent.parent / "notes"
    record = {"kind": "module", "worker": os.environ["PYTEST_XDIST_WORKER"], "home": os.environ["PREFECT_HOME"]}
    (folder / f"module-{i}.json").write_text(json.dumps(record))
"""


@pytest.mark.slow
def test_a_shared_runs_tests_share_one_worker_and_each_worker_has_its_own_prefect_home(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder's own session, not the repository's
    (tmp_path / "base").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "COUNTERFACTORY_TEST_PREFECT_HOME")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
         "--basetemp", str(tmp_path / "base" / "t"), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    notes = [json.loads(p.read_text()) for p in (tmp_path / "base" / "notes").glob("*.json")]
    shared = {n["worker"] for n in notes if n["kind"] == "shared"}
    # (with the marked tests: a test's own group mark is its group, not its module)
    assert len([n for n in notes if n["kind"] in ("shared", "free")]) == 16 and len(shared) == 1, notes
    # a module's tests share one worker: its module-scoped fixture was built once
    assert len({n["worker"] for n in notes if n["kind"] == "module"}) == 1, notes
    assert len([n for n in notes if n["kind"] == "built"]) == 1, notes
    notes = [n for n in notes if "home" in n]
    homes = {n["worker"]: n["home"] for n in notes}
    assert len(set(homes.values())) == len(homes), homes  # one Prefect home per worker


#: collected last, the heaviest group: three slow tests
HEAVY = """
import pytest

pytestmark = pytest.mark.slow

@pytest.mark.parametrize("i", range(3))
def test_heavy(i):
    pass
"""


def test_the_groups_with_the_most_slow_tests_are_handed_out_first(tmp_path):
    """pytest-xdist's ``loadgroup`` hands a free worker the next group in collection order; the
    suite's order puts the groups with the most slow tests first (a test keeps its place within
    its group), so the longest start at once and the quick ones fill the end."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'slow: slow')\n"
    )
    (tmp_path / "test_grouped.py").write_text(TESTS)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "test_zzz_heavy.py").write_text(HEAVY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "COUNTERFACTORY_TEST_PREFECT_HOME")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert [i.split("::")[0].rsplit("/", 1)[-1] for i in ids[:3]] == ["test_zzz_heavy.py"] * 3, ids
    # the rest in collection order: the first module's tests before the second's
    rest = [i.split("::")[0].rsplit("/", 1)[-1] for i in ids[3:]]
    assert rest == sorted(rest) and len(rest) == 12 + 4 + 8, rest
