"""Shared fixtures: the bundled real photos and models, and an isolated Prefect home."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# Prefect's temporary server and its state live in a throwaway folder for the whole session, one
# per process: pytest-xdist's workers inherit the controller's environment, and two workers' flows
# on one Prefect home would share its SQLite database (and its migrations at start-up).
_OWN_HOME = "COUNTERFACTORY_TEST_PREFECT_HOME"
if "PREFECT_HOME" not in os.environ or os.environ.get(_OWN_HOME) == os.environ["PREFECT_HOME"]:
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["PREFECT_HOME"] = os.environ[_OWN_HOME] = tempfile.mkdtemp(prefix=f"cf-prefect-{_worker}-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
# TAEF2 round trips (generation/rerender.py) kept in one folder that every process of the session
# shares: made by the first process to import this file (the controller under pytest-xdist, whose
# environment the workers inherit) and removed by it. The same demo and corpus edits are
# re-rendered by dozens of tests; the cache is keyed on the pixels and the graphs, so the bytes
# are the ones a fresh round trip gives (tests/generation/test_rerender_cache.py; the recorded
# fingerprints of tests/flows/test_unchanged.py are reached through it).
_RERENDER_CACHE = "COUNTERFACTORY_RERENDER_CACHE"  # generation/rerender.py's CACHE_ENV
if _RERENDER_CACHE not in os.environ:
    os.environ[_RERENDER_CACHE] = tempfile.mkdtemp(prefix="cf-rerender-")
    os.chmod(os.environ[_RERENDER_CACHE], 0o755)  # the Docker smoke run reads it as uid 10001
    atexit.register(shutil.rmtree, os.environ[_RERENDER_CACHE], ignore_errors=True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from counterfactory.assets import PHOTOS_DIR, SPECS_DIR  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def read_rgb(name: str) -> np.ndarray:
    with Image.open(PHOTOS_DIR / name) as im:
        return np.asarray(im.convert("RGB")).copy()


#: Session fixtures that run a whole flow, and the pytest-xdist group of the tests that use them:
#: under ``-n 2 --dist loadgroup`` (the README's test command) each group runs in one worker, so each
#: flow runs once per session, not once per worker that happens to get one of its tests.
#: Every other test's group is its module: a module's fixtures (a module-scoped run, a server)
#: are built once, and a test that reads what an earlier test of its module made (a published
#: release) runs after it, in the same worker (spread test by test, both workers built the
#: module's runs and tests/flows/test_publish.py's verify test found no release).
SHARED_RUNS = {"demo_run": "demo", "killed_demo": "demo", "review_run": "review-run", "limb_ask_release": "limb-ask"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = sorted({SHARED_RUNS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_RUNS})
        # a test that reads a shared run through request.getfixturevalue says so with its own mark
        marked = any(True for _ in item.iter_markers("xdist_group"))
        for group in shared or ([] if marked else [item.nodeid.split("::", 1)[0].replace("/", ".")]):
            item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
            _suffix_group(item)
    _heaviest_groups_first(items)


def _heaviest_groups_first(items: list[pytest.Item]) -> None:
    """Order the groups by how many slow tests each holds, most first (a test keeps its place
    within its group). pytest-xdist's ``loadgroup`` hands a free worker the next group in this
    order, so the long groups (the demo's run and the tests reading it, the FOCUS-shaped import,
    the scoring releases) start at once and the many quick ones fill the end, instead of one
    collected last keeping a worker busy alone while the other waits (longest first)."""
    from collections import Counter

    weight = Counter(_group_of(item) for item in items if item.get_closest_marker("slow"))
    place = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-weight[_group_of(item)], place[id(item)]))


def _suffix_group(item: pytest.Item) -> None:
    """``ID@GROUP``, the test id pytest-xdist's ``loadgroup`` scheduler groups by. pytest-xdist
    3.8 writes it to ``item._nodeid``, which pytest 9.2 no longer reads (an item's id is the
    structured ``item._id``): every group was spread over both workers, each building its
    session's runs. Here the id is set where this pytest keeps it (once: an older pytest reads
    ``_nodeid`` and xdist's own hook appends the same suffix, which names the same group)."""
    group = _group_of(item)
    if not group or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _group_of(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in, as pytest-xdist names it (its marks' names, sorted and
    joined; ``""`` for none)."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names))


@pytest.fixture(scope="session")
def photos_dir() -> Path:
    return PHOTOS_DIR


@pytest.fixture(scope="session")
def specs_dir() -> Path:
    return SPECS_DIR


@pytest.fixture(scope="session")
def grace() -> np.ndarray:
    return read_rgb("grace_hopper.jpg")


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    return read_rgb("astronaut.png")


def demo_spec(folder: Path, *, strata: list[str] | None = None, release: dict | None = None, **top_level) -> Path:
    """``assets/specs/demo-face.yaml`` written to ``folder/spec.yaml`` with absolute photo paths,
    ``top_level`` sections replaced, ``release`` fields set in its release section (a version),
    and, given ``strata``, the design stratified by those fields only: ``strata=[]`` makes one
    template of six cells, ``["presented_gender"]`` two (the demo has three). Whole-flow tests
    that check how a run behaves, not the demo's own grid, run the smaller grid: each template
    costs a floor and six re-rendered edits."""
    import yaml

    spec = yaml.safe_load((SPECS_DIR / "demo-face.yaml").read_text())
    spec["sources"] = {k: str((SPECS_DIR / v).resolve()) for k, v in spec["sources"].items()}
    if strata is not None:
        spec["design"]["strata"] = list(strata)
    spec["release"].update(release or {})
    spec.update(top_level)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))  # axis order decides cell ids
    return path


@dataclass(frozen=True)
class DemoRun:
    """The README's demo, run once per session as a user runs it (see :func:`demo_run`).

    Attributes:
        out: the run folder.
        release: ``releases/demo-face/0.1.0``, sealed by the run.
        run_stdout: what ``counterfactory run`` printed.
        run_stderr: what it printed on standard error (the progress bar; never a native library's line).
        republished: ``releases/demo-face/0.2.0``, sealed again from the same run folder by
            ``counterfactory publish OUT --version 0.2.0 --allow-incomplete`` (zero editor calls).
        publish_stdout: what that ``counterfactory publish`` printed.

    The demo spec publishes trials (FOCUS's 2AFC and MCQ), so both releases hold a trial bank.
    """

    out: Path
    release: Path
    run_stdout: str
    run_stderr: str
    republished: Path
    publish_stdout: str


def user_env() -> dict[str, str]:
    """The environment a user's shell gives the CLI: no variable that quiets or tunes native
    libraries (``GLOG_``, ``TF_CPP_``, ``OPENCV_``) or the package (``COUNTERFACTORY_``, but for
    the session's re-render cache, which changes neither a byte nor a line), and Prefect kept
    local and quiet in a home of its own (:func:`tests.flows.unchanged.cli_env`)."""
    from tests.flows.unchanged import cli_env

    prefixes = ("GLOG_", "TF_CPP_", "OPENCV_", "COUNTERFACTORY_")
    return {k: v for k, v in cli_env().items() if not k.startswith(prefixes) or k == _RERENDER_CACHE}


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """README command 1 as it is written, ``counterfactory run assets/specs/demo-face.yaml --out OUT
    --publish --allow-incomplete`` (about a minute; the progress bar on), then ``counterfactory
    publish OUT --version 0.2.0`` (zero editor calls; the demo spec publishes trials, so both
    releases hold a trial bank). Every whole-flow test that only reads a
    finished demo run reads this one: tests copy the folder or the releases before changing them."""
    import subprocess
    import sys

    from tests.flows.unchanged import SCENARIOS, cli_env

    root = tmp_path_factory.mktemp("demo")
    out = root / "out"
    scenario = SCENARIOS["demo-face"]
    ran = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(scenario.spec), "--out", str(out),
         "--publish", "--allow-incomplete"],
        cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=1800,  # ~1 min idle; 14 at load 29
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    published = subprocess.run(
        [sys.executable, "-m", "counterfactory", "publish", str(out), "--version", "0.2.0", "--allow-incomplete"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert published.returncode == 0, published.stdout[-2000:] + published.stderr[-2000:]
    releases = out / "releases" / "demo-face"
    return DemoRun(out, releases / "0.1.0", ran.stdout, ran.stderr, releases / "0.2.0", published.stdout)


@dataclass(frozen=True)
class KilledRun:
    """The demo SIGKILLed half way and resumed, once per session (see :func:`killed_demo`).

    Attributes:
        out: the run folder, resumed to completion.
        killed: what its ledger held at the kill.
        resumed_stdout: what the resuming ``counterfactory run`` printed.
    """

    out: Path
    killed: object  # tests.flows.unchanged.Killed
    resumed_stdout: str


@pytest.fixture(scope="session")
def killed_demo(tmp_path_factory) -> KilledRun:
    """The demo's run (one worker) SIGKILLed with its process group once 6 attempts are finished,
    then the same command again to completion: what the crash tests of the ledger (nothing
    finished runs twice), the release (byte for byte the uninterrupted one) and the fingerprint
    (the recorded one) each check, from one kill."""
    from tests.flows.unchanged import KILLED, SCENARIOS, kill_half_way, run_cli

    out = tmp_path_factory.mktemp("killed") / "out"
    killed = kill_half_way(SCENARIOS[KILLED], out, timeout=1800)  # a loaded machine: see demo_run
    resumed = run_cli(SCENARIOS[KILLED].spec, out, timeout=1800)
    return KilledRun(out, killed, resumed.stdout)
