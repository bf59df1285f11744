"""`counterfactory measure --batch TABLE`: one line (or JSON object) per pair and a summary.

The pairs are built from a bundled photo: an identical pair, a shifted and resized copy, the
same copy as lossless WebP and as a PNG with a damaged text chunk, a missing file and a garbage
file. Expected verdicts are not pinned (the gates are being recalibrated): files with the same
pixels must get the same verdict and metrics, and the identical pair the verdict the one-pair
`measure` gives it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, read_rgb

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]


def _run(args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, cwd=REPO, capture_output=True, text=True, timeout=900, env=dict(os.environ))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_with_damaged_text(pixels: np.ndarray) -> tuple[bytes, bytes]:
    """``(good, damaged)``: a PNG of ``pixels`` with a tEXt chunk before IDAT, and the same bytes
    with that chunk's CRC broken (as in the ComfyUI output of issue 22)."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    data = buf.getvalue()
    at = data.index(b"IDAT") - 4
    text = _chunk(b"tEXt", b'prompt\x00{"3": {"class_type": "KSampler"}}')
    good = data[:at] + text + data[at:]
    damaged = bytearray(good)
    damaged[at + len(text) - 1] ^= 0x5A
    return good, bytes(damaged)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("batch")
    source = read_rgb("grace_hopper.jpg")
    moved = cv2.warpAffine(
        source, np.float32([[1, 0, 3], [0, 1, -2]]), source.shape[1::-1], borderMode=cv2.BORDER_REFLECT
    )
    resized = cv2.resize(moved, (1024, 1024), interpolation=cv2.INTER_AREA)
    Image.fromarray(source).save(folder / "source.png")
    Image.fromarray(resized).save(folder / "resized.png")
    Image.fromarray(resized).save(folder / "resized.webp", lossless=True)
    good, damaged = png_with_damaged_text(resized)
    (folder / "text_ok.png").write_bytes(good)
    (folder / "comfy.png").write_bytes(damaged)
    (folder / "garbage.png").write_bytes(b"<html>rate limited</html>" * 20)
    rows = [
        ("same", "source.png", "source.png", "control"),
        ("resized", "source.png", "resized.png", "edit"),
        ("webp", "source.png", "resized.webp", "edit"),
        ("damaged", "source.png", "comfy.png", "edit"),
        ("undamaged", "source.png", "text_ok.png", "edit"),
        ("missing", "source.png", "gone.png", "edit"),
        ("garbage", "source.png", "garbage.png", "control"),
    ]
    path = folder / "pairs.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "source", "candidate", "arm"])
        writer.writerows(rows)
    return path


@pytest.mark.slow
def test_measure_batch_lines_json_and_summary(table):
    as_json = _run(["measure", "--batch", str(table), "--json"])
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    reports = [json.loads(line) for line in as_json.stdout.splitlines()]
    by_id = {r["id"]: r for r in reports}
    assert [r["id"] for r in reports] == ["same", "resized", "webp", "damaged", "undamaged", "missing", "garbage"]
    assert all(r["condition"]["arm"] in ("control", "edit") for r in reports)

    # unreadable files are failed items with the file named, and the batch went on past them
    assert by_id["missing"]["verdict"] == "failed" and by_id["missing"]["reasons"] == ["candidate_unreadable"]
    assert "gone.png" in by_id["missing"]["error"] and "not found" in by_id["missing"]["error"]
    assert by_id["garbage"]["verdict"] == "failed" and "garbage.png" in by_id["garbage"]["error"]
    measured = [r for r in reports if r["verdict"] != "failed"]
    assert len(measured) == 5 and all(set(r["gates"]) >= {"face", "identity", "locality"} for r in measured)

    # the damaged PNG is read, with its warning, and judged exactly as its undamaged twin
    assert any("bad CRC" in w and "tEXt" in w for w in by_id["damaged"]["warnings"])
    assert by_id["undamaged"]["warnings"] == []
    for twin in ("webp", "damaged", "undamaged"):  # the same pixels as `resized`
        assert by_id[twin]["verdict"] == by_id["resized"]["verdict"]
        assert by_id[twin]["reasons"] == by_id["resized"]["reasons"]
        assert by_id[twin]["gates"]["locality"]["metrics"] == by_id["resized"]["gates"]["locality"]["metrics"]
    assert by_id["resized"]["alignment"]["resize_from"] == [1024, 1024]

    # the identical pair gets what the one-pair command gives it
    single = _run(["measure", str(table.parent / "source.png"), str(table.parent / "source.png"), "--json"])
    assert single.returncode == 0, single.stderr[-2000:]
    one = json.loads(single.stdout)
    assert (one["verdict"], one["reasons"]) == (by_id["same"]["verdict"], by_id["same"]["reasons"])

    # the summary (stderr with --json, so stdout stays JSONL) counts what the lines say
    summary = json.loads(as_json.stderr.strip().splitlines()[-1])["summary"]
    assert summary["pairs"] == 7
    assert summary["verdicts"] == dict(Counter(r["verdict"] for r in reports))
    for arm in ("control", "edit"):
        expected = Counter(r["verdict"] for r in reports if r["condition"]["arm"] == arm)
        assert summary["by_condition"]["arm"][arm] == dict(expected)

    text = _run(["measure", "--batch", str(table)])
    assert text.returncode == 0, text.stderr[-3000:]
    lines = text.stdout.splitlines()
    pair_lines = {line.split("\t")[0]: line.split("\t") for line in lines if "\t" in line}
    assert set(pair_lines) == set(by_id)
    for pair_id, fields in pair_lines.items():
        assert fields[1] == by_id[pair_id]["verdict"]
    assert "gone.png" in pair_lines["missing"][2] and "bad CRC" in pair_lines["damaged"][2]
    counts = ", ".join(f"{v} {n}" for v, n in sorted(Counter(r["verdict"] for r in reports).items()))
    assert f"summary: 7 pairs: {counts}" in lines
    assert any(line.strip().startswith("arm=control:") for line in lines)


def test_measure_batch_refuses_a_table_without_its_columns(tmp_path):
    table = tmp_path / "pairs.jsonl"
    table.write_text(json.dumps({"src": "a.png", "candidate": "b.png"}) + "\n")
    from counterfactory.flows.audit import measure_batch
    from counterfactory.generation.editors.tables import TableError

    with pytest.raises(TableError, match="source"):
        list(measure_batch(table))
    with pytest.raises(TableError, match="pair table is one of"):
        list(measure_batch(tmp_path / "pairs.xlsx"))


def test_measure_with_a_spec_draws_the_runs_edit_region(tmp_path):
    """`measure --spec` judges as a run of that spec does: the edit region its prompt names
    (here face, neck and ears), not the face oval; without a spec, the region FOCUS's prompt
    names, which the shipped thresholds are calibrated on (issue 34)."""
    import yaml

    from counterfactory.flows.audit import PairMeasurer
    from counterfactory.flows.engine.sources import edit_region_name
    from counterfactory.flows.engine.spec import load_spec

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(read_rgb("grace_hopper.jpg")).save(photos / "a.png")
    (photos / "metadata.yaml").write_text(
        yaml.safe_dump({"sources": [{"id": "a", "path": "a.png", "licence": "CC BY 4.0"}]})
    )
    spec = {
        "name": "region",
        "sources": {"photos": "photos", "metadata": "photos/metadata.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": ["Black", "White"], "gender": ["female", "male"]},
            "strata": [],
            "templates_per_stratum": 1,
        },
        "prompts": {"face": "face_only_v1"},
        "release": {"name": "region", "version": "0.1.0"},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    measurer = PairMeasurer(path)
    assert measurer.region == edit_region_name(load_spec(path)) == "face_neck_ears"
    assert PairMeasurer().region == "face_neck_ears"
