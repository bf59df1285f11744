"""The spec: bundled examples load, broken specs stop with one message naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from counterfactory.flows.engine.spec import SpecError, load_spec


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


BOMB = """name: bomb
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    # reproduction: yaml.safe_load shares the aliased lists, so loading is cheap, but the
    # result stands for 10**9 strings that validation and hashing would walk (3 GB seen)
    import yaml

    from counterfactory.manifests.yamlsafe import expanded_size

    assert expanded_size(yaml.compose(BOMB, Loader=yaml.SafeLoader)) > 10**9
    with pytest.raises(SpecError, match="alias bomb") as caught:
        load_spec(path)
    assert str(path) in str(caught.value)


def test_a_non_utf8_spec_is_one_message(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8") as caught:
        load_spec(path)
    assert str(path) in str(caught.value)


def test_metadata_alias_bomb_is_refused(tmp_path):
    from counterfactory.generation.sources import MetadataError, load_metadata

    path = tmp_path / "meta.yaml"
    path.write_text(BOMB.replace("name: bomb\n", "") + "sources: []\n")
    with pytest.raises(MetadataError, match="aliases are expanded"):
        load_metadata(path)


def _demo(specs_dir, tmp_path, edit) -> Path:
    import yaml

    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    edit(data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # each of these used to surface mid-run, after sources were checked, as a Prefect traceback
        (lambda d: d["prompts"].update(face="no_such_template_v9"), "prompt template 'no_such_template_v9' not found"),
        (lambda d: d["prompts"].update(target_group="{article} {ethnicity}"), "uses {ethnicity}"),
        (
            lambda d: d["design"]["axes"].update(ethnicity=d["design"]["axes"].pop("race")),
            "uses {race}, which is not one of the fields",
        ),
        (lambda d: d["editor"].update(seed=2**63), "`editor.seed`: expected input should be less than or equal to"),
        (lambda d: d["editor"].update(seed=2**31 - 1), "seed + max_attempts - 1 at most 2147483647"),
        (lambda d: d.update(ledger_url="postgres-ish://nowhere"), "`ledger_url`: expected an SQLAlchemy URL"),
        (lambda d: d.update(ledger_url="not a url at all"), "`ledger_url`: expected an SQLAlchemy URL"),
        (lambda d: d.update(store_dir="shared/store"), "`store_dir`: expected an absolute path"),
    ],
)
def test_spec_errors_that_used_to_fail_mid_run_stop_at_load(specs_dir, tmp_path, edit, expected):
    path = _demo(specs_dir, tmp_path, edit)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert expected in str(caught.value) and str(path) in str(caught.value)


def test_photos_that_is_a_file_is_one_message(specs_dir, tmp_path):
    path = _demo(specs_dir, tmp_path, lambda d: d["sources"].update(photos=d["sources"]["metadata"]))
    with pytest.raises(SpecError, match="`sources.photos`: expected the folder holding the photos"):
        load_spec(path)


def _walk(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)
    else:
        yield value


@pytest.mark.parametrize("name", ["demo-face", "demo-limb"])
def test_spec_as_written_holds_no_machine_path_and_hashes_the_same_elsewhere(specs_dir, tmp_path, name):
    import shutil

    import yaml

    spec = load_spec(specs_dir / f"{name}.yaml")
    text = spec.to_yaml()
    assert str(specs_dir.parent) not in text and str(Path.home()) not in text
    assert not any(isinstance(v, str) and Path(v).is_absolute() for v in _walk(yaml.safe_load(text)))
    assert yaml.safe_load(text)["sources"]["photos"] == "../photos"
    # the same study in another checkout (another absolute folder) has the same hash
    moved = tmp_path / "elsewhere"
    shutil.copytree(specs_dir.parent / "photos", moved / "photos")
    (moved / "specs").mkdir()
    shutil.copy(specs_dir / f"{name}.yaml", moved / "specs")
    assert load_spec(moved / "specs" / f"{name}.yaml").spec_hash() == spec.spec_hash()


def test_spec_hash_covers_only_the_active_backend_and_kind(specs_dir):
    spec = load_spec(specs_dir / "demo-face.yaml")

    def changed(**sections) -> str:
        return spec.model_copy(update=sections).spec_hash()

    editor = spec.editor
    inactive = type(editor).model_validate({**editor.model_dump(), "qwen": {"steps": 8}})
    assert inactive.qwen.steps == 8
    assert changed(editor=inactive) == spec.spec_hash()
    active = editor.model_copy(update={"classical": editor.classical.model_copy(update={"strength": 0.3})})
    assert changed(editor=active) != spec.spec_hash()
    gates = spec.gates
    assert changed(gates=gates.model_copy(update={"limb": gates.limb.model_copy(update={"expression": None})})) == (
        spec.spec_hash()
    )
    assert changed(gates=gates.model_copy(update={"face": gates.face.model_copy(update={"expression": None})})) != (
        spec.spec_hash()
    )
    assert changed(masks=spec.masks.model_copy(update={"dilate_px": 9})) == spec.spec_hash()
    assert changed(ledger_url="postgresql+psycopg://user:secret@db/ledger") == spec.spec_hash()
    assert changed(store_dir=Path("/mnt/lab/store")) == spec.spec_hash()


def test_thresholds_added_since_a_spec_was_written_leave_its_hash_when_unset(specs_dir):
    """A spec that sets the newer thresholds to null (as one written before they existed
    judged without them) hashes without them: its canonical form has no such keys, and
    setting one changes the hash."""
    from counterfactory.validation.gates.locality import LocalityPathConfig

    spec = load_spec(specs_dir / "demo-face.yaml")
    face = spec.gates.face
    unset = face.model_copy(
        update={
            "expression": face.expression.model_copy(update={"max_mouth_corner_shift_iod": None}),
            "locality": face.locality.model_copy(
                update={
                    "max_excess_share": None,
                    "max_largest_change_share": None,
                    "no_floor": LocalityPathConfig(max_changed_share=0.03),
                }
            ),
        }
    )
    old = spec.model_copy(update={"gates": spec.gates.model_copy(update={"face": unset})})
    canonical = old.canonical()["gates"]["face"]
    assert "max_mouth_corner_shift_iod" not in canonical["expression"]
    assert "max_excess_share" not in canonical["locality"]
    assert "max_largest_change_share" not in canonical["locality"]
    # a path's own set written before the measure existed hashes without it too
    assert canonical["locality"]["no_floor"]["max_changed_share"] == 0.03
    assert "max_largest_change_share" not in canonical["locality"]["no_floor"]
    assert "max_mouth_corner_shift_iod" in spec.canonical()["gates"]["face"]["expression"]
    assert old.spec_hash() != spec.spec_hash()


@pytest.mark.slow
def test_the_spec_module_imports_no_pipeline_layer():
    # manifests is the bottom layer: the spec names its generation/validation sections by
    # module path and imports them on first validation, never when the module is imported
    code = (
        "import sys, counterfactory.manifests.spec\n"
        "print([m for m in sys.modules if m.startswith(('counterfactory.generation', 'counterfactory.validation'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_biographies_file_enters_the_hash_as_written_so_the_study_hashes_the_same_elsewhere(specs_dir, tmp_path):
    """focus.yaml names its biographies relative to the spec; resolved, the release's spec hash
    changed with the checkout's folder (the golden focus-classical run differed between two)."""
    import shutil

    import yaml

    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["trials"] = {"protocols": ["2afc", "salary"], "biographies": "../trials/biographies_example_v2.yaml"}
    hashes = []
    for where in ("one", "two"):
        root = tmp_path / where
        shutil.copytree(specs_dir.parent / "photos", root / "photos")
        (root / "trials").mkdir()
        shutil.copy(specs_dir.parent / "trials" / "biographies_example_v2.yaml", root / "trials")
        (root / "specs").mkdir()
        (root / "specs" / "study.yaml").write_text(yaml.safe_dump(data))
        spec = load_spec(root / "specs" / "study.yaml")
        # the run reads the file where it is; the canonical spec keeps the name as written
        assert spec.trials.biographies == (root / "trials" / "biographies_example_v2.yaml").resolve()
        assert spec.canonical()["trials"]["biographies"] == "../trials/biographies_example_v2.yaml"
        hashes.append(spec.spec_hash())
    assert hashes[0] == hashes[1]


def test_templates_per_stratum_is_asked_only_of_a_design_that_draws_templates(tmp_path, specs_dir):
    """Issue 47: an import's spec had to say templates_per_stratum although its grid is its table
    (one cell per row) and the number was never read. It may leave it out now; a spec whose editor
    draws templates from the strata still needs it, and says so in one line."""
    photos = str(specs_dir.parent / "photos")
    common = {
        "name": "t",
        "sources": {"photos": photos, "metadata": f"{photos}/metadata.yaml"},
        "design": {"kind": "face", "axes": {"race": ["Black", "White"]}, "strata": []},
        "prompts": {"face": "face_only_v1"},
        "release": {"name": "t", "version": "0.1.0"},
    }
    (tmp_path / "pairs.csv").write_text("source,candidate,race\n")
    imported = tmp_path / "import.yaml"
    imported.write_text(yaml.safe_dump({**common, "editor": {"backend": "import", "import": {"table": "pairs.csv"}}}))
    assert load_spec(imported).design.templates_per_stratum is None
    classical = tmp_path / "classical.yaml"
    classical.write_text(yaml.safe_dump({**common, "editor": {"backend": "classical"}}))
    with pytest.raises(SpecError, match=r"expected design\.templates_per_stratum, how many source photos"):
        load_spec(classical)
