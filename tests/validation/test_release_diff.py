"""``release diff`` reports what a scorer would want told, not only items: a threshold that
flips no verdict, a changed biography, a changed trial count, each as a difference with its kind."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from counterfactory.manifests.release import read_jsonl, write_jsonl
from counterfactory.manifests.release_schema import validate_rows
from counterfactory.manifests.trials import TRIALS_DIR
from counterfactory.validation.release_diff import diff_releases
from tests.manifests.hub_release import make_release


def _writable(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _with_biographies(release: Path, text: bytes) -> str:
    """Put a biographies file into ``inputs/`` by sha256 and name it in release.json."""
    digest = hashlib.sha256(text).hexdigest()
    (release / "inputs").mkdir(exist_ok=True)
    (release / "inputs" / f"{digest}.yaml").write_bytes(text)
    info = json.loads((release / "release.json").read_text())
    info["inputs"] = {"trials.biographies": f"inputs/{digest}.yaml"}
    (release / "release.json").write_text(json.dumps(info))
    return digest


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path, str, str]:
    root = tmp_path_factory.mktemp("diff")
    a = make_release(root, version="1.0.0")
    b = a.parent / "1.0.1"
    shutil.copytree(a, b)
    _writable(a)
    _writable(b)
    bios = (TRIALS_DIR / "biographies_example_v2.yaml").read_bytes()
    digest_a = _with_biographies(a, bios)
    data = yaml.safe_load(bios)
    data["biographies"]["nurse"][0]["text"] = "Has worked 30 years on a surgical ward. Mentors newly qualified nurses."
    digest_b = _with_biographies(b, yaml.safe_dump(data).encode())
    info = json.loads((b / "release.json").read_text())
    info["version"] = "1.0.1"
    (b / "release.json").write_text(json.dumps(info))
    # a stricter identity floor that no item's cosine (0.91 accepted, 0.12 rejected) crosses
    items = read_jsonl(b / "items.jsonl")
    for row in items:
        if "identity" in (row.get("gates") or {}):
            row["gates"]["identity"]["thresholds"]["min_cosine"] = 0.3
    write_jsonl(b / "items.jsonl", items)
    trials = read_jsonl(b / "trials.jsonl")
    write_jsonl(b / "trials.jsonl", trials[:-3])
    return a, b, digest_a, digest_b


@pytest.mark.slow
def test_threshold_biography_and_trial_count_are_each_a_difference_with_its_kind(pair):
    a, b, digest_a, digest_b = pair
    result = diff_releases(a, b)
    # no item was added, removed or changed its verdict: the threshold flipped nothing
    assert result["added"] == result["removed"] == result["changed"] == [] and result["pass_rates"] == []
    assert result["identical"] is False
    by_kind = {}
    for d in result["differences"]:
        by_kind.setdefault(d["kind"], []).append(d)
    assert [(d["what"], d["a"], d["b"]) for d in by_kind["threshold"]] == [("identity.min_cosine", [0.25], [0.3])]
    assert [(d["what"], d["a"], d["b"]) for d in by_kind["input"]] == [("trials.biographies", digest_a, digest_b)]
    n = len(read_jsonl(a / "trials.jsonl"))
    trials = {d["what"]: (d["a"], d["b"]) for d in by_kind["trials"]}
    assert trials["trials.jsonl"] == (n, n - 3) and trials["trials.jsonl protocol mcq"] == (n, n - 3)
    assert f"trials: {n} -> {n - 3} rows (0 added, 3 removed)" in result["changes"]
    assert validate_rows("diff.json", [result]) == []


def test_the_same_release_is_identical_and_its_diff_validates(pair):
    a, *_ = pair
    result = diff_releases(a, a)
    assert result["identical"] and result["differences"] == [] and result["changes"] == []
    assert validate_rows("diff.json", [result]) == []


def test_cli_diff_json_validates_against_the_schema_and_text_names_each_kind(pair):
    from click.testing import CliRunner

    from counterfactory.flows.cli import main

    a, b, *_ = pair
    out = CliRunner().invoke(main, ["release", "diff", str(a), str(b), "--json"])
    assert out.exit_code == 1, out.output
    assert validate_rows("diff.json", [json.loads(out.output)]) == []
    text = CliRunner().invoke(main, ["release", "diff", str(a), str(b)])
    assert text.exit_code == 1
    lines = text.output.splitlines()
    n = len(read_jsonl(a / "trials.jsonl"))
    for line in (
        "threshold identity.min_cosine: [0.25] -> [0.3]",
        f"trials: {n} -> {n - 3} rows (0 added, 3 removed)",
        f"trials mcq: {n} -> {n - 3} rows",
    ):
        assert line in lines, text.output
    assert any(line.startswith("input trials.biographies: content ") for line in lines), text.output
    # issue 47: each kind said once ("trials: trials: ...", "threshold: threshold ..." before)
    assert not any(re.match(r"(\w+): \1\b", line) for line in lines), text.output


def test_editing_the_biographies_in_place_changes_inputs_sha256(tmp_path):
    """Issue 21: inputs_sha256 hashed the spec text, so a biographies file edited in place kept
    the old release (and its old trials)."""
    from counterfactory.flows.engine.release import release_inputs_key
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.generation.metadata import load_metadata
    from counterfactory.generation.sampling import expand_grid
    from tests.conftest import REPO

    bios = tmp_path / "bios.yaml"
    shutil.copyfile(TRIALS_DIR / "biographies_example_v2.yaml", bios)
    text = (REPO / "assets/specs/demo-face.yaml").read_text().replace("../photos", str(REPO / "assets/photos"))
    text = re.sub(r"^trials:\n(?:  .*\n)+", "", text, flags=re.M)  # the demo's own trials, replaced below
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text + f"trials:\n  protocols: [salary]\n  biographies: {bios}\n")
    spec = load_spec(spec_path)
    grid = expand_grid(load_metadata(spec.sources.metadata), spec.design)

    def key() -> str:
        return release_inputs_key(spec, [], [], grid, review={}, cost_usd=0.0)

    before = key()
    assert key() == before
    bios.write_text(bios.read_text().replace("Mentors newly qualified nurses.", "Mentors new nurses."))
    assert key() != before
