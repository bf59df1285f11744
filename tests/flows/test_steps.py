"""The steps' table of contents (plan_attempts, run_edits, judge_attempts) with a fake editor,
on the bundled photos and the real face and identity models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from counterfactory.flows.engine import execute, run_folder, sources, template
from counterfactory.flows.engine.spec import load_spec
from counterfactory.flows.resume import settled_outcomes
from counterfactory.generation.attempts import plan_attempts
from counterfactory.generation.editors.classical import ClassicalEditor
from counterfactory.generation.editors.fal import FalEditor
from counterfactory.generation.editors.qwen import QwenEditor
from counterfactory.generation.sources import PreparedSource
from counterfactory.validation.faces import face_mask, get_face_landmarker
from counterfactory.validation.gates.locality import FLOOR_IMAGE
from counterfactory.validation.judging import FLOOR_VERDICT, judge_output
from tests.flows.fake_editor import FakeEditor


@pytest.fixture(scope="module")
def spec(specs_dir):
    return load_spec(specs_dir / "demo-face.yaml")


@pytest.fixture(scope="module")
def prepared(spec, tmp_path_factory):
    ws = run_folder.open_workspace(spec, tmp_path_factory.mktemp("prep"))
    usable, failed = sources.prepare_sources(spec, ws.ledger)
    ws.ledger.close()
    assert usable and any("2 faces" in f.reason for f in failed)
    return {p.id: p for p in usable}


@pytest.fixture(scope="module")
def stack(spec):
    return execute.build_gate_stack(spec)


def _with_face_mask(prepared: PreparedSource, mode: str) -> PreparedSource:
    faces = get_face_landmarker().detect(prepared.source.pixels)
    region = face_mask(faces[0].landmarks, prepared.source.pixels.shape[:2], mode=mode)
    return PreparedSource(prepared.source, region, prepared.face_size_px, prepared.meta)


def _ids(spec, prepared, editor, attempt_no: int = 1) -> list[str]:
    cells = sources.plan_grid(spec, [prepared]).cells_of(prepared.id)
    return [p.attempt_id for p in plan_attempts(spec, prepared, cells, editor, editor.lineage(), attempt_no)]


@pytest.mark.slow
def test_a_face_source_check_is_kept_and_read_back_without_the_landmarker(spec, prepared, tmp_path, monkeypatch):
    ws = run_folder.open_workspace(spec, tmp_path)
    first_ok, first_failed = sources.prepare_sources(spec, ws.ledger, ws.store)

    def refuse(*args, **kwargs):
        raise AssertionError("the face landmarker ran again")

    monkeypatch.setattr(sources, "get_face_landmarker", refuse)
    again_ok, again_failed = sources.prepare_sources(spec, ws.ledger, ws.store)
    assert [(p.id, p.face_size_px) for p in again_ok] == [(p.id, p.face_size_px) for p in first_ok]
    # the same masks as a run without the store computes (so the same attempt ids)
    assert all(np.array_equal(a.region, prepared[a.id].region) for a in again_ok)
    assert [(f.id, f.reason) for f in again_failed] == [(f.id, f.reason) for f in first_failed]
    # another face-mask mode decides other masks: checked again
    skin = spec.model_copy(update={"gates": spec.gates.model_copy(update={"face_mask": "skin"})})
    with pytest.raises(AssertionError, match="ran again"):
        sources.prepare_sources(skin, ws.ledger, ws.store)
    ws.ledger.close()


@pytest.mark.slow
def test_the_run_keeps_no_photo_decoded_and_its_templates_see_the_same_pixels(spec, prepared):
    """prepare_sources decodes one photo at a time and keeps each source released, so the run's
    memory does not grow with its photos; a template's pixels are the photo's, decoded again."""
    import pickle

    from counterfactory.generation.images import load_image

    assert prepared and all(not p.source.holds_pixels for p in prepared.values())
    for p in prepared.values():
        expected = load_image(p.source.path, max_pixels=spec.sources.max_pixels)
        assert expected.sha256 == p.source.sha256
        assert np.array_equal(p.source.pixels, expected.pixels)
        # the region is kept packed, one bit a pixel, and unpacks to the edit region the prompt names
        from counterfactory.validation.skin import source_edit_region

        faces = get_face_landmarker().detect(expected.pixels)
        region, _ = source_edit_region(
            expected.pixels, faces[0].landmarks, sources.edit_region_name(spec), mode=spec.gates.face_mask
        )
        assert np.array_equal(p.region, region)
        held = p.held()
        assert held.source.holds_pixels and held.region is held.region  # unpacked once, kept
        # a Ray task's arguments carry both
        carried = pickle.loads(pickle.dumps(p))
        assert carried.source.holds_pixels and np.array_equal(carried.region, p.region)


@pytest.mark.slow
def test_a_photo_changed_during_the_run_fails_its_cells_with_the_reason_and_buys_nothing(spec, tmp_path):
    import shutil

    from PIL import Image

    photos = tmp_path / "photos"
    shutil.copytree(spec.sources.photos, photos)
    local = spec.model_copy(update={"sources": spec.sources.model_copy(update={"photos": photos})})
    ws = run_folder.open_workspace(local, tmp_path / "out")
    usable, _ = sources.prepare_sources(local, ws.ledger, ws.store)
    source = usable[0]
    # another photo of the same size put in its place after the run checked it (read from the
    # file: asking the released source would decode and cache the checked pixels first)
    with Image.open(source.source.path) as image:
        flipped = np.asarray(image.convert("RGB"))[::-1]
    Image.fromarray(np.ascontiguousarray(flipped)).save(source.source.path)
    editor = FakeEditor()
    cells = sources.plan_grid(local, [source]).cells_of(source.id)
    outcome = template.process_template(local, ws, source, cells, editor, None)
    ws.ledger.close()
    assert editor.calls == [] and outcome.editor_calls == 0 and len(outcome.cells) == len(cells)
    assert all(c.verdict == "failed" and c.reasons[0].startswith("source_changed:") for c in outcome.cells)


def test_face_mask_mode_changes_only_ids_of_editors_that_read_the_mask(spec, prepared):
    oval = _with_face_mask(prepared["astronaut"], "oval")
    skin = _with_face_mask(prepared["astronaut"], "skin")
    assert not np.array_equal(oval.region, skin.region)
    for editor in (QwenEditor(), FalEditor()):
        assert _ids(spec, oval, editor) == _ids(spec, skin, editor), editor.name
    # the classical editor paints inside the mask: its ids must follow it
    assert set(_ids(spec, oval, ClassicalEditor())).isdisjoint(_ids(spec, skin, ClassicalEditor()))
    # qwen's inpaint pipeline reads the mask, so forcing it on face cells puts the mask back in
    inpaint = QwenEditor(QwenEditor().options.model_copy(update={"pipeline": "inpaint"}))
    assert set(_ids(spec, oval, inpaint)).isdisjoint(_ids(spec, skin, inpaint))


def test_resolved_revision_and_seed_change_ids(spec, prepared):
    source = prepared["astronaut"]

    class Resolved(FakeEditor):
        def __init__(self, commit: str) -> None:
            super().__init__()
            self.commit = commit

        def lineage(self):
            return {**super().lineage(), "revision": self.commit}

    a, b = _ids(spec, source, Resolved("a" * 40)), _ids(spec, source, Resolved("b" * 40))
    assert len(set(a)) == len(a) and set(a).isdisjoint(b)
    assert set(_ids(spec, source, FakeEditor(), 1)).isdisjoint(_ids(spec, source, FakeEditor(), 2))


def test_judge_key_hashes_only_the_active_kind(spec):
    other = spec.gates.model_copy(update={"limb": spec.gates.limb.model_copy(update={"expression": None})})
    assert execute.judge_key(spec.model_copy(update={"gates": other})) == execute.judge_key(spec)
    own = spec.gates.model_copy(update={"face": spec.gates.face.model_copy(update={"expression": None})})
    assert execute.judge_key(spec.model_copy(update={"gates": own})) != execute.judge_key(spec)
    # limb-mask growth does not decide a face verdict
    masks = spec.masks.model_copy(update={"dilate_px": 9})
    assert execute.judge_key(spec.model_copy(update={"masks": masks})) == execute.judge_key(spec)


@pytest.mark.slow
def test_process_template_runs_each_cell_once_and_never_again(spec, prepared, stack, tmp_path):
    ws = run_folder.open_workspace(spec, tmp_path)
    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)
    editor = FakeEditor()
    first = template.process_template(spec, ws, source, cells, editor, stack)
    assert len(first.cells) == len(cells) == 6
    assert first.editor_calls == len(editor.calls) >= len(cells)
    for outcome in first.cells:
        candidate = ws.ledger.candidate(outcome.final_attempt)
        assert candidate is not None and candidate.verdict == outcome.verdict
        assert candidate.alignment["ok"] is True
        assert "identity" in candidate.gates and "locality" in candidate.gates
    again = FakeEditor()
    second = template.process_template(spec, ws, source, cells, again, stack)
    assert second.editor_calls == 0 and again.calls == []
    assert [c.verdict for c in second.cells] == [c.verdict for c in first.cells]
    # the ledger alone settles the template as the run did (a re-run needs no Prefect then)
    grid = sources.plan_grid(spec, [source])
    (settled,) = settled_outcomes(spec, ws, [source], grid.cells, FakeEditor())
    assert [(c.final_attempt, c.attempt_ids, c.verdict, c.reasons) for c in settled.cells] == [
        (c.final_attempt, c.attempt_ids, c.verdict, c.reasons) for c in first.cells
    ]
    # but not when there is work: other gate settings, a lost image, an attempt never made
    stricter = spec.model_copy(update={"align": spec.align.model_copy(update={"max_residual_px": 1.5})})
    assert settled_outcomes(stricter, ws, [source], grid.cells, FakeEditor()) is None
    assert settled_outcomes(spec, ws, [source], grid.cells, FakeEditor(lift=13)) is None
    ws.store.path(ws.ledger.candidate(first.cells[0].final_attempt).image_sha256).unlink()
    assert settled_outcomes(spec, ws, [source], grid.cells, FakeEditor()) is None
    ws.ledger.close()


@pytest.mark.slow
def test_refused_and_failed_attempts_are_retried_with_the_next_seed(spec, prepared, stack, tmp_path):
    ws = run_folder.open_workspace(spec, tmp_path)
    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)[:2]
    editor = FakeEditor()
    plans = plan_attempts(spec, source, cells, editor, editor.lineage(), 1)
    editor.script = {plans[0].attempt_id: "refused", plans[1].attempt_id: "failed"}
    assert execute.run_edits(ws, editor, plans, editor.lineage()) == 2
    verdicts = execute.judge_attempts(spec, ws, source, plans, stack, execute.judge_key(spec))
    assert verdicts[0] == ("rejected", ["editor_refused: fake_refused"])
    assert verdicts[1] == ("failed", ["fake_failed"])
    # a refusal is final (never paid again), a failure is run again
    assert execute.run_edits(ws, editor, plans, editor.lineage()) == 1
    # the refused cell moves on to seed 2; the failed attempt 1 is run again and now succeeds
    outcome = template.process_template(spec, ws, source, cells, FakeEditor(), stack)
    assert [len(c.attempt_ids) for c in outcome.cells] == [2, 1]
    assert outcome.cells[0].final_attempt != plans[0].attempt_id
    assert outcome.cells[1].final_attempt == plans[1].attempt_id and outcome.cells[1].verdict != "failed"
    ws.ledger.close()


@pytest.mark.slow
def test_outputs_judged_from_memory_match_a_judgement_read_back_from_the_store(spec, prepared, stack, tmp_path):
    """The run hands each output to the judge as an array and shares the source's alignment
    work across the template; judging the stored PNG from scratch must give the same candidate."""
    from counterfactory.manifests.store import ImageStore

    ws = run_folder.open_workspace(spec, tmp_path / "run")
    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)[:2]
    outcome = template.process_template(spec, ws, source, cells, FakeEditor(), stack)
    fresh_store = ImageStore(tmp_path / "fresh")
    # the cells were judged above the template's noise floor: the fresh judgement is too
    (floor_row,) = ws.ledger.candidates_of_cells([f"{source.id}|{FLOOR_VERDICT}"])
    floor = template.floor_metrics(floor_row.gates, floor_row.attempt_id, floor_row.image_sha256)
    assert floor is not None and floor["image_sha256"] == floor_row.image_sha256
    # and pixel by pixel against the floor output itself, which the run read from its store
    floor_image = ws.store.get(floor_row.image_sha256)
    for cell in outcome.cells:
        attempt, candidate = ws.ledger.attempt(cell.final_attempt), ws.ledger.candidate(cell.final_attempt)
        fresh = judge_output(
            source.source.pixels,
            ws.store.get(attempt.output_sha256),
            kind="face",
            region=source.region,
            face_size_px=source.face_size_px,
            align=spec.align,
            stack=stack,
            store=fresh_store,
            extras={
                "condition": dict(cell.cell.condition),
                "source": source.meta,
                "noise_floor": floor,
                FLOOR_IMAGE: floor_image,
            },
        )
        assert isinstance(candidate.gates["locality"]["metrics"]["excess_share"], float)
        assert candidate.image_sha256 == fresh.image_sha256 is not None
        assert (candidate.verdict, candidate.reasons) == (fresh.verdict, fresh.reasons)
        assert candidate.alignment == json.loads(json.dumps(fresh.alignment))
        assert candidate.gates == json.loads(json.dumps(fresh.gates, default=float))
    ws.ledger.close()


def test_unregistrable_output_still_gets_face_metrics(spec, prepared, stack):
    source = prepared["grace_hopper"]
    pixels = source.source.pixels
    flipped = np.ascontiguousarray(pixels[::-1])  # upside down: no transform within bounds maps it back
    judged = judge_output(
        pixels,
        flipped,
        kind="face",
        region=source.region,
        face_size_px=source.face_size_px,
        align=spec.align,
        stack=stack,
    )
    assert judged.verdict == "rejected" and judged.reasons[0].startswith("align_")
    assert judged.gates["locality"]["measurable"] is False
    assert "face" in judged.gates and "identity" in judged.gates


@pytest.mark.slow
def test_a_status_poll_outage_buys_zero_extra_requests(spec, prepared, stack, tmp_path, monkeypatch):
    from tests.generation.fal_server import Behaviour, FalServer

    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)[:3]
    monkeypatch.setattr(template, "RESUME_WAITS_S", (0.0, 0.0, 0.0))
    editor = FalEditor(
        FalEditor().options.model_copy(update={"backoff_s": 0.01, "poll_interval_s": 0.01, "max_retries": 1})
    )
    with FalServer(latency_s=0.05, model="copy") as server, server.patch_environment():
        editor.prepare()
        plans = plan_attempts(spec, source, cells, editor, editor.lineage(), 1)
        # the outage: the first four status polls of every job fail (503), more than one
        # editor-level try (1 + max_retries) can absorb; the jobs are already running, so the
        # cancel sent when the polls give up comes too late to stop them
        for plan in plans:
            server.behave(plan.request.prompt, Behaviour(status_errors=(503, 503, 503, 503), queued_s=0.0))
        ws = run_folder.open_workspace(spec, tmp_path)
        outcome = template.process_template(spec, ws, source, cells, editor, stack)
        # reproduction: every cell used to fail its first attempt and buy seed 2 (2 paid each)
        # (one request per cell, and the template's one noise-floor request)
        assert sum(server.paid_submits.values()) == len(cells) + 1
        assert max(server.paid_submits.values()) == 1
        assert [len(c.attempt_ids) for c in outcome.cells] == [1] * len(cells)
        assert all(c.verdict == "needs_review" for c in outcome.cells), [c.reasons for c in outcome.cells]
        # the fetches were resumptions of the journalled requests, not new submissions
        assert all(ws.ledger.attempt(c.final_attempt).meta["resumed"] for c in outcome.cells)
        ws.ledger.close()


@pytest.mark.slow
def test_a_request_still_out_after_the_waits_is_fetched_by_the_next_run(spec, prepared, stack, tmp_path, monkeypatch):
    from tests.generation.fal_server import Behaviour, FalServer

    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)[:2]
    monkeypatch.setattr(template, "RESUME_WAITS_S", (0.0,))
    editor = FalEditor(
        FalEditor().options.model_copy(update={"backoff_s": 0.01, "poll_interval_s": 0.01, "max_retries": 0})
    )
    with FalServer(latency_s=0.05, model="copy") as server, server.patch_environment():
        editor.prepare()
        for plan in plan_attempts(spec, source, cells, editor, editor.lineage(), 1):
            server.behave(plan.request.prompt, Behaviour(status_errors=(503, 503, 503), queued_s=0.0))
        ws = run_folder.open_workspace(spec, tmp_path)
        first = template.process_template(spec, ws, source, cells, editor, stack)
        # two tries in this run, both in the outage: the cells stay failed, no seed 2 is bought
        assert [c.verdict for c in first.cells] == ["failed", "failed"]
        assert all("fal_unavailable" in c.reasons[0] for c in first.cells)
        assert [len(c.attempt_ids) for c in first.cells] == [1, 1]
        second = template.process_template(spec, ws, source, cells, editor, stack)
        assert [c.verdict for c in second.cells] == ["needs_review", "needs_review"]
        # each cell once, and the template's noise-floor request once
        assert sum(server.paid_submits.values()) == len(cells) + 1
        ws.ledger.close()


KILL_SCRIPT = """
import sys, time
import yaml
from counterfactory.flows.engine import execute, run_folder, sources, template
from counterfactory.generation.attempts import plan_attempts
from counterfactory.flows.resume import settled_outcomes
from counterfactory.flows.engine.spec import load_spec
from tests.flows.fake_editor import FakeEditor

class Slow(FakeEditor):
    def edit(self, request):
        time.sleep(0.05)
        return super().edit(request)

spec = load_spec(sys.argv[1])
ws = run_folder.open_workspace(spec, sys.argv[2])
prepared, _ = sources.prepare_sources(spec, ws.ledger)
source = prepared[0]
cells = sources.plan_grid(spec, [source]).cells_of(source.id)
assert len(cells) == 80, len(cells)
editor = Slow()
plans = plan_attempts(spec, source, cells, editor, editor.lineage(), 1)
print("calls", execute.run_edits(ws, editor, plans, editor.lineage()), flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_an_80_cell_template_loses_only_the_edit_in_flight(specs_dir, tmp_path):
    import sqlite3
    import subprocess
    import sys
    import time

    import yaml

    from tests.conftest import REPO

    photos = specs_dir.parent / "photos"
    (tmp_path / "meta.yaml").write_text(
        yaml.safe_dump({"sources": [{"id": "grace", "path": "grace_hopper.jpg", "licence": "PD"}]})
    )
    spec = {
        "name": "eighty",
        "sources": {"photos": str(photos), "metadata": str(tmp_path / "meta.yaml")},
        "design": {
            "kind": "face",
            "axes": {"race": [f"group{i}" for i in range(80)]},
            "strata": [],
            "templates_per_stratum": 1,
        },
        "prompts": {"target_group": "{article} {race} person"},
        "release": {"name": "eighty"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    args = [sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "spec.yaml"), str(out)]

    def finished() -> int:
        uri = f"file:{out / 'ledger.sqlite'}?mode=ro"
        with sqlite3.connect(uri, uri=True) as db:
            return db.execute("select count(*) from attempts where status='ok'").fetchone()[0]

    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        done = 0
        while time.time() < deadline and proc.poll() is None and done < 20:
            time.sleep(0.05)
            try:
                done = finished()
            except sqlite3.OperationalError:
                continue
        assert proc.poll() is None, "the template finished before it could be killed"
        proc.kill()  # SIGKILL
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # reproduction: results were committed when the whole template's batch returned, so a
    # kill here used to leave 0 of 80 finished edits in the ledger
    before = finished()
    assert 20 <= before < 80
    resumed = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    calls = int(resumed.stdout.split()[-1])
    assert calls <= 80 - before + 1  # the finished edits are never bought again; one was in flight
    assert finished() == 80


def test_a_key_rejected_mid_run_stops_the_template_with_one_error(spec, prepared, stack, tmp_path, monkeypatch):
    from counterfactory.manifests.errors import SetupError
    from tests.generation.fal_server import FalServer

    source = prepared["grace_hopper"]
    cells = sources.plan_grid(spec, [source]).cells_of(source.id)
    with FalServer(latency_s=0.05, model="copy") as server, server.patch_environment():
        # the key authenticates (prepare passes) but the account may not submit (HTTP 403)
        monkeypatch.setenv("FAL_KEY", server.locked_keys[0])
        editor = FalEditor(FalEditor().options.model_copy(update={"backoff_s": 0.01, "poll_interval_s": 0.01}))
        editor.prepare()
        ws = run_folder.open_workspace(spec, tmp_path)
        with pytest.raises(SetupError, match="HTTP 403"):
            template.process_template(spec, ws, source, cells, editor, stack)
        # reproduction: every item used to end as a `failed` row and the next seed was tried
        attempts = ws.ledger.attempts()
        assert attempts and {a.attempt_no for a in attempts} == {1}
        assert "failed" not in {a.status for a in attempts}
        assert sum(server.paid_submits.values()) == 0
        ws.ledger.close()
