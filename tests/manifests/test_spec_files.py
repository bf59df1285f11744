"""Every file a spec names is checked when the spec loads: a missing one is one SpecError that
names the field, the path as resolved and the fix, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from counterfactory.assets import PHOTOS_DIR, PROMPTS_DIR, SPECS_DIR
from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.trials import TRIALS_DIR


def _spec(tmp_path: Path, edit, name: str = "demo-face") -> Path:
    """A bundled demo spec written into ``tmp_path`` (sources absolute), changed by ``edit``."""
    data = yaml.safe_load((SPECS_DIR / f"{name}.yaml").read_text())
    data["sources"] = {k: str((SPECS_DIR / v).resolve()) for k, v in data["sources"].items()}
    edit(data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _refused(path: Path, **kwargs) -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(path, **kwargs)
    assert isinstance(caught.value, CounterfactoryError)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "Traceback" not in message
    return message


def test_a_missing_trial_prompt_bank_stops_the_spec_at_load(tmp_path):
    path = _spec(tmp_path, lambda d: d.update(trials={"protocols": ["2afc"], "prompts": "no_such_file"}))
    message = _refused(path)
    assert "field `trials.prompts`" in message
    assert repr(str(TRIALS_DIR / "no_such_file.yaml")) in message
    assert "set trials.prompts to one of trial_prompts_v1, trial_prompts_v2, trial_prompts_v3" in message


def test_the_trial_prompt_bank_is_checked_even_without_path_checks(tmp_path):
    # the bank ships with the package: a spec validated for another machine still names it
    path = _spec(tmp_path, lambda d: d.update(trials={"prompts": "no_such_file"}))
    assert "field `trials.prompts`" in _refused(path, check_paths=False)


def test_a_missing_biographies_file_is_named_as_resolved(tmp_path):
    path = _spec(tmp_path, lambda d: d.update(trials={"protocols": ["salary"], "biographies": "bios/none.yaml"}))
    message = _refused(path)
    assert "field `trials.biographies`" in message
    assert repr(str(tmp_path / "bios" / "none.yaml")) in message
    assert f"relative paths are read from the spec file's folder {tmp_path}" in message
    # validated for another machine, the study's own files are not looked for
    assert load_spec(path, check_paths=False).trials.biographies == tmp_path / "bios" / "none.yaml"


def test_a_biographies_file_of_the_wrong_shape_stops_the_spec_at_load(tmp_path):
    (tmp_path / "bios.yaml").write_text("biographies: [just, a, list]\n")
    path = _spec(tmp_path, lambda d: d.update(trials={"protocols": ["salary"], "biographies": "bios.yaml"}))
    message = _refused(path)
    assert "field `trials.biographies`" in message and "expected `biographies: {occupation:" in message


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("sources.photos", lambda d, t: d["sources"].update(photos=str(t / "no_photos"))),
        ("sources.metadata", lambda d, t: d["sources"].update(metadata=str(t / "no_meta.yaml"))),
    ],
)
def test_missing_sources_are_named_as_resolved(tmp_path, field, edit):
    path = _spec(tmp_path, lambda d: edit(d, tmp_path))
    message = _refused(path)
    assert f"field `{field}`" in message and "does not exist" in message and "correct the path" in message
    assert repr(str(tmp_path / ("no_photos" if field == "sources.photos" else "no_meta.yaml"))) in message


def test_a_missing_face_template_is_named_at_its_field(tmp_path):
    path = _spec(tmp_path, lambda d: d["prompts"].update(face="no_such_template_v9"))
    message = _refused(path)
    assert "field `prompts.face`" in message
    assert str(PROMPTS_DIR / "no_such_template_v9.txt") in message
    assert "put no_such_template_v9.txt in prompts.directory" in message


def test_a_missing_limb_template_is_named_at_its_cue(tmp_path):
    def edit(data):
        data.setdefault("prompts", {})["limb"] = {"removed": "gone_v1", "kept": "limb_kept_v1"}

    message = _refused(_spec(tmp_path, edit, name="demo-limb"))
    assert "field `prompts.limb.removed`" in message and str(PROMPTS_DIR / "gone_v1.txt") in message


def test_a_template_in_the_spec_folder_of_templates_loads(tmp_path, monkeypatch):
    # prompts.directory is read from the working folder, as the templates are read during the run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_face_v1.txt").write_text("Make the person {TARGET_GROUP}.")
    path = _spec(tmp_path, lambda d: d["prompts"].update(face="my_face_v1", directory="mine"))
    assert load_spec(path).prompts.face == "my_face_v1"


def test_a_missing_template_folder_is_named_as_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _spec(tmp_path, lambda d: d["prompts"].update(directory="no_templates"))
    message = _refused(path)
    assert "field `prompts.directory`" in message and repr(str(tmp_path / "no_templates")) in message
    assert "leave the field out" in message


def test_a_missing_import_table_stops_the_spec_at_load(tmp_path):
    (tmp_path / "meta.yaml").write_text(
        yaml.safe_dump({"sources": [{"id": "hopper", "path": "grace_hopper.jpg", "licence": "public domain"}]})
    )
    spec = {
        "name": "import-files",
        "sources": {"photos": str(PHOTOS_DIR), "metadata": "meta.yaml"},
        "design": {"kind": "face", "axes": {"race": ["Black", "White"]}, "templates_per_stratum": 1},
        "editor": {"backend": "import", "import": {"table": "table/pairs.csv"}},
        "release": {"name": "import-files"},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    message = _refused(path)
    assert "field `editor.import.table`" in message and repr(str(tmp_path / "table" / "pairs.csv")) in message
    (tmp_path / "table").mkdir()
    (tmp_path / "table" / "pairs.csv").write_text("id,source,candidate,race\n")
    assert load_spec(path).editor.backend == "import"


@pytest.mark.parametrize("name", ["demo-face", "demo-limb"])
def test_the_bundled_specs_name_only_files_that_exist(name):
    assert load_spec(SPECS_DIR / f"{name}.yaml").trials.prompts == "trial_prompts_v3"
