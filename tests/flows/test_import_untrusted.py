"""An imported set is made by someone else: every path it names is kept inside its folder, every
file checked before it is read, and each refusal is one ``error:`` line naming the row (issue 36).

Each probe is a crafted table that ``counterfactory run SPEC --out OUT --publish`` is given, as
an attacker or a careless user would write it: ``..``, an absolute path, a symbolic link out of
the folder, ``/dev/zero``, a FIFO, a 6 GiB sparse file, a NUL byte in a path, a cell of 200,000
characters, three rows with one id. Each must stop the run before any work (OUT is never made,
so nothing reaches a release) with exit status 2 and one ``error:`` line that names the row and
column, and neither the outside file's bytes nor its name may appear anywhere in the output.
The command runs in-process (click's runner) so the probes share one import of the package.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from counterfactory.assets import PHOTOS_DIR
from counterfactory.flows.cli import main
from counterfactory.flows.engine.spec import load_spec
from counterfactory.generation.editors import EditRequest, make_editor
from counterfactory.generation.editors.tables import EMBEDDED_DIR_ENV, embedded_dir
from counterfactory.generation.images import load_image
from counterfactory.generation.sources import SourceError
from counterfactory.manifests.errors import SetupError
from tests.conftest import REPO
from tests.flows.import_set import import_spec

#: what an outside file holds: it must never show in a message
SECRET = "TOP-SECRET-7f3a9c"
HEADER = "id,source,candidate,race,gender,floor"


@pytest.fixture()
def study(tmp_path):
    """A spec importing ``set/pairs.csv`` over one bundled photo; beside the set, ``outside/``
    holds a face photo, a byte copy of the spec's photo and a text file holding a secret."""
    photos, table, outside = tmp_path / "photos", tmp_path / "set", tmp_path / "outside"
    for folder in (photos, table, outside):
        folder.mkdir()
    (photos / "hopper.jpg").write_bytes((PHOTOS_DIR / "grace_hopper.jpg").read_bytes())
    metadata = [{"id": "hopper", "path": "hopper.jpg", "licence": "public domain", "presented_gender": "female"}]
    (photos / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}))
    (table / "ok.png").write_bytes((PHOTOS_DIR / "obama_portrait.jpg").read_bytes())
    (outside / "face.png").write_bytes((PHOTOS_DIR / "biden_portrait.jpg").read_bytes())
    (outside / "hopper_copy.jpg").write_bytes((PHOTOS_DIR / "grace_hopper.jpg").read_bytes())
    (outside / "notes.txt").write_text(f"root:x:0:0:{SECRET}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(import_spec("set/pairs.csv"), sort_keys=False))
    return tmp_path


def _table(study: Path, *rows: str, header: str = HEADER) -> None:
    (study / "set" / "pairs.csv").write_text("\n".join([header, *rows]) + "\n")


def _import_options(study: Path, **options) -> None:
    data = yaml.safe_load((study / "spec.yaml").read_text())
    data["editor"]["import"].update(options)
    (study / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _refused(study: Path) -> str:
    """``counterfactory run`` on the study: exit 2, one ``error:`` line, OUT never made, no
    trace of the outside files; returns the error line."""
    out = study / "out"
    result = CliRunner().invoke(
        main, ["run", str(study / "spec.yaml"), "--out", str(out), "--publish", "--no-progress"]
    )
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, (result.exit_code, text, result.exception)
    assert "Traceback" not in text
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    assert SECRET not in text and "root:x" not in text
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        # a relative path out of the table's folder
        ("p1,hopper,../outside/face.png,Black,female,", "column 'candidate': '../outside/"),
        ("p1,hopper,../../../../../../../../etc/passwd,Black,female,", "column 'candidate': '../../../"),
        # the floor column and a source given by path are files the table names too
        ("p1,hopper,ok.png,Black,female,../outside/face.png", "column 'floor': '../outside/"),
        ("p1,../outside/hopper_copy.jpg,ok.png,Black,female,", "column 'source': '../outside/hopper_copy.jpg'"),
    ],
)
def test_a_path_leading_out_of_the_tables_folder_is_refused_naming_the_row(study, row, expected):
    _table(study, row)
    line = _refused(study)
    assert "row 1 (id 'p1')" in line and expected in line and "leads outside the table's folder" in line
    assert "allowed_roots" in line


def test_an_absolute_path_is_refused_unless_an_allowed_root_holds_it(study):
    secret = study / "outside" / "face.png"
    _table(study, f"p1,hopper,{secret},Black,female,")
    line = _refused(study)
    assert "row 1 (id 'p1'), column 'candidate'" in line and "is an absolute path" in line
    # the spec names the folder as an allowed root: the same row resolves to the file
    _import_options(study, allowed_roots=["outside"])
    (row,) = load_spec(study / "spec.yaml").editor.options().read().rows
    assert row.candidate_path == secret.resolve()
    assert row.candidate_sha256 == hashlib.sha256(secret.read_bytes()).hexdigest()


def test_a_symbolic_link_out_of_the_tables_folder_is_refused(study):
    (study / "set" / "link.png").symlink_to(study / "outside" / "face.png")
    _table(study, "p1,hopper,link.png,Black,female,")
    line = _refused(study)
    assert "row 1 (id 'p1'), column 'candidate': 'link.png' leads outside" in line


def test_a_hard_link_to_a_file_outside_the_tables_folder_is_refused(study):
    # a hard link is a second name of the same file: inside() sees only the name in the folder
    os.link(study / "outside" / "face.png", study / "set" / "linked.png")
    _table(study, "p1,hopper,linked.png,Black,female,")
    line = _refused(study)
    assert "row 1 (id 'p1'), column 'candidate': 'linked.png' is hard-linked (2 links)" in line


def test_a_symbolic_link_in_a_folder_layout_is_refused_naming_the_file(study):
    edits = study / "edits"
    edits.mkdir()
    (edits / "hopper_Black_female.png").write_bytes((PHOTOS_DIR / "obama_portrait.jpg").read_bytes())
    (edits / "hopper_White_female.png").symlink_to(study / "outside" / "face.png")
    data = yaml.safe_load((study / "spec.yaml").read_text())
    data["editor"]["import"] = {"folder": "edits", "pattern": "{source}_{race}_{gender}.png", "editor_name": "x"}
    (study / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    line = _refused(study)
    assert "editor.import.folder" in line and "hopper_White_female.png" in line and "leads outside" in line


def test_a_dataset_structs_path_out_of_the_dataset_folder_is_refused(study):
    dataset = study / "set" / "hf"
    (dataset / "data").mkdir(parents=True)
    row = {"source": "hopper", "candidate": {"bytes": None, "path": "../../outside/face.png"},
           "race": "Black", "gender": "female", "id": "p1"}  # fmt: skip
    (dataset / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    _import_options(study, table="set/hf")
    line = _refused(study)
    assert "row 1 (id 'p1'), column 'candidate'" in line and "leads outside" in line


def test_dev_zero_is_refused_as_not_a_regular_file_even_inside_an_allowed_root(study):
    _import_options(study, allowed_roots=["/dev"])
    _table(study, "p1,hopper,/dev/zero,Black,female,")
    line = _refused(study)
    assert "row 1 (id 'p1'), column 'candidate': 'zero' is a device, not a regular file" in line


def test_a_sparse_six_gib_file_is_refused_by_its_size_unread(study):
    huge = study / "set" / "huge.png"
    with open(huge, "wb") as f:
        f.truncate(6 << 30)  # sparse: no disk used, and never read
    _table(study, "p1,hopper,huge.png,Black,female,")
    line = _refused(study)
    assert (
        "row 1 (id 'p1'), column 'candidate': 'huge.png' is 6,442,450,944 bytes, over the limit of 268,435,456" in line
    )
    assert "max_file_bytes" in line


@pytest.mark.timeout(120)
def test_a_fifo_is_refused_without_waiting_for_a_writer(study):
    os.mkfifo(study / "set" / "pipe.png")
    _table(study, "p1,hopper,pipe.png,Black,female,")
    # a subprocess: on the old code the run blocked for ever opening the FIFO
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(study / "spec.yaml"), "--out", str(study / "out")],
        capture_output=True, text=True, cwd=REPO, timeout=90,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "row 1 (id 'p1'), column 'candidate': 'pipe.png' is a FIFO, not a regular file" in line


def test_a_nul_byte_in_a_path_is_one_error_naming_the_row(study):
    _table(study, "p1,hopper,ok.png,White,female,", "p2,hopper,o\x00k.png,Black,female,")
    line = _refused(study)
    assert "row 2 (id 'p2'), column 'candidate': the path holds a NUL byte" in line


def test_a_cell_over_the_csv_field_limit_is_one_error_naming_the_row(study):
    _table(study, "p1,hopper,ok.png,White,female,", f"p2,hopper,{'a' * 200_000}.png,Black,female,")
    line = _refused(study)
    assert "pairs.csv, row 2 (line 3): a cell of more than 131,072 characters" in line
    assert "a" * 100 not in line


def test_three_rows_with_one_id_are_refused_naming_the_rows(study):
    _table(study, "p1,hopper,ok.png,White,female,", "p1,hopper,ok.png,Black,female,", "p1,hopper,ok.png,Black,male,")
    line = _refused(study)
    assert "rows 1, 2 and 3 share the id 'p1' (column 'id')" in line


def test_a_file_that_is_not_an_image_fails_its_item_without_quoting_it(study):
    """A text file inside the folder is read (it is the set's own file) and fails its item; the
    reason names the file and what it looks like, never its bytes (they reach items.jsonl)."""
    (study / "set" / "notes.png").write_text(f"root:x:0:0:{SECRET}:/root:/bin/bash\n")
    _table(study, "p1,hopper,notes.png,Black,female,")
    with pytest.raises(SourceError) as caught:
        load_image(study / "set" / "notes.png")
    assert SECRET not in str(caught.value) and "root:x" not in str(caught.value)
    assert "not an image PIL can read (it looks like text)" in str(caught.value)
    editor = make_editor("import", load_spec(study / "spec.yaml").editor.options())
    editor.prepare()
    hopper = load_image(study / "photos" / "hopper.jpg").pixels
    result = editor.edit(EditRequest("a" * 64, hopper, "", 0, condition={"race": "Black", "gender": "female"}))
    assert result.status == "failed" and "notes.png" in result.reason
    assert SECRET not in json.dumps([result.reason, result.metadata]) and "root:x" not in result.reason


#: files whose first bytes make Pillow pick a reader that puts the header it choked on into its
#: exception (PPM: ``b'Token too long in file header: root:x:0:0:...'``; XBM: ``invalid literal
#: for int() with base 10: b'root:x:...'``): the old messages quoted them into items.jsonl
CRAFTED_HEADERS = {
    "ppm": f"P6\nroot:x:0:0:{SECRET}:/root:/bin/bash\n".encode(),
    "pgm": f"P5\n12 root:x:0:0:{SECRET}\n".encode(),
    "xbm": f"#define root:x:0:0:{SECRET}\n".encode(),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED_HEADERS))
def test_a_decoder_message_that_would_quote_the_file_is_left_out(study, kind):
    (study / "set" / "crafted.png").write_bytes(CRAFTED_HEADERS[kind])
    _table(study, "p1,hopper,crafted.png,Black,female,")
    editor = make_editor("import", load_spec(study / "spec.yaml").editor.options())
    editor.prepare()
    hopper = load_image(study / "photos" / "hopper.jpg").pixels
    result = editor.edit(EditRequest("a" * 64, hopper, "", 0, condition={"race": "Black", "gender": "female"}))
    assert result.status == "failed" and "crafted.png" in result.reason
    assert "its message is left out, as it may quote the file" in result.reason
    text = json.dumps([result.reason, result.metadata])
    assert SECRET not in text and "root:x" not in text


def test_a_mask_file_that_would_be_quoted_is_not(study):
    """``measure SOURCE CANDIDATE --mask M``: the mask's reader choked on a crafted header; the
    error line names the mask, never its bytes."""
    mask = study / "set" / "mask.png"
    mask.write_bytes(CRAFTED_HEADERS["ppm"])
    result = CliRunner().invoke(
        main, ["measure", str(study / "photos" / "hopper.jpg"), str(study / "set" / "ok.png"), "--mask", str(mask)]
    )
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code != 0 and "Traceback" not in text
    assert "mask.png" in text and SECRET not in text and "root:x" not in text


# the embedded-image cache ------------------------------------------------------------------


def _dataset_with_embedded(study: Path, photo: str) -> bytes:
    """``set/hf``: one row whose candidate is ``photo``'s bytes embedded as ``datasets`` writes them."""
    dataset = study / "set" / "hf"
    (dataset / "data").mkdir(parents=True)
    data = (PHOTOS_DIR / photo).read_bytes()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("source", pa.string()), ("candidate", image), ("race", pa.string()),
                        ("gender", pa.string()), ("id", pa.string())])  # fmt: skip
    row = {"source": "hopper", "candidate": {"bytes": data, "path": "a.png"}, "race": "Black", "gender": "female",
           "id": "p1"}  # fmt: skip
    pq.write_table(pa.Table.from_pylist([row], schema=schema), dataset / "data" / "train.parquet")
    _import_options(study, table="set/hf")
    return data


def test_a_planted_cache_file_is_rehashed_and_never_used_for_another_image(study, monkeypatch):
    """Someone writes image B at ``<sha256 of A>.png`` in the embedded folder first: the row of A
    gets A's hash and A's pixels, and the planted file is replaced."""
    cache = study / "cache"
    cache.mkdir()
    monkeypatch.setenv(EMBEDDED_DIR_ENV, str(cache))
    a = _dataset_with_embedded(study, "obama_portrait.jpg")
    sha_a = hashlib.sha256(a).hexdigest()
    planted = cache / f"{sha_a}.png"
    planted.write_bytes((PHOTOS_DIR / "biden_portrait.jpg").read_bytes())
    options = load_spec(study / "spec.yaml").editor.options()
    (row,) = options.read().rows
    assert row.candidate_sha256 == sha_a and row.candidate_path == planted
    assert planted.read_bytes() == a
    editor = make_editor("import", options)
    editor.prepare()
    hopper = load_image(study / "photos" / "hopper.jpg").pixels
    result = editor.edit(EditRequest("a" * 64, hopper, "", 0, condition={"race": "Black", "gender": "female"}))
    assert result.status == "ok"
    np.testing.assert_array_equal(result.image, load_image(PHOTOS_DIR / "obama_portrait.jpg").pixels)


def test_the_embedded_cache_is_private_and_inside_the_run_folder_by_default(study, monkeypatch):
    monkeypatch.delenv(EMBEDDED_DIR_ENV, raising=False)
    a = _dataset_with_embedded(study, "obama_portrait.jpg")
    spec = load_spec(study / "spec.yaml")
    out = study / "out"
    spec.bind_run_folder(out)
    (row,) = spec.editor.options().read().rows
    assert row.candidate_path.parent == out / "embedded"
    assert row.candidate_path.read_bytes() == a
    assert (out / "embedded").stat().st_mode & 0o777 == 0o700
    # without a run folder (the API, measure --batch): a folder of the process's own, never the
    # shared temporary folder under a name another user could make first
    import tempfile

    default = embedded_dir()
    assert default != Path(tempfile.gettempdir()) / "counterfactory-embedded"
    assert default.stat().st_mode & 0o777 == 0o700 and default.stat().st_uid == os.getuid()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a folder away needs root")
def test_an_embedded_folder_of_another_user_is_refused_not_used(study, monkeypatch):
    """``$COUNTERFACTORY_EMBEDDED_DIR`` naming a folder someone else made (they could have
    planted files, or swap them later) is refused, as ``OUT/embedded`` is: one error line."""
    cache = study / "shared-cache"
    cache.mkdir(mode=0o777)
    os.chown(cache, 65534, 65534)  # nobody's
    monkeypatch.setenv(EMBEDDED_DIR_ENV, str(cache))
    _dataset_with_embedded(study, "obama_portrait.jpg")
    line = _refused(study)
    assert "the folder for its embedded images" in line and "belongs to another user" in line
    assert list(cache.iterdir()) == []


def test_an_embedded_folder_that_is_a_link_is_refused(study, monkeypatch):
    elsewhere = study / "elsewhere"
    elsewhere.mkdir()
    (study / "cache-link").symlink_to(elsewhere)
    monkeypatch.setenv(EMBEDDED_DIR_ENV, str(study / "cache-link"))
    _dataset_with_embedded(study, "obama_portrait.jpg")
    line = _refused(study)
    assert "the folder for its embedded images" in line and "is not a folder of its own (a link or a file)" in line
    assert list(elsewhere.iterdir()) == []


def test_a_floor_file_changed_after_the_table_was_read_is_not_used(study):
    """The floor is hashed when the table is read (its sha256 enters the lineage); other bytes
    under its name at edit time are refused, as a changed candidate is."""
    floor = study / "set" / "floor.png"
    floor.write_bytes((PHOTOS_DIR / "grace_hopper.jpg").read_bytes())
    _table(study, "p1,hopper,ok.png,Black,female,floor.png")
    editor = make_editor("import", load_spec(study / "spec.yaml").editor.options())
    editor.prepare()
    floor.write_bytes((PHOTOS_DIR / "biden_portrait.jpg").read_bytes())
    hopper = load_image(study / "photos" / "hopper.jpg").pixels
    result = editor.edit(EditRequest("b" * 64, hopper, "", 0, condition={}))
    assert result.status == "failed" and result.image is None
    assert result.reason.startswith("import_changed:") and "floor.png" in result.reason


def test_a_refused_table_is_a_setup_error_before_any_work(study):
    """The API path: the editor's prepare() refuses, as the run's setup check does."""
    _table(study, "p1,hopper,../outside/face.png,Black,female,")
    editor = make_editor("import", load_spec(study / "spec.yaml").editor.options())
    with pytest.raises(SetupError, match=r"row 1 \(id 'p1'\), column 'candidate'"):
        editor.prepare()


def test_measure_batch_does_not_read_a_path_leading_out_of_the_tables_folder(study):
    """``measure --batch`` reads the same tables: an outside path is that row's failure, unread."""
    from counterfactory.flows.audit import measure_batch

    table = study / "set" / "pairs.csv"
    table.write_text("id,source,candidate\np1,ok.png,../outside/face.png\np2,ok.png,/dev/zero\n")
    reports = list(measure_batch(table))
    assert [r["reasons"] for r in reports] == [["path_refused"], ["path_refused"]]
    assert "row 1, column 'candidate': '../outside/face.png' leads outside" in reports[0]["error"]
    assert "row 2, column 'candidate': '/dev/zero' is an absolute path" in reports[1]["error"]


def test_the_table_itself_is_read_only_when_regular_and_within_its_limit(study):
    _table(study, "p1,hopper,ok.png,Black,female,")
    _import_options(study, max_table_bytes=16)
    line = _refused(study)
    assert "pairs.csv: 'pairs.csv' is" in line and "over the limit of 16" in line and "max_table_bytes" in line
    _import_options(study, max_table_bytes=1 << 20, table="set/pipe.csv")
    os.mkfifo(study / "set" / "pipe.csv")
    line = _refused(study)
    assert "'pipe.csv' is a FIFO, not a regular file" in line
