"""The command line beyond `run`: backend switching, setup errors, measure, calibrate, verify."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from tests.conftest import REPO, read_rgb
from tests.generation.fal_server import FalServer

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]


def _run(args, env=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(CLI + args, cwd=REPO, capture_output=True, text=True, timeout=900, env=full_env)


def _demo_with(tmp_path: Path, backend: str, **editor_options) -> Path:
    """demo-face.yaml with only `editor.backend` (and that backend's options) changed."""
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    spec["sources"] = {"photos": str(REPO / "assets/photos"), "metadata": str(REPO / "assets/photos/metadata.yaml")}
    spec["editor"]["backend"] = backend
    if editor_options:
        spec["editor"][backend] = editor_options
    path = tmp_path / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _no_fal_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FAL_")}


@pytest.mark.slow
def test_same_spec_runs_on_fal_through_the_real_client(tmp_path):
    """Switch the demo to `fal` and run it against a local fal queue: edits, alignment of
    Nano-Banana-sized outputs and gates, with every request paid once."""
    with FalServer(model="resize", resize_to=(896, 1152)) as server:
        spec = _demo_with(tmp_path, "fal", concurrency=4)
        data = yaml.safe_load(spec.read_text())
        data["design"]["strata"] = []  # one template of six cells: the editor's path, not the grid
        spec.write_text(yaml.safe_dump(data))
        out = tmp_path / "out"
        # the local queue returns the photo unchanged, so every cell waits for review and there is
        # nothing to publish: this test is about the editor, so it reads the ledger, not a release
        first = _run(["run", str(spec), "--out", str(out), "--no-progress"], env=server.env())
        assert first.returncode == 0, first.stderr[-3000:]
        again = _run(["run", str(spec), "--out", str(out), "--no-progress"], env=server.env())
        assert again.returncode == 0 and "editor calls: 0" in again.stdout
        stats = server.stats()
    with sqlite3.connect(out / "ledger.sqlite") as db:
        attempts = db.execute("select count(*), sum(cost_usd) from attempts where backend='fal'").fetchone()
        journal = db.execute("select count(*) from editor_journal where backend='fal'").fetchone()[0]
        alignments = [json.loads(a) for (a,) in db.execute("select alignment from candidates")]
    assert attempts[0] >= 6 and journal == attempts[0]
    assert attempts[1] == pytest.approx(0.039 * attempts[0])
    assert stats["max_paid_per_payload"] == 1  # no paid request submitted twice
    assert stats["paid_submits"] == attempts[0]
    aligned = [a for a in alignments if a and a.get("ok")]
    assert aligned and all(a["resize_from"] == [896, 1152] for a in aligned)


@pytest.mark.slow
def test_missing_fal_key_stops_before_any_work(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        CLI + ["run", str(_demo_with(tmp_path, "fal")), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=_no_fal_env(),
        timeout=300,
    )
    assert result.returncode == 2
    assert "FAL_KEY" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_unknown_fal_endpoint_is_one_clear_message(tmp_path):
    out = tmp_path / "out"
    spec = _demo_with(tmp_path, "fal", endpoint="not an endpoint")
    result = subprocess.run(
        CLI + ["run", str(spec), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**_no_fal_env(), "FAL_KEY": "k:s"},
        timeout=300,
    )
    assert result.returncode == 2
    assert "fal-ai/nano-banana/edit" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_qwen_without_a_gpu_stops_before_any_work(tmp_path):
    out = tmp_path / "out"
    result = _run(["run", str(_demo_with(tmp_path, "qwen")), "--out", str(out)])
    assert result.returncode == 2
    assert "GPU" in result.stderr or "cuda" in result.stderr.lower()
    assert "Traceback" not in result.stderr and not out.exists()


@pytest.mark.slow
def test_qwen_model_not_downloaded_is_named(tmp_path):
    out = tmp_path / "out"
    spec = _demo_with(tmp_path, "qwen", device="cpu", model_id="Qwen/Qwen-Image-Edit-2509")
    result = _run(["run", str(spec), "--out", str(out)], env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2
    assert "Qwen/Qwen-Image-Edit-2509" in result.stderr and "download" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A real photo and a candidate an editor might return: shifted 3 px and resized to 1024."""
    folder = tmp_path_factory.mktemp("pair")
    source = read_rgb("grace_hopper.jpg")
    m = np.float32([[1, 0, 3], [0, 1, -2]])
    moved = cv2.warpAffine(source, m, (source.shape[1], source.shape[0]), borderMode=cv2.BORDER_REFLECT)
    Image.fromarray(source).save(folder / "source.png")
    Image.fromarray(cv2.resize(moved, (1024, 1024), interpolation=cv2.INTER_AREA)).save(folder / "candidate.png")
    return folder / "source.png", folder / "candidate.png"


@pytest.mark.slow
def test_measure_prints_every_gate_as_json(pair):
    source, candidate = pair
    result = _run(["measure", str(source), str(candidate), "--json"])
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert set(report["gates"]) >= {"face", "identity", "expression", "locality"}
    assert report["alignment"]["ok"] and report["alignment"]["resize_from"] == [1024, 1024]
    assert report["alignment"]["shift_px"] == pytest.approx([3, -2], abs=0.5)
    assert report["gates"]["identity"]["metrics"]["cosine"] > 0.87  # the same photo: a copy
    # a copy goes to review by its unchanged face, not by an identity ceiling (issue 9)
    assert "locality_face_unchanged" in report["gates"]["locality"]["review"]
    assert report["gates"]["identity"]["review"] == []


@pytest.mark.slow
def test_measure_text_output_and_bad_file(pair, tmp_path):
    source, candidate = pair
    text = _run(["measure", str(source), str(candidate)])
    assert text.returncode == 0
    for gate in ("[face]", "[identity]", "[expression]", "[locality]", "diff_nonface", "cosine"):
        assert gate in text.stdout
    broken = tmp_path / "broken.jpg"
    broken.write_text("not an image")
    bad = _run(["measure", str(source), str(broken)])
    assert bad.returncode == 2 and "broken.jpg" in bad.stderr and "Traceback" not in bad.stderr
    # a side of 33000 px used to abort the whole process inside OpenCV/MediaPipe (rc 134)
    from tests.generation import badinputs

    long = badinputs.write_long_png(tmp_path)
    refused = _run(["measure", str(long), str(long)])
    assert refused.returncode == 2 and "33000x900" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
def test_measure_limb_pair_with_mask(tmp_path):
    source = read_rgb("grace_hopper.jpg")
    mask = np.zeros(source.shape[:2], np.uint8)
    mask[450:560, 80:220] = 255
    candidate = source.copy()
    candidate[mask > 0] = 255 - candidate[mask > 0]
    for name, pixels in (("s.png", source), ("c.png", candidate), ("m.png", mask)):
        Image.fromarray(pixels).save(tmp_path / name)
    files = [str(tmp_path / "s.png"), str(tmp_path / "c.png"), "--mask", str(tmp_path / "m.png")]
    result = _run(["measure", *files, "--json", "--diagnostics"])
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["kind"] == "limb"
    assert report["gates"]["locality"]["metrics"]["diff_outside_edit"] == 0.0
    # a limb cell is composited: --diagnostics measures its output before compositing too (the
    # registration's resampling, which the composite replaced by the source outside the mask)
    assert 0.0 <= report["gates"]["locality"]["metrics"]["raw_diff_outside_edit"] < 0.01


@pytest.mark.slow
def test_calibrate_reproduces_the_shipped_thresholds(tmp_path):
    result = _run(["calibrate", "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    made = json.loads((tmp_path / "calibration.json").read_text())["suggested"]
    shipped = json.loads((REPO / "assets/calibration/calibration.json").read_text())["suggested"]
    assert made["limb"] == shipped["limb"]
    # the face-edit thresholds the failure corpus sets (--failures) are re-made by
    # tests/validation/calibration/test_failures.py; every other one comes out as shipped
    from counterfactory.validation.calibration.corpus_fit import CORPUS_THRESHOLDS, FOCUS_RAW_THRESHOLDS

    corpus_set = {(gate, name) for gate, name, _, _ in CORPUS_THRESHOLDS} | {("identity", "max_cosine")}
    # FOCUS's raw figures: the corpus step leaves them unjudged (None) on face edits
    corpus_set |= {("locality", name) for name in FOCUS_RAW_THRESHOLDS}
    for gate, values in made["face"].items():
        for name, value in values.items():
            if (gate, name) not in corpus_set:
                assert shipped["face"][gate][name] == value, (gate, name)
    assert (tmp_path / "calibration.png").is_file()
    assert "failure corpus" not in result.stdout  # without --failures no corpus is built


@pytest.mark.slow
def test_verify_reports_a_tampered_release(tmp_path):
    from counterfactory.manifests.release import ReleaseStage, write_jsonl

    stage = ReleaseStage(tmp_path, "r", "1.0.0")
    write_jsonl(stage.dir / "manifest.jsonl", [])
    path = stage.seal().path
    # a bare stage is no release: verify checks release.json against the package's own schema
    # (issue 36), and says what it lacks, but no file fails its checksum
    bare = _run(["verify", str(path)])
    assert bare.returncode == 1 and "release.json" in bare.stderr and "checksum mismatch" not in bare.stderr
    (path / "manifest.jsonl").write_text("changed\n")
    bad = _run(["verify", str(path)])
    assert bad.returncode == 1 and "manifest.jsonl: checksum mismatch" in bad.stderr


@pytest.mark.slow
def test_measure_with_the_editors_noise_floor(tmp_path):
    """``--floor FILE``: the editor's output for "return this photo unchanged" of the source
    is measured like a candidate, and locality is judged above it (issue 19)."""
    from counterfactory.generation.rerender import rerender_like

    source = read_rgb("astronaut.png")
    Image.fromarray(source).save(tmp_path / "source.png")
    # what a latent editor returns when asked for nothing: the photo re-rendered
    Image.fromarray(rerender_like(source, source.shape)).save(tmp_path / "floor.png")
    # a candidate that pastes an object of 2 % of the image in a corner, then re-rendered
    edited = source.copy()
    h, w = source.shape[:2]
    side = int((0.02 * h * w) ** 0.5)
    edited[h - side - 10 : h - 10, 10 : 10 + side] = read_rgb("grace_hopper.jpg")[:side, :side]
    Image.fromarray(rerender_like(edited, source.shape)).save(tmp_path / "candidate.png")
    args = ["measure", str(tmp_path / "source.png"), str(tmp_path / "candidate.png"), "--json"]
    plain = json.loads(_run(args).stdout)
    assert plain["noise_floor"] is None and plain["floor_path"] == "none"
    assert "floor_changed_share" not in plain["gates"]["locality"]["metrics"]
    assert "excess_share" not in plain["gates"]["locality"]["metrics"]
    result = _run([*args, "--floor", str(tmp_path / "floor.png")])
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["floor_path"] == "request"
    floor, m = report["noise_floor"], report["gates"]["locality"]["metrics"]
    assert set(floor) >= {"changed_share", "global_shift", "global_gain_change"}
    for key in ("changed_share", "global_shift", "global_gain_change"):
        assert m[f"floor_{key}"] == pytest.approx(floor[key])
    for key in ("changed_share", "global_gain_change"):
        assert m[f"{key}_above_floor"] == pytest.approx(m[key] - floor[key])
    # a global shift is measured against the floor output itself, not as a difference of two
    # unsigned shifts: a small share of the frame moved, a few grey levels at most
    assert 0 <= m["global_shift_above_floor"] < 0.02
    # the object stands above the re-rendering: rejected either way
    assert m["changed_share_above_floor"] > 0.01
    # and pixel by pixel against the floor output: about the object's own area stays
    assert m["excess_share"] > 0.01
    # (2026-12-05 calibration: the 2 % object is over the excess limit, under the changed-share one)
    assert {"locality_changed_share_above_max", "locality_excess_share_above_max"} & set(report["reasons"])
    missing = _run([*args, "--floor", str(tmp_path / "nope.png")])
    assert missing.returncode == 2 and "nope.png" in missing.stderr and "Traceback" not in missing.stderr
