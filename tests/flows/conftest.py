"""A small real run shared by the review tests (made once per session by ``counterfactory run``,
copied per test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.flows.review_setup import cli_run, write_spec


@pytest.fixture(scope="session")
def review_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("review-run")
    spec = write_spec(root)
    assert cli_run(spec, root / "out") > 0
    return root


@pytest.fixture
def run_copy(review_run, tmp_path) -> tuple[Path, Path]:
    """A private copy of the review run for one test: ``(spec path, out folder)``."""
    root = tmp_path / "run"
    shutil.copytree(review_run, root)
    return root / "spec-0.1.0.yaml", root / "out"
