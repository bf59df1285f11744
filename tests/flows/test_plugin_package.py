"""A plug-in package outside the source tree (``tests/plugin_pkg``: an editor, a gate, a trial
protocol and a release file, one module each) is installed with pip into a temporary folder
and found through its ``counterfactory.plugins`` entry points by the real command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
PACKAGE = REPO / "tests" / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """Where the package is installed (offline, no build isolation: setuptools is in the venv)."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    shutil.copytree(PACKAGE, source)  # pip builds in the source folder; keep tests/ clean
    target = root / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return target


def _cli(args: list[str], plugin_path: Path | None, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAL_")} | extra_env
    if plugin_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(CLI + args, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def test_plugins_lists_the_installed_package_and_the_built_ins(plugin_path):
    result = _cli(["plugins", "--json"], plugin_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {(r["kind"], r["name"]): r for r in map(json.loads, result.stdout.splitlines())}
    ours = {k: r for k, r in rows.items() if r["origin"].startswith("counterfactory-warmth 0.1.0")}
    assert set(ours) == {
        ("editor", "warmth"),
        ("gate", "redness"),
        ("trial_protocol", "warmth_rating"),
        ("release_file", "warmth.jsonl"),
    }
    assert ours["editor", "warmth"]["origin"] == "counterfactory-warmth 0.1.0 (counterfactory_warmth.editor)"
    assert ours["editor", "warmth"]["paid"] is False and ours["gate", "redness"]["opt_in"] is True
    assert rows["editor", "fal"]["paid"] is True and rows["editor", "fal"]["limit"] == "fal per request"
    assert rows["editor", "fal"]["cancel_in_flight"].endswith("paid.fal_cancel.cancel_open_requests")
    assert rows["editor", "classical"]["origin"] == "built-in counterfactory.generation.editors.classical"
    # without the package on the path none of it is there
    bare = _cli(["plugins"], None)
    assert bare.returncode == 0 and "warmth" not in bare.stdout and "qwen" in bare.stdout


def test_a_broken_plugin_names_its_distribution(plugin_path, tmp_path):
    broken = tmp_path / "site"
    shutil.copytree(plugin_path, broken)
    (broken / "counterfactory_warmth" / "gate.py").write_text("raise ImportError('no such thing')\n")
    result = _cli(["plugins"], broken)
    assert result.returncode == 2
    assert "counterfactory-warmth 0.1.0" in result.stderr and "counterfactory_warmth.gate" in result.stderr


def test_the_cli_runs_a_spec_made_of_the_packages_plugins(plugin_path, tmp_path):
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    spec["sources"] = {"photos": str(REPO / "assets/photos"), "metadata": str(REPO / "assets/photos/metadata.yaml")}
    spec["design"]["strata"] = []  # one template of six cells
    spec["editor"] = {"backend": "warmth", "max_attempts": 1, "warmth": {"shift": 10}}
    spec["gates"]["face"]["redness"] = {"max_red_shift": 60.0}
    # a flat red shift is no counterfactual: let the built-in gates accept it, so that the
    # release has items (and trials), rather than sending every cell to review
    spec["gates"]["face"]["identity"] = {"max_cosine": None}
    spec["gates"]["face"]["locality"] = {"min_diff_face": None, "min_face_change": None}
    spec["trials"] = {"protocols": ["warmth_rating"], "options": {"warmth_rating": {"scale": 5}}}
    spec["release"]["files"] = {"warmth.jsonl": {}}
    spec.pop("review", None)
    path = tmp_path / "warmth.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    result = _cli(
        ["run", str(path), "--out", str(out), "--no-progress", "--publish", "--allow-incomplete"], plugin_path
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    release = out / "releases" / "demo-face" / "0.1.0"
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    assert len(items) == 6 and {i["editor"]["backend"] for i in items if i["editor"]} == {"warmth"}
    judged = [i for i in items if "redness" in (i["gates"] or {})]
    assert judged and all(i["gates"]["redness"]["metrics"]["red_shift"] > 0 for i in judged)
    warmth = [json.loads(line) for line in (release / "warmth.jsonl").read_text().splitlines()]
    assert [w["cell_id"] for w in warmth] == sorted(i["cell_id"] for i in items)
    by_cell = {i["cell_id"]: i for i in items}
    for row in warmth:
        gate = (by_cell[row["cell_id"]]["gates"] or {}).get("redness") or {}
        assert row["red_shift"] == (gate.get("metrics") or {}).get("red_shift")
    manifest = (release / "manifest.jsonl").read_text().splitlines()
    trials = [json.loads(line) for line in (release / "trials.jsonl").read_text().splitlines()]
    assert manifest and len(trials) == len(manifest) and {t["protocol"] for t in trials} == {"warmth_rating"}
    assert all(t["answer_format"] == "integer 1-5" for t in trials)
    info = json.loads((release / "release.json").read_text())
    assert info["tables"]["warmth.jsonl"]["rows"] == len(warmth) and "warmth.jsonl" in info["files"]
    assert (release / "schemas" / "warmth.schema.json").is_file()
    assert info["trials"]["warmth_rating"]["unit"] == "each image once, rated 1 to scale"
    shipped = json.loads((release / "schemas" / "trial.schema.json").read_text())
    assert "warmth_rating" in shipped["properties"]["protocol"]["enum"]
    verified = _cli(["verify", str(release)], plugin_path)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
