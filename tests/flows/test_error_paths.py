"""Every error path a careless or hostile spec takes ends in one ``error:`` line and exit 2
(issue 36): YAML alias bombs counted in bytes as well as nodes (in a spec, and inside a
metadata ``extra``), a key written twice, a number far beyond its field's limit, a ledger URL
whose database driver is not installed, a NUL byte in a metadata path, and a run whose release
has nothing to publish. Each starts from what a user runs: ``counterfactory run SPEC --out DIR``
on a spec written into a tmp folder (in-process through click's runner, or a subprocess where
the old behaviour could take the machine down or the Prefect flow must run)."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from counterfactory.assets import PHOTOS_DIR
from counterfactory.flows.cli import main
from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.generation.sources import MetadataError, load_metadata
from tests.conftest import REPO
from tests.flows.import_set import import_spec


def _study(tmp_path: Path, **changes) -> Path:
    """A spec importing ``pairs.csv`` (one row, its candidate missing) over one bundled photo,
    with ``changes`` set at its top level; returns the spec's path."""
    photos = tmp_path / "photos"
    photos.mkdir(exist_ok=True)
    (photos / "hopper.jpg").write_bytes((PHOTOS_DIR / "grace_hopper.jpg").read_bytes())
    metadata = [{"id": "hopper", "path": "hopper.jpg", "licence": "public domain", "presented_gender": "female"}]
    (photos / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}))
    (tmp_path / "pairs.csv").write_text("id,source,candidate,race,gender\np1,hopper,gone.png,Black,female\n")
    spec = {**import_spec("pairs.csv"), **changes}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _one_error(args: list[str]) -> str:
    """``counterfactory ARGS`` in-process: exit 2, one ``error:`` line, no traceback."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0] + "\n" + result.stderr


def _limited(max_gib: int):
    def limit() -> None:  # in the child: an old loader that expands the bomb hits this, not the machine
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        cap = max_gib << 30 if hard == resource.RLIM_INFINITY else min(max_gib << 30, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    return limit


@pytest.mark.slow
def test_a_spec_aliasing_a_megabyte_string_a_million_times_fails_fast(tmp_path):
    """2 MB of YAML: a 1 MiB string, a list of 1,000 aliases of it, and 1,000 aliases of that list
    under an unknown key: a million nodes (under the node limit) but 10^12 characters."""
    text = (
        "name: bomb\n"
        f's: &s "{"a" * (1 << 20)}"\n'
        f"l: &l [{', '.join(['*s'] * 1000)}]\n"
        f"bomb: [{', '.join(['*l'] * 1000)}]\n"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    # a subprocess under a memory limit: the old loader let validation repr the value (MemoryError)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, timeout=120, preexec_fn=_limited(4),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert re.search(r"expand to 1,04\d(,\d{3}){3} characters of text, over the limit of 67,108,864", line), line
    assert len(done.stderr) < 2000  # the value is never shown


def test_a_message_never_builds_the_whole_repr_of_a_huge_value():
    from counterfactory.manifests.yamlsafe import brief

    huge = ["a" * (1 << 20)] * 1_000_000  # a terabyte once written out
    text = brief(huge, 80)
    assert len(text) <= 80 and text.startswith("['aaaa")


def test_aliases_inside_a_metadata_extra_are_refused(tmp_path):
    """105 KB of metadata: a 100 KB string aliased 1,000 times inside one source's ``extra``
    (100 MB once expanded, which every item's JSON would carry)."""
    spec = _study(tmp_path)
    meta = tmp_path / "photos" / "metadata.yaml"
    meta.write_text(
        "sources:\n- id: hopper\n  path: hopper.jpg\n  licence: public domain\n  extra:\n"
        f'    s: &s "{"a" * 100_000}"\n'
        f"    l: [{', '.join(['*s'] * 1000)}]\n"
    )
    assert 100_000 < meta.stat().st_size < 110_000
    with pytest.raises(MetadataError, match="characters of text, over the limit"):
        load_metadata(meta)
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "metadata.yaml" in line and "over the limit of 67,108,864" in line
    assert not (tmp_path / "out").exists()


def test_a_key_written_twice_is_an_error_naming_it_and_its_lines(tmp_path):
    spec = _study(tmp_path)
    spec.write_text(spec.read_text() + "name: second-name\n")
    with pytest.raises(SpecError, match=r"the key 'name' appears twice in one mapping \(first on line 1\)"):
        load_spec(spec)
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    last = len(spec.read_text().splitlines())
    assert f"line {last}: the key 'name' appears twice" in line
    # in a metadata file too: the entry's path given twice
    meta = tmp_path / "photos" / "metadata.yaml"
    meta.write_text("sources:\n- id: hopper\n  path: hopper.jpg\n  licence: public domain\n  path: other.jpg\n")
    with pytest.raises(MetadataError, match=r"line 5.*'path' twice \(first on line 3\)"):
        load_metadata(meta)


def test_an_absurd_number_is_refused_with_the_fields_limit(tmp_path):
    spec = _study(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["sources"]["max_pixels"] = 10**30
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "field `sources.max_pixels`: expected input should be less than or equal to 268435456" in line


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("mysql://user@127.0.0.1/counterfactory", "pip install mysqlclient"),
        ("mysql+pymysql://user@127.0.0.1/counterfactory", "pip install pymysql"),
    ],
)
def test_a_ledger_url_without_its_driver_is_one_error_naming_the_field_and_the_install(tmp_path, url, fix):
    spec = _study(tmp_path, ledger_url=url)
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "field `ledger_url`" in line and fix in line
    assert not (tmp_path / "out").exists()


def test_postgresql_without_the_postgres_extra_is_one_error(tmp_path, monkeypatch):
    # psycopg as if the postgres extra were not installed
    monkeypatch.setitem(sys.modules, "psycopg", None)
    spec = _study(tmp_path, ledger_url="postgresql+psycopg://user@127.0.0.1/counterfactory")
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "field `ledger_url`" in line and "pip install 'counterfactory[postgres]'" in line


def test_a_nul_byte_in_a_metadata_path_is_one_error_naming_the_entry_and_field(tmp_path):
    spec = _study(tmp_path)
    (tmp_path / "photos" / "metadata.yaml").write_text(
        'sources:\n- {id: hopper, path: "hop\\0per.jpg", licence: public domain}\n'
    )
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "metadata.yaml" in line and "'hopper'" in line and "path" in line and "NUL" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_run_publish_with_nothing_publishable_is_one_error_line(tmp_path):
    """The table's one candidate is missing: its cell fails, nothing is accepted or waiting, so
    the release is refused; the run says so in one line, without Prefect's failed-task and
    failed-flow tracebacks (about 60 lines before)."""
    spec = _study(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(tmp_path / "out"), "--publish",
         "--allow-incomplete", "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Finished in state Failed" not in done.stderr
    errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: nothing to publish for import-test 0.1.0")
    # what follows the line is its own explanation (per group, left out), not Prefect's log
    assert not re.search(r"^\d\d:\d\d:\d\d\.\d+ \| ", done.stderr, re.M), done.stderr
    assert not (tmp_path / "out" / "releases" / "import-test" / "0.1.0").exists()


def test_a_metadata_csv_cell_over_the_csv_field_limit_is_one_error_naming_the_line(tmp_path):
    spec = _study(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["sources"]["metadata"] = "photos/metadata.csv"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "photos" / "metadata.csv").write_text(
        f"id,path,licence,notes\nhopper,hopper.jpg,public domain,{'n' * 200_000}\n"
    )
    with pytest.raises(MetadataError, match=r"line 2.*a cell of more than 131,072 characters"):
        load_metadata(tmp_path / "photos" / "metadata.csv")
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "metadata.csv" in line and "131,072" in line and "n" * 100 not in line


def test_a_nul_byte_in_a_spec_value_is_one_error_naming_the_field(tmp_path):
    spec = _study(tmp_path)
    spec.write_text(spec.read_text().replace("table: pairs.csv", 'table: "pa\\0irs.csv"'))
    assert 'table: "pa\\0irs.csv"' in spec.read_text()
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "field `editor.import.table`: a NUL byte in its value" in line


# numbers too long to convert, and limits that were missing ------------------------------------

#: a whole number of 5,000 digits: over Python's 4,300-digit int conversion limit, so the old
#: loaders stopped with a ``ValueError`` traceback (YAML) or a bare ``ValueError`` (JSON)
LONG_NUMBER = "9" * 5000


def test_a_number_of_five_thousand_digits_in_a_spec_is_one_error_naming_the_line_and_field(tmp_path):
    spec = _study(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["design"]["templates_per_stratum"] = 1  # an import needs none; one written is still read
    spec.write_text(
        yaml.safe_dump(data, sort_keys=False).replace(
            "templates_per_stratum: 1", f"templates_per_stratum: {LONG_NUMBER}"
        )
    )
    assert LONG_NUMBER in spec.read_text()
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "(field `design.templates_per_stratum`)" in line and "5,000 characters long, over the limit of 40" in line
    assert "9" * 100 not in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["metadata.yaml", "metadata.jsonl", "pairs.jsonl"])
def test_a_number_of_five_thousand_digits_in_metadata_or_a_table_is_one_error(tmp_path, where):
    spec = _study(tmp_path)
    data = yaml.safe_load(spec.read_text())
    if where == "metadata.yaml":
        (tmp_path / "photos" / where).write_text(
            f"sources:\n- {{id: hopper, path: hopper.jpg, licence: public domain, extra: {{n: {LONG_NUMBER}}}}}\n"
        )
    elif where == "metadata.jsonl":
        data["sources"]["metadata"] = f"photos/{where}"
        (tmp_path / "photos" / where).write_text(
            f'{{"id": "hopper", "path": "hopper.jpg", "licence": "public domain", "extra": {{"n": {LONG_NUMBER}}}}}\n'
        )
    else:
        data["editor"]["import"]["table"] = where
        (tmp_path / where).write_text(
            f'{{"id": {LONG_NUMBER}, "source": "hopper", "candidate": "gone.png", "race": "Black", "gender": "female"}}\n'
        )
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert where in line and "5,000 characters long, over the limit of 40" in line and "9" * 100 not in line
    if where == "pairs.jsonl":  # measure --batch reads the same table
        batch = _one_error(["measure", "--batch", str(tmp_path / where)])
        assert "pairs.jsonl, line 1" in batch and "over the limit of 40" in batch


@pytest.mark.parametrize("field", ["gpu_slots", "fal_max_concurrency"])
def test_a_concurrency_limit_beyond_reason_is_refused_with_its_limit(tmp_path, field):
    spec = _study(tmp_path, run={field: 10**30})
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert f"field `run.{field}`: expected a concurrency limit of at most 100,000" in line


def test_an_asynchronous_ledger_driver_is_refused_at_load_naming_the_fix(tmp_path):
    """``postgresql+asyncpg`` imports (Prefect brings asyncpg), so it passed the driver check and
    the run died at its first query with ``MissingGreenlet``."""
    spec = _study(tmp_path, ledger_url="postgresql+asyncpg://user@127.0.0.1:1/counterfactory")
    line = _one_error(["run", str(spec), "--out", str(tmp_path / "out")])
    assert "field `ledger_url`" in line and "'asyncpg' is asynchronous" in line
    assert "postgresql+psycopg://" in line and "counterfactory[postgres]" in line
    assert not (tmp_path / "out").exists()
