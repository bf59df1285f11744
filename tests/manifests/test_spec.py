"""The spec: bundled examples load, broken specs stop with one message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from counterfactory.manifests.spec import SpecError, load_spec


@pytest.mark.parametrize("name", ["demo-face", "demo-limb"])
def test_bundled_demo_specs_load_and_resolve_paths(specs_dir, photos_dir, name):
    spec = load_spec(specs_dir / f"{name}.yaml")
    assert spec.sources.photos == photos_dir
    assert spec.editor.backend == "classical"
    assert len(spec.spec_hash()) == 64


def test_focus_spec_is_the_focus_design(specs_dir):
    spec = load_spec(specs_dir / "focus.yaml", check_paths=False)
    assert spec.design.kind == "face"
    assert len(spec.design.axes["race"]) == 5 and len(spec.design.axes["gender"]) == 2
    # 6 occupations x 2 presented genders x 4 templates = 48 templates = 8 per occupation
    assert spec.design.templates_per_stratum * 2 == 8
    assert spec.design.strata == ["occupation", "presented_gender"]


def test_limb_pairs_spec_has_cue_removed_and_kept(specs_dir):
    spec = load_spec(specs_dir / "limb-pairs.yaml", check_paths=False)
    assert spec.design.axes == {"cue": ["removed", "kept"]}


def test_switching_backend_is_one_field(specs_dir, tmp_path):
    text = (specs_dir / "demo-face.yaml").read_text()
    for backend in ("qwen", "fal"):
        path = tmp_path / f"{backend}.yaml"
        path.write_text(
            text.replace("backend: classical", f"backend: {backend}").replace(
                "../photos", str(specs_dir.parent / "photos")
            )
        )
        assert load_spec(path).editor.backend == backend


def _write(tmp_path: Path, specs_dir: Path, old: str, new: str) -> Path:
    text = (specs_dir / "demo-face.yaml").read_text().replace("../photos", str(specs_dir.parent / "photos"))
    assert old in text
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    "old, new, field, fragments",
    [
        (
            "templates_per_stratum: 1",
            "templates_per_stratum: many",
            "design.templates_per_stratum",
            ["integer", "'many'"],
        ),
        (
            "templates_per_stratum: 1",
            "templates_per_stratum: 0",
            "design.templates_per_stratum",
            ["greater than or equal to 1", "0"],
        ),
        ("backend: classical", "backend: dalle", "editor.backend", ["'dalle'", "classical", "fal", "qwen"]),
        ("max_attempts: 2", "max_atempts: 2", "editor.max_atempts", ["not a known field"]),
        ("version: 0.1.0", "version: one", "release.version", ["semantic version", "'one'"]),
        ("  kind: face", "  kind: torso", "design.kind", ["'face' or 'limb'", "'torso'"]),
    ],
)
def test_broken_spec_message_names_field_expected_and_received(tmp_path, specs_dir, old, new, field, fragments):
    path = _write(tmp_path, specs_dir, old, new)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message and f"`{field}`" in message
    for fragment in fragments:
        assert fragment in message


def test_missing_photo_folder_is_named(tmp_path, specs_dir):
    path = _write(tmp_path, specs_dir, "photos: " + str(specs_dir.parent / "photos"), "photos: /nowhere/photos")
    with pytest.raises(SpecError, match=r"sources.photos.*/nowhere/photos"):
        load_spec(path)


def test_not_yaml_and_not_a_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(bad)
