"""The ``import`` backend's other inputs: a folder of images mapped by a file-name pattern, and a
Hugging Face dataset folder (Parquet with embedded image structs, JSONL with relative paths).

Real photos from ``assets/photos``; what each row must resolve to is written by the test (the
file it copied, the label it put in the name), never read back from the code under test.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from counterfactory.assets import PHOTOS_DIR
from counterfactory.flows.engine.spec import load_spec
from counterfactory.generation.editors import make_editor
from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.tables import EMBEDDED_DIR_ENV, TableError, read_folder, read_table
from counterfactory.generation.images import load_image
from counterfactory.manifests.errors import SetupError
from tests.flows.import_set import import_spec

PHOTOS = {"hopper": "grace_hopper.jpg", "obama": "obama_portrait.jpg", "biden": "biden_portrait.jpg"}
#: candidates: (source id, race as written in the file name, the spec's label, gender, the photo used)
CANDIDATES = [
    ("src_hopper", "east_asian", "East Asian", "male", "obama_portrait.jpg"),
    ("src_hopper", "Black", "Black", "female", "biden_portrait.jpg"),
    ("src_obama", "white", "White", "female", "grace_hopper.jpg"),
    ("src_biden", "middle-eastern", "Middle Eastern", "male", "astronaut.png"),
]


def _study(tmp_path: Path, **editor) -> Path:
    photos = tmp_path / "photos"
    photos.mkdir()
    for file in PHOTOS.values():
        (photos / file).write_bytes((PHOTOS_DIR / file).read_bytes())
    metadata = [{"id": f"src_{n}", "path": f, "licence": "public domain"} for n, f in PHOTOS.items()]
    (photos / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}))
    spec = import_spec(editor.pop("table", "unused"), **editor)
    if "folder" in editor:
        del spec["editor"]["import"]["table"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "spec.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _edits(tmp_path: Path) -> Path:
    edits = tmp_path / "edits"
    edits.mkdir()
    for source, race, _, gender, photo in CANDIDATES:
        (edits / f"{source}_{race}_{gender}.png").write_bytes((PHOTOS_DIR / photo).read_bytes())
    return edits


def test_a_folder_maps_each_file_to_a_row_by_its_name(tmp_path):
    _edits(tmp_path)
    spec = load_spec(_study(tmp_path, folder="edits", pattern="{source}_{race}_{gender}.png"))
    rows = spec.editor.options().read().rows
    got = {r.row_id: (r.source_id, r.condition, r.candidate_sha256) for r in rows}
    expected = {
        f"{s}_{race}_{g}.png": (s, {"race": label, "gender": g}, _sha(PHOTOS_DIR / photo))
        for s, race, label, g, photo in CANDIDATES
    }
    assert got == expected
    assert {r.source_photo.name for r in rows} == {"grace_hopper.jpg", "obama_portrait.jpg", "biden_portrait.jpg"}


def test_a_file_that_does_not_match_the_pattern_is_named(tmp_path):
    edits = _edits(tmp_path)
    (edits / "src_obama_purple_male.png").write_bytes((PHOTOS_DIR / "astronaut.png").read_bytes())
    (edits / "notes.txt").write_text("made with editor X")
    (edits / ".DS_Store").write_bytes(b"\0")  # hidden: not read
    spec = load_spec(_study(tmp_path, folder="edits", pattern="{source}_{race}_{gender}.png"))
    with pytest.raises(SetupError) as err:
        spec.editor.options().read()
    message = str(err.value)
    assert "editor.import.folder" in message and "2 file(s) do not match" in message
    assert "notes.txt" in message and "src_obama_purple_male.png" in message and ".DS_Store" not in message


def test_a_pattern_without_an_axis_field_and_folder_options_are_refused(tmp_path):
    _edits(tmp_path)
    spec = load_spec(_study(tmp_path, folder="edits", pattern="{source}_{race}_{sex}.png"))
    with pytest.raises(SetupError, match=r"editor.import.pattern: .* has no field 'gender'"):
        spec.editor.options().read()
    with pytest.raises(TableError, match="names source twice"):
        read_folder(tmp_path / "edits", "{source}_{source}.png")
    from counterfactory.generation.editors.imported import ImportOptions

    with pytest.raises(ValueError, match="folder and pattern go together"):
        ImportOptions(folder="edits")
    with pytest.raises(ValueError, match="either table"):
        ImportOptions(table="t.csv", folder="edits", pattern="{source}.png")


def _struct(path: Path) -> dict:
    return {"bytes": path.read_bytes(), "path": path.name}


@pytest.mark.slow
def test_a_hugging_face_dataset_folder_is_read_as_the_table(tmp_path, monkeypatch):
    """Parquet shards under data/ with image structs as ``datasets`` writes them (bytes and
    path): the source is recognised by its bytes as the spec's photo, the candidate read from
    its bytes; the editor returns exactly the candidate file's pixels."""
    monkeypatch.setenv(EMBEDDED_DIR_ENV, str(tmp_path / "embedded"))
    dataset = tmp_path / "hf"
    (dataset / "data").mkdir(parents=True)
    rows = [
        {
            "source": _struct(PHOTOS_DIR / PHOTOS[s.removeprefix("src_")]),
            "edited": _struct(PHOTOS_DIR / photo),
            "race": label,
            "gender": g,
            "id": f"pair{n}",
        }
        for n, (s, _, label, g, photo) in enumerate(CANDIDATES)
    ]
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("source", image), ("edited", image), ("race", pa.string()), ("gender", pa.string()),
                        ("id", pa.string())])  # fmt: skip
    for shard, part in enumerate((rows[:2], rows[2:])):
        table = pa.Table.from_pylist(part, schema=schema)
        pq.write_table(table, dataset / "data" / f"train-{shard:05d}-of-00002.parquet")
    (dataset / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n")
    spec = load_spec(_study(tmp_path, table="hf", candidate_column="edited"))
    options = spec.editor.options()
    got = {r.row_id: (r.source_id, r.condition, r.candidate_sha256) for r in options.read().rows}
    assert got == {
        f"pair{n}": (s, {"race": label, "gender": g}, _sha(PHOTOS_DIR / photo))
        for n, (s, _, label, g, photo) in enumerate(CANDIDATES)
    }
    editor = make_editor("import", options)
    editor.prepare()
    source = load_image(tmp_path / "photos" / "grace_hopper.jpg").pixels
    result = editor.edit(EditRequest("a1", source, "", 0, condition={"race": "Black", "gender": "female"}))
    assert result.status == "ok"
    assert np.array_equal(result.image, load_image(PHOTOS_DIR / "biden_portrait.jpg").pixels)
    # read again: the embedded files are content-addressed, nothing new is written
    written = sorted(p.name for p in (tmp_path / "embedded").iterdir())
    read_table(dataset)
    # four distinct photos among the sources and candidates, each written once
    assert sorted(p.name for p in (tmp_path / "embedded").iterdir()) == written and len(written) == 4


def test_a_dataset_folder_of_jsonl_with_relative_paths(tmp_path):
    dataset = tmp_path / "hf"
    (dataset / "data").mkdir(parents=True)
    (dataset / "images").mkdir()
    lines = []
    for n, (s, _, label, g, photo) in enumerate(CANDIDATES):
        (dataset / "images" / photo).write_bytes((PHOTOS_DIR / photo).read_bytes())
        # a struct with a path only, and a plain path string: both relative to the dataset folder
        candidate = {"bytes": None, "path": f"images/{photo}"} if n % 2 else f"images/{photo}"
        lines.append(json.dumps({"source": s, "candidate": candidate, "race": label, "gender": g}))
    (dataset / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    spec = load_spec(_study(tmp_path, table="hf"))
    rows = spec.editor.options().read().rows
    assert [(r.source_id, r.candidate_path, r.candidate_sha256) for r in rows] == [
        (s, dataset / "images" / photo, _sha(PHOTOS_DIR / photo)) for s, _, _, _, photo in CANDIDATES
    ]


def test_a_folder_without_dataset_files_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TableError, match="Hugging Face dataset folder"):
        read_table(tmp_path / "empty")
