"""A run folder (``flows/engine/run_folder.py``): where its ledger, store and releases are, which
spec ran there (recorded with the sha256 of its bytes), and the spec a later command takes: the
one given, else the recorded one, else the newest release's, else an error saying ``--spec``."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import yaml

from counterfactory.flows.engine.run_folder import RunFolder, RunSpecNotFoundError
from counterfactory.flows.engine.spec import load_spec
from counterfactory.manifests.runlock import RunFolderError


def test_where_each_part_is_and_what_the_spec_may_move(tmp_path, specs_dir):
    folder = RunFolder(tmp_path / "out")
    spec = load_spec(specs_dir / "demo-face.yaml")
    assert folder.ledger_url(spec) == f"sqlite:///{tmp_path / 'out' / 'ledger.sqlite'}"
    assert folder.store_dir(spec) == tmp_path / "out" / "store"
    assert folder.has_own_ledger(spec) is False  # nothing ran here yet
    shared = spec.model_copy(update={"ledger_url": "sqlite:////shared/l.sqlite", "store_dir": tmp_path / "s"})
    assert folder.ledger_url(shared) == "sqlite:////shared/l.sqlite" and folder.store_dir(shared) == tmp_path / "s"
    assert repr(folder) == f"RunFolder({str(tmp_path / 'out')!r})"


def test_the_spec_of_a_run_is_the_given_then_the_recorded_then_the_newest_releases(tmp_path, specs_dir):
    folder = RunFolder(tmp_path / "out")
    with pytest.raises(RunFolderError, match=r"no run recorded here \(run_spec.json missing"):
        folder.recorded_spec()
    with pytest.raises(RunSpecNotFoundError, match=r"pass the run's spec with --spec"):
        folder.spec_of_run()

    spec_file = specs_dir / "demo-face.yaml"
    folder.path.mkdir(parents=True)
    folder.record_spec(spec_file)
    path, sha = folder.recorded_spec()
    assert path == spec_file.resolve() and sha == hashlib.sha256(spec_file.read_bytes()).hexdigest()
    assert json.loads((tmp_path / "out" / "run_spec.json").read_text())["spec_sha256"] == sha
    assert folder.spec_of_run().design == load_spec(spec_file).design

    # the recorded file gone: the newest release's spec.yaml (here the limb demo's)
    (tmp_path / "out" / "run_spec.json").write_text(
        json.dumps({"spec_path": str(tmp_path / "gone.yaml"), "spec_sha256": "0"})
    )
    old, new = tmp_path / "out/releases/r/0.1.0", tmp_path / "out/releases/r/0.2.0"
    for release, source in ((old, "demo-face.yaml"), (new, "demo-limb.yaml")):
        release.mkdir(parents=True)
        data = yaml.safe_load((specs_dir / source).read_text())
        data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
        (release / "spec.yaml").write_text(yaml.safe_dump(data))
    os.utime(old / "spec.yaml", (1_000_000, 1_000_000))
    assert folder.spec_of_run().design.kind == "limb"
    # a spec given wins over both
    assert folder.spec_of_run(spec_file).design.kind == "face"
