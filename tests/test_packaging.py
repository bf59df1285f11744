"""Packaging hygiene: the wheel installs one package, ``counterfactory``, with every module and
data file of the repository's pipeline folders under it, and pyproject lists every package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

#: repository files that are not part of the installed package (caches, tests' own outputs)
_SKIP = ("__pycache__", ".pyc")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _mapped_files() -> dict[str, Path]:
    """``{path inside the wheel: file in the repository}`` for every shipped source and data file."""
    roots = _pyproject()["tool"]["setuptools"]["package-dir"]
    out = {}
    for package, folder in roots.items():
        base = REPO / folder
        for path in base.rglob("*"):
            if path.is_file() and not any(s in str(path) for s in _SKIP):
                inside = package.replace(".", "/") + "/" + path.relative_to(base).as_posix()
                out[inside] = path
    return out


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    for package, folder in setuptools["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            name = ".".join([package, *rel])
            assert name in listed, f"{init.parent} has an __init__.py: add {name!r} to pyproject's packages"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    # build from a copy, so the checkout gets no build/ or egg-info folders; every environment
    # folder left out (.venv-harness, lmms-eval's, is 3.7 GB: copying it filled a disk)
    src = tmp_path_factory.mktemp("src") / "counterfactory"
    ignore = shutil.ignore_patterns(".venv*", ".git", "build", "out", "*.egg-info", "__pycache__", "tests")
    shutil.copytree(REPO, src, ignore=ignore)
    dist = tmp_path_factory.mktemp("dist")
    # in a process of its own, as pip builds it: setuptools warns with classes made inside its
    # functions, which pytest-xdist cannot carry from a worker (the worker crashed, CI stop 48)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(dist)], cwd=src, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return zipfile.ZipFile(dist / done.stdout.strip().splitlines()[-1])


def test_the_wheel_installs_only_counterfactory(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"counterfactory", "counterfactory-0.1.0.dist-info"}


def test_the_wheel_holds_every_module_and_data_file(wheel):
    names = set(wheel.namelist())
    missing = sorted(inside for inside in _mapped_files() if inside not in names)
    assert not missing, f"not in the wheel (list the folder in packages or package-data): {missing[:10]}"
