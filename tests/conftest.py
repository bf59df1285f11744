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

# Prefect's temporary server and its state live in a throwaway folder for the whole session.
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="cf-prefect-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from counterfactory.assets import PHOTOS_DIR, SPECS_DIR  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def read_rgb(name: str) -> np.ndarray:
    with Image.open(PHOTOS_DIR / name) as im:
        return np.asarray(im.convert("RGB")).copy()


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


@dataclass(frozen=True)
class DemoRun:
    """The README's demo, run once per session as a user runs it (see :func:`demo_run`).

    Attributes:
        out: the run folder.
        release: ``releases/demo-face/0.1.0``, sealed by the run.
        run_stdout: what ``counterfactory run`` printed.
        republished: ``releases/demo-face/0.2.0``, sealed again from the same run folder by
            ``counterfactory publish OUT --version 0.2.0 --allow-incomplete`` (zero editor calls).
        publish_stdout: what that ``counterfactory publish`` printed.

    The demo spec publishes trials (FOCUS's 2AFC and MCQ), so both releases hold a trial bank.
    """

    out: Path
    release: Path
    run_stdout: str
    republished: Path
    publish_stdout: str


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """``counterfactory run assets/specs/demo-face.yaml --out OUT --publish --allow-incomplete``
    (about a minute), then ``counterfactory publish OUT --version 0.2.0`` (zero editor calls).
    Tests copy the releases before changing them."""
    import subprocess
    import sys

    from tests.flows.unchanged import SCENARIOS, cli_env, run_cli

    out = tmp_path_factory.mktemp("demo") / "out"
    ran = run_cli(SCENARIOS["demo-face"].spec, out)
    published = subprocess.run(
        [sys.executable, "-m", "counterfactory", "publish", str(out), "--version", "0.2.0", "--allow-incomplete"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert published.returncode == 0, published.stdout[-2000:] + published.stderr[-2000:]
    releases = out / "releases" / "demo-face"
    return DemoRun(out, releases / "0.1.0", ran.stdout, releases / "0.2.0", published.stdout)
