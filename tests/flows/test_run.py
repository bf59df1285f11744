"""End to end through the real command line, Prefect flow, models and photos."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from counterfactory.flows.engine.verify import verify_release
from counterfactory.generation.masks import dilate, mask_from_record
from counterfactory.generation.sources import load_image, load_metadata
from tests.conftest import REPO, demo_spec, read_rgb
from tests.generation import badinputs

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
# the demo's grid has holes (a two-person photo, rejected cells): publishing it needs consent
PUBLISH = ["--publish", "--allow-incomplete"]


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, cwd=REPO, capture_output=True, text=True, timeout=900, **kwargs)


def _release(out: Path, name: str = "demo-face", version: str = "0.1.0") -> Path:
    return out / "releases" / name / version


def _ledger(out: Path, *, write: bool = False) -> sqlite3.Connection:
    # read-only by default: a plain connect would create an empty ledger file before the run does
    mode = "rw" if write else "ro"
    return sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode={mode}", uri=True)


def test_demo_release_has_every_file(demo_run):
    out, first = demo_run.out, demo_run.run_stdout
    release = _release(out)
    for name in ("manifest.jsonl", "items.jsonl", "spec.yaml", "stats.json", "report.html", "checksums.sha256"):
        assert (release / name).is_file(), name
    assert verify_release(release) == []
    stats = json.loads((release / "stats.json").read_text())
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    # 3 strata (astronaut/female, naval officer/female, politician/male) x 1 template x 6 conditions
    assert stats["items"]["total"] == len(items) == 18
    assert sum(stats["items"][s] for s in ("accepted", "needs_review", "rejected", "failed")) == 18
    assert {i["template_id"] for i in items} >= {"astronaut", "grace_hopper"}
    # the two-person photo is a failed source with its reason, not a silent drop
    failed = {f["source_id"]: f["reason"] for f in stats["failed_sources"]}
    assert "2 faces" in failed["two_people"]
    manifest = [json.loads(line) for line in (release / "manifest.jsonl").read_text().splitlines()]
    assert manifest and all(row["status"] == "accepted" for row in manifest)
    for row in manifest:
        image = release / row["image"]["path"]
        source = release / row["source"]["path"]
        assert image.is_file() and source.is_file()
        with Image.open(image) as im, Image.open(source) as src:
            assert im.size == src.size  # aligned back to the source frame
        assert row["editor"]["backend"] == "classical" and row["editor"]["prompt"]
        assert row["alignment"]["ok"] is True
    report = (release / "report.html").read_text()
    assert "contact_sheets/astronaut.jpg" in report and 'id="status-counts"' in report
    # the skin gate measured every judged candidate; the report shows ITA change per condition
    judged = [i for i in items if i["status"] in ("accepted", "needs_review")]
    assert judged and all(i["gates"]["skin"]["metrics"]["face_ita_change_deg"] is not None for i in judged)
    assert stats["skin"]["by_condition"] and (release / "skin_tone.png").is_file()
    assert 'id="skin-by-condition"' in report and stats["labels"] == {"by_condition": []}
    sheet = release / "contact_sheets" / "astronaut.jpg"
    with Image.open(sheet) as im:
        assert im.width > 6 * 150  # the source and six conditions side by side
    with _ledger(out) as db:
        attempts = db.execute("select count(*) from attempts").fetchone()[0]
    # one call per attempt: every cell once, plus a retry with the next seed for rejected ones
    assert attempts >= 18 and f"editor calls: {attempts}" in first
    # the run's own count is the run's summary's, not the release's (a release depends only on its inputs)
    assert "editor_calls_this_run" not in stats and "Editor calls" not in report


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


def test_rerun_makes_zero_editor_calls_and_keeps_the_release(demo_run, tmp_path):
    # the session's run is shared: re-run a copy (copytree keeps the files' mtimes)
    out = tmp_path / "out"
    shutil.copytree(demo_run.out, out, ignore=shutil.ignore_patterns(".run.lock"))
    before = _files(_release(out))
    again = _run(["run", "assets/specs/demo-face.yaml", "--out", str(out), "--no-progress", *PUBLISH])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "editor calls: 0" in again.stdout
    assert "unchanged" in again.stdout
    # settled from the ledger: Prefect was not started, and the release was not rebuilt (not one
    # file rewritten: same bytes, same mtimes), because it records the inputs it was built from
    assert "every cell was already settled in the ledger" in again.stdout
    assert _files(_release(out)) == before
    assert len(json.loads((_release(out) / "release.json").read_text())["inputs_sha256"]) == 64
    with _ledger(out) as db:
        assert db.execute("select max(calls) from attempts").fetchone()[0] == 1
        runs = db.execute("select editor_calls, status from runs order by started_at").fetchall()
    assert runs[-1] == (0, "completed")


def test_sigkill_half_way_then_resume_loses_nothing(demo_run, killed_demo):
    # the session's kill (tests/conftest.py::killed_demo): the demo's run with one worker,
    # SIGKILLed with its group once 6 attempts were finished, then run again to completion
    reference_out, out = demo_run.out, killed_demo.out
    finished_before_kill, in_flight_at_kill = killed_demo.killed.ok_calls, killed_demo.killed.in_flight
    assert killed_demo.killed.finished >= 6 and len(finished_before_kill) < 18
    with _ledger(out) as db:
        calls = dict(db.execute("select attempt_id, calls from attempts").fetchall())
        statuses = dict(db.execute("select attempt_id, status from attempts").fetchall())
    # no finished attempt ran again; only the ones in flight at the kill may have run twice
    for attempt_id, n in finished_before_kill.items():
        assert calls[attempt_id] == n == 1
    assert {a for a, c in calls.items() if c > 1} <= in_flight_at_kill
    assert max(calls.values()) <= 2
    assert set(statuses.values()) <= {"ok", "refused"}
    release = _release(out)
    assert verify_release(release) == []
    # the resumed release is the release an uninterrupted run makes
    assert (release / "manifest.jsonl").read_bytes() == (_release(reference_out) / "manifest.jsonl").read_bytes()


def test_bad_inputs_fail_with_reasons_and_the_run_completes(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(REPO / "assets/photos/grace_hopper.jpg", photos / "grace.jpg")
    shutil.copy(REPO / "assets/photos/grace_hopper.jpg", photos / "grace_again.jpg")  # one photo, two ids
    shutil.copy(REPO / "assets/photos/two_people.jpg", photos / "two.jpg")
    Image.fromarray(np.ascontiguousarray(read_rgb("astronaut.png")[0:300, 330:512])).save(photos / "shuttle.png")
    written = {
        "truncated": badinputs.write_truncated_jpeg(photos),
        "zero": badinputs.write_zero_byte(photos),
        "text": badinputs.write_text_as_jpg(photos),
        "huge": badinputs.write_huge_png(photos),
        "long": badinputs.write_long_png(photos),  # aborted the whole process inside MediaPipe
    }
    entries = [
        {"id": "grace", "path": "grace.jpg"},
        {"id": "grace_again", "path": "grace_again.jpg"},
        {"id": "two", "path": "two.jpg"},
        {"id": "shuttle", "path": "shuttle.png"},
    ] + [{"id": key, "path": path.name} for key, path in written.items()]
    for entry in entries:
        entry.update(licence="public domain", occupation="officer", presented_gender="female")
    (tmp_path / "metadata.yaml").write_text(yaml.safe_dump({"sources": entries}))
    spec = {
        "name": "bad-inputs",
        "sources": {"photos": "photos", "metadata": "metadata.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": ["Black"], "gender": ["female", "male"]},
            "strata": ["occupation"],
            "templates_per_stratum": 5,
        },
        "editor": {"backend": "classical", "max_attempts": 1},
        # as in the demo: the classical editor's colour change stays near the source identity
        "gates": {"face": {"identity": {"max_cosine": 0.995}}},
        "release": {"name": "bad-inputs", "version": "0.1.0"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = _run(["run", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out"), "--no-progress", *PUBLISH])
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads((_release(tmp_path / "out", "bad-inputs") / "stats.json").read_text())
    failed = {f["source_id"]: f["reason"].lower() for f in stats["failed_sources"]}
    assert set(failed) == {"two", "shuttle", "truncated", "zero", "text", "huge", "long", "grace_again"}
    assert "source_duplicate" in failed["grace_again"] and "'grace'" in failed["grace_again"]
    assert "33000x900" in failed["long"]
    assert "2 faces" in failed["two"] and "no face" in failed["shuttle"]
    assert "truncated" in failed["truncated"] or "corrupt" in failed["truncated"]
    assert "empty" in failed["zero"] or "zero" in failed["zero"]
    assert "not an image" in failed["text"] or "cannot identify" in failed["text"]
    assert "pixels" in failed["huge"]
    for key, path in written.items():
        assert (
            path.name in stats["failed_sources"][[f["source_id"] for f in stats["failed_sources"]].index(key)]["path"]
        )
    assert stats["items"]["total"] == 2  # grace's two cells ran


def test_broken_spec_stops_before_any_work(tmp_path):
    text = (REPO / "assets/specs/demo-face.yaml").read_text().replace("../photos", str(REPO / "assets/photos"))
    bad = tmp_path / "broken.yaml"
    bad.write_text(text.replace("templates_per_stratum: 1", "templates_per_stratum: lots"))
    out = tmp_path / "out"
    result = _run(["run", str(bad), "--out", str(out)])
    assert result.returncode == 2
    assert "`design.templates_per_stratum`" in result.stderr and "'lots'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_limb_demo_keeps_every_pixel_outside_the_mask(tmp_path):
    out = tmp_path / "out"
    result = _run(["run", "assets/specs/demo-limb.yaml", "--out", str(out), "--no-progress", *PUBLISH])
    assert result.returncode == 0, result.stderr[-3000:]
    release = _release(out, "demo-limb")
    assert verify_release(release) == []
    records = {r.id: r for r in load_metadata(REPO / "assets/photos/limb-metadata.yaml")}
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    assert {(i["template_id"], i["condition"]["cue"]) for i in items} == {
        (s, c) for s in records for c in ("removed", "kept")
    }
    for item in items:
        assert item["image"] is not None, item["reasons"]
        source = load_image(release / item["source"]["path"]).pixels
        candidate = load_image(release / item["image"]["path"]).pixels
        # the limb mask as drawn, before the spec's 4 px dilation: outside the grown mask,
        # the release image is the source bit for bit
        mask = mask_from_record(records[item["template_id"]], REPO / "assets/photos", source.shape[:2])
        outside = dilate(mask, 4) == 0
        assert np.array_equal(candidate[outside], source[outside])
        assert not np.array_equal(candidate[~outside], source[~outside])
        assert item["gates"]["locality"]["metrics"]["diff_outside_edit"] == 0.0


def test_broken_metadata_stops_before_any_work(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "meta.yaml").write_text("sources:\n  - {id: a, path: a.jpg, occupation: pilot}\n")
    spec = {
        "name": "broken-metadata",
        "sources": {"photos": "photos", "metadata": "meta.yaml"},
        "design": {"kind": "face", "axes": {"race": ["Black"]}, "strata": ["occupation"], "templates_per_stratum": 1},
        "release": {"name": "broken-metadata"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    result = _run(["run", str(tmp_path / "spec.yaml"), "--out", str(out)])
    assert result.returncode == 2
    assert "meta.yaml" in result.stderr and "licence" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_deleted_store_is_rebuilt_by_rerunning_only_those_attempts(demo_run, tmp_path):
    reference = demo_run.out
    out = tmp_path / "out"
    # its 0.1.0 release only: the session also published 0.2.0 there, the version this test publishes
    shutil.copytree(reference, out, ignore=lambda folder, names: {".run.lock"} | (
        {demo_run.republished.name} if Path(folder) == demo_run.republished.parent else set()
    ))  # fmt: skip
    with _ledger(out, write=True) as db:
        db.execute(
            "insert into attempts (attempt_id, cell_id, attempt_no, seed, backend, lineage, prompt, status, "
            "cost_usd, calls, meta, created_at) values ('f' || hex(randomblob(31)), 'other-spec|x', 1, 0, "
            "'fal', '{}', 'p', 'ok', 5.0, 1, '{}', '2026-01-01')"
        )
        ok = db.execute("select count(*) from attempts where status='ok' and backend='classical'").fetchone()[0]
    # reproduction: the whole store is gone (before: a raw FileNotFoundError traceback)
    shutil.rmtree(out / "store")
    spec = demo_spec(tmp_path, release={"version": "0.2.0"})
    result = _run(["run", str(spec), "--out", str(out), "--no-progress", *PUBLISH])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"note: {ok} finished edit(s) had lost their image" in result.stderr
    assert f"editor calls: {ok}" in result.stdout  # only the attempts whose images were lost
    with _ledger(out) as db:
        assert db.execute("select max(calls) from attempts where backend='classical'").fetchone()[0] == 2
    release = _release(out, version="0.2.0")
    assert verify_release(release) == []
    manifest = (release / "manifest.jsonl").read_text()
    assert manifest.replace('"0.2.0"', '"0.1.0"') == (_release(reference) / "manifest.jsonl").read_text()
    stats = json.loads((release / "stats.json").read_text())
    # the other spec's $5 attempt shares the ledger but is not this release's spending
    assert stats["cost_usd_total"] == 0.0


def test_a_second_run_on_the_same_folder_is_refused_and_nothing_is_paid_twice(tmp_path):
    out = tmp_path / "out"
    spec = str(demo_spec(tmp_path, strata=[]))  # one template: the first run's six cells outlast the second
    first = subprocess.Popen(
        CLI + ["run", spec, "--out", str(out), "--no-progress", "--workers", "1", *PUBLISH],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
            try:
                with _ledger(out) as db:
                    if db.execute("select count(*) from attempts").fetchone()[0]:
                        break
            except sqlite3.OperationalError:
                continue
        assert first.poll() is None, "the first run ended before the second could start"
        second = _run(["run", spec, "--out", str(out), "--no-progress", *PUBLISH])
        assert second.returncode == 2
        assert "another counterfactory run is using this folder" in second.stderr
        assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr[-3000:]
    with _ledger(out) as db:
        assert db.execute("select max(calls) from attempts").fetchone()[0] == 1  # one call per attempt
    assert verify_release(_release(out)) == []


def _group_members(pgid: int) -> list[str]:
    """Command lines of live processes in process group ``pgid`` (zombies excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            continue
    return members


def _start_and_wait_for_attempts(out: Path, minimum: int = 1) -> subprocess.Popen:
    proc = subprocess.Popen(
        CLI + ["run", "assets/specs/demo-face.yaml", "--out", str(out), "--no-progress", "--workers", "1", *PUBLISH],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: anything it leaves behind is findable
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
        try:
            with _ledger(out) as db:
                if db.execute("select count(*) from attempts").fetchone()[0] >= minimum:
                    return proc
        except sqlite3.OperationalError:
            continue
    proc.kill()
    raise AssertionError("the run ended or stalled before any attempt started")


def test_sigterm_stops_within_seconds_and_leaves_no_server(tmp_path):
    out = tmp_path / "out"
    proc = _start_and_wait_for_attempts(out)
    try:
        # reproduction: SIGTERM was ignored during a template, Ctrl-C took ~76 s, and a killed
        # run left Prefect's uvicorn server running
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - started < 5
        assert proc.returncode == 128 + signal.SIGTERM
        assert b"SIGTERM: stopped" in stderr and b"Traceback" not in stderr
        time.sleep(0.5)
        assert _group_members(proc.pid) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # a SIGKILL of the CLI alone (not its group) leaves nothing behind either
    proc = _start_and_wait_for_attempts(out, minimum=8)
    try:
        proc.kill()
        proc.wait(timeout=30)
        time.sleep(0.5)
        assert _group_members(proc.pid) == []
    finally:
        if _group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.timeout(1800)  # eleven demo start-ups; about 3 minutes on an idle 2-core machine
def test_crash_loop_ten_sigkills_then_the_release_of_an_uninterrupted_run(demo_run, tmp_path):
    reference = demo_run.out
    out = tmp_path / "out"
    rng = random.Random(8)  # seeded kill points
    kills = 0
    # one template at a time, so that a kill interrupts at most one edit
    args = CLI + ["run", "assets/specs/demo-face.yaml", "--out", str(out), "--no-progress", "--workers", "1", *PUBLISH]
    for _ in range(10):
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            proc.wait(timeout=rng.uniform(2.0, 20.0))
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL to the CLI alone, not its process group
            proc.wait(timeout=30)
            kills += 1
        time.sleep(0.3)
        leftover = _group_members(proc.pid)
        if leftover:
            os.killpg(proc.pid, signal.SIGKILL)
        assert leftover == [], leftover  # no Prefect server (or anything else) outlives the run
    final = _run(["run", "assets/specs/demo-face.yaml", "--out", str(out), "--no-progress", *PUBLISH])
    assert final.returncode == 0, final.stderr[-3000:]
    release = _release(out)
    assert verify_release(release) == []
    assert (release / "manifest.jsonl").read_bytes() == (_release(reference) / "manifest.jsonl").read_bytes()
    with _ledger(out) as db:
        calls, attempts = db.execute("select sum(calls), count(*) from attempts").fetchone()
    # each kill can cost at most the one edit it interrupted
    assert calls - attempts <= kills


def test_a_settled_rerun_sends_the_same_statements_however_many_ids_a_query_holds(demo_run, tmp_path, monkeypatch):
    """A re-run of a finished run reads the ledger in a bounded number of statements that does
    not grow with its cells: with the longest IN list cut from 500 ids to 2 (so every read of
    the demo's cells would need several), it sends exactly the statements it sends otherwise,
    and records its sources in at most two (usable, failed). On the old code: one upsert per
    source (7), and no ``_CHUNK`` to cut."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.flows.resume import run_spec
    from counterfactory.manifests import ledger as ledger_module

    sent: list[str] = []

    def count(conn, cursor, statement, *rest):
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        counts = []
        for chunk in (500, 2):
            monkeypatch.setattr(ledger_module, "_CHUNK", chunk)
            out = tmp_path / f"out-{chunk}"
            shutil.copytree(demo_run.out, out, ignore=shutil.ignore_patterns(".run.lock"))
            sent.clear()
            summary = run_spec(load_spec(REPO / "assets/specs/demo-face.yaml"), out, progress=False, publish=True,
                               allow_incomplete=True)  # fmt: skip
            assert summary.settled and summary.editor_calls == 0 and not summary.release_created
            counts.append(len(sent))
            # one executemany per shape of row (the usable sources, the failed ones), not one per source
            assert sum(s.lstrip().upper().startswith("INSERT INTO SOURCES") for s in sent) <= 2, sent
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert counts[0] == counts[1] < 60, counts
