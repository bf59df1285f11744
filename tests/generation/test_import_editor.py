"""The ``import`` editor backend on real photos: the table read against the spec, the grid it
plans, what it returns per request, and what it refuses before any work.

Sources are bundled photos; candidates are files written here from them (the photo itself,
re-sized, a PNG whose text chunk has a bad CRC), so each expected pixel array comes from
decoding the file the ordinary way, not from the backend.
"""

from __future__ import annotations

import hashlib

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.flows.engine.spec import load_spec
from counterfactory.generation.editors import EditRequest, make_editor
from counterfactory.generation.editors.imported import FINAL
from counterfactory.generation.images import load_image
from counterfactory.generation.sources import load_metadata
from counterfactory.manifests.errors import SetupError
from tests.flows.import_set import png_with_damaged_text

AXES = {"race": ["Black", "White"], "gender": ["female", "male"]}
METADATA = [
    {"id": "hopper", "path": "grace_hopper.jpg", "licence": "public domain", "presented_gender": "female"},
    {"id": "obama", "path": "obama_portrait.jpg", "licence": "public domain", "presented_gender": "male"},
    {"id": "biden", "path": "biden_portrait.jpg", "licence": "public domain", "presented_gender": "male"},
]


def _write_set(folder, rows, *, columns=("id", "source", "candidate", "race", "gender", "prompt"), **editor):
    """A spec in ``folder`` importing ``table/pairs.csv`` (the table in its own subfolder, so
    both path bases are exercised) over the bundled photos; returns the spec's path."""
    (folder / "table" / "out").mkdir(parents=True, exist_ok=True)
    (folder / "meta.yaml").write_text(yaml.safe_dump({"sources": METADATA}))
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    (folder / "table" / "pairs.csv").write_text("\n".join(lines) + "\n")
    spec = {
        "name": "import-unit",
        "sources": {"photos": str(PHOTOS_DIR), "metadata": "meta.yaml"},
        "design": {"kind": "face", "axes": AXES, "strata": ["presented_gender"], "templates_per_stratum": 1},
        "editor": {"backend": "import", "import": {"table": "table/pairs.csv", "editor_name": "someeditor", **editor}},
        "release": {"name": "import-unit"},
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "spec.yaml"


def _rgb(name):
    return load_image(PHOTOS_DIR / name).pixels


@pytest.fixture()
def written(tmp_path):
    """Candidates: hopper's photo as PNG, obama's re-sized to 70 % as WebP, hopper's with a
    damaged text chunk; rows by id, by path (relative to the table's folder) and by a copy."""
    out = tmp_path / "table" / "out"
    out.mkdir(parents=True)
    hopper, obama = _rgb("grace_hopper.jpg"), _rgb("obama_portrait.jpg")
    Image.fromarray(hopper).save(out / "h.png")
    small = cv2.resize(obama, (obama.shape[1] * 7 // 10, obama.shape[0] * 7 // 10), interpolation=cv2.INTER_AREA)
    Image.fromarray(small).save(out / "o.webp", quality=95)
    (out / "comfy.png").write_bytes(png_with_damaged_text(hopper))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "biden.jpg").write_bytes((PHOTOS_DIR / "biden_portrait.jpg").read_bytes())
    rows = [
        {"id": "a", "source": "hopper", "candidate": "out/h.png", "race": "black", "gender": "female", "prompt": "p1"},
        {
            "id": "b",
            "source": f"{PHOTOS_DIR}/obama_portrait.jpg",
            "candidate": "out/o.webp",
            "race": "White",
            "gender": "male",
        },  # fmt: skip
        {"id": "c", "source": "hopper", "candidate": "out/comfy.png", "race": "White", "gender": "female"},
        {"id": "d", "source": "hopper", "candidate": "out/gone.png", "race": "Black", "gender": "male"},
        {"id": "e", "source": "../copy/biden.jpg", "candidate": "out/h.png", "race": "Black", "gender": "male"},
    ]
    # row e names a file outside the table's folder: the spec allows that folder by name
    return _write_set(tmp_path, rows, allowed_roots=["copy"])


def _request(image, condition, aid="x" * 64):
    return EditRequest(attempt_id=aid, image=image, prompt="ignored", seed=0, condition=condition)


def test_rows_resolve_against_the_spec_and_the_grid_is_the_table(written):
    spec = load_spec(written)
    options = spec.editor.options()
    table = options.read()
    assert table.path == written.parent / "table" / "pairs.csv"
    # by id, by path, by a byte-identical copy elsewhere; condition spelt as the spec spells it
    assert [r.source_id for r in table.rows] == ["hopper", "obama", "hopper", "hopper", "biden"]
    assert table.rows[0].condition == {"race": "Black", "gender": "female"}
    assert table.rows[3].problem == "file not found" and table.rows[3].candidate_sha256 is None
    assert (
        table.rows[0].candidate_sha256 == hashlib.sha256((written.parent / "table/out/h.png").read_bytes()).hexdigest()
    )

    records = load_metadata(written.parent / "meta.yaml")
    grid = options.plan_grid(records, spec.design)
    # one cell per row, none else: 2 x 2 conditions would give 12 cells, the table names 5
    assert sorted(c.cell_id for c in grid.cells) == sorted(
        [
            "hopper|race=Black|gender=female",
            "hopper|race=White|gender=female",
            "hopper|race=Black|gender=male",
            "obama|race=White|gender=male",
            "biden|race=Black|gender=male",
        ]
    )
    assert [list(c.condition) for c in grid.cells] == [["race", "gender"]] * 5  # axis order
    assert not grid.shortfalls and {t.source_id for t in grid.templates} == {"hopper", "obama", "biden"}
    match = {c.cell_id: c.gender_match for c in grid.cells}
    assert match["hopper|race=Black|gender=male"] is False and match["obama|race=White|gender=male"] is True

    # a source no row names is excluded, with the reason
    grid = options.plan_grid([*records, records[0].model_copy(update={"id": "extra"})], spec.design)
    assert [(e.source_id, "no row" in e.reason) for e in grid.excluded] == [("extra", True)]


def test_edit_returns_the_candidate_decoded_with_its_record(written):
    spec = load_spec(written)
    editor = make_editor("import", spec.editor.options())
    editor.prepare()
    hopper, obama = _rgb("grace_hopper.jpg"), _rgb("obama_portrait.jpg")
    out = written.parent / "table" / "out"

    result = editor.edit(_request(hopper, {"race": "Black", "gender": "female"}))
    assert result.status == "ok"
    np.testing.assert_array_equal(result.image, np.asarray(Image.open(out / "h.png").convert("RGB")))
    record = result.metadata["output"]
    assert (record["row"], record["id"], record["file"], record["prompt"]) == (1, "a", "out/h.png", "p1")
    assert record["format"] == "PNG" and record["warnings"] == []

    result = editor.edit(_request(obama, {"race": "White", "gender": "male"}))
    assert result.status == "ok" and result.image.shape == np.asarray(Image.open(out / "o.webp")).shape
    assert result.metadata["output"]["format"] == "WEBP"

    # the damaged PNG: read, its pixels those of the undamaged photo, the warning recorded
    result = editor.edit(_request(hopper, {"race": "White", "gender": "female"}))
    assert result.status == "ok"
    np.testing.assert_array_equal(result.image, hopper)
    (warning,) = result.metadata["output"]["warnings"]
    assert "tEXt" in warning and "bad CRC" in warning

    # the missing file: a final failure naming it
    result = editor.edit(_request(hopper, {"race": "Black", "gender": "male"}))
    assert result.status == "failed" and result.metadata[FINAL] is True
    assert result.reason == f"import_unreadable: {out / 'gone.png'}: file not found"

    # the run's noise-floor request (no condition): an imported set has no such output
    result = editor.edit(_request(hopper, {}))
    assert result.status == "failed" and result.reason.startswith("import_no_floor") and result.metadata[FINAL]

    # a source the table names for another condition only, and pixels of no source
    assert editor.edit(_request(obama, {"race": "Black", "gender": "female"})).reason.startswith("import_no_row")
    assert editor.edit(_request(obama[::-1].copy(), {"race": "White", "gender": "male"})).status == "failed"


def test_lineage_is_the_table_as_read(written):
    first = make_editor("import", load_spec(written).editor.options()).lineage()
    again = make_editor("import", load_spec(written).editor.options()).lineage()
    assert first == again and first["model_id"] == "someeditor" and first["backend"] == "import"
    assert make_editor("import", load_spec(written).editor.options()).consumes("face") == frozenset()
    # a candidate replaced by other bytes makes a new lineage (new attempts)
    target = written.parent / "table" / "out" / "o.webp"
    Image.open(target).convert("RGB").save(target, format="WEBP", quality=80)
    assert make_editor("import", load_spec(written).editor.options()).lineage()["table_sha256"] != first["table_sha256"]


ROW = {"id": "r1", "source": "hopper", "candidate": "out/h.png", "race": "Black", "gender": "female"}


@pytest.mark.parametrize(
    ("rows", "columns", "expected"),
    [
        ([{**ROW, "race": "Purple"}], None, "row 1 (id 'r1'): condition race='Purple' is outside the spec's axes"),
        ([ROW, {**ROW, "id": "r2", "source": "nobody"}], None, "row 2 (id 'r2'): source 'nobody' is neither"),
        ([ROW, {**ROW, "id": "r2", "candidate": "out/x.png"}], None, "row 2 (id 'r2') gives source 'hopper' the same"),
        ([ROW], ("id", "source", "candidate", "race"), "no column 'gender'"),
        ([{**ROW, "gender": ""}], None, "row 1 (id 'r1'): no value for the axis 'gender'"),
    ],
)
def test_bad_rows_are_refused_before_any_work_naming_the_row(tmp_path, rows, columns, expected):
    spec = _write_set(tmp_path, rows, **({"columns": columns} if columns else {}))
    editor = make_editor("import", load_spec(spec).editor.options())
    with pytest.raises(SetupError) as caught:
        editor.prepare()
    assert expected in str(caught.value) and "pairs.csv" in str(caught.value)


def test_condition_columns_map_axes_to_the_tables_names(tmp_path):
    rows = [{"id": "r1", "src": "hopper", "candidate": "out/h.png", "ethnicity": "White", "sex": "female"}]
    spec = _write_set(
        tmp_path,
        rows,
        columns=("id", "src", "candidate", "ethnicity", "sex"),
        source_column="src",
        condition_columns={"race": "ethnicity", "gender": "sex"},
    )
    (row,) = load_spec(spec).editor.options().read().rows
    assert (row.source_id, row.condition) == ("hopper", {"race": "White", "gender": "female"})
    bad = _write_set(tmp_path, rows, columns=("id", "src", "candidate"), condition_columns={"age": "a"})
    with pytest.raises(SetupError, match="condition_columns names age, which are not axes"):
        load_spec(bad).editor.options().read()
