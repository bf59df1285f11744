"""InsightFace backends (SCRFD detector, ArcFace embedder) on ONNX stand-ins built here.

The stand-ins have buffalo_l's input and output layout; their numbers are chosen so that the
decoded boxes, keypoints and embeddings can be computed by hand (see ``standins.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from counterfactory.manifests.errors import SetupError
from counterfactory.validation.backends import load_detector, load_embedder
from counterfactory.validation.backends.base import align_face_112, l2_normalise
from counterfactory.validation.backends.insightface import ArcFaceEmbedder, SCRFDDetector, nms
from counterfactory.validation.gate_stack import GatesConfig, GateStack

from .standins import arcface_standin_weights, build_arcface_standin, build_buffalo_standin, build_scrfd_standin


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return build_buffalo_standin(tmp_path_factory.mktemp("buffalo_l"))


def _block_image(side: int, row: int, col: int, cell: int) -> np.ndarray:
    image = np.zeros((side, side, 3), np.uint8)
    image[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell] = 255
    return image


@pytest.mark.parametrize("side, scale", [(640, 1.0), (1280, 0.5)])
def test_scrfd_decodes_the_known_detection(pack, side, scale):
    detector = SCRFDDetector(pack)
    assert detector.strides == (8, 16, 32) and detector.num_anchors == 2 and detector.use_kps
    row, col = 5, 7
    faces = detector.detect(_block_image(side, row, col, int(32 / scale)))
    assert len(faces) == 1  # two anchors at one place: NMS keeps one
    face = faces[0]
    white = (255 - 127.5) / 128.0  # SCRFD's input normalisation
    assert face.score == pytest.approx(_sigmoid(20.0 * white - 10.0), rel=1e-5)
    # anchor centres sit at (col * stride, row * stride) of the 640 input; distances 1.5 strides
    cx, cy = col * 32, row * 32
    expected = np.array([cx - 48, cy - 48, cx + 48, cy + 48]) / scale
    np.testing.assert_allclose(face.box, expected, atol=1e-3)
    offsets = np.array([-0.5, -0.5, 0.5, -0.5, 0.0, 0.0, -0.4, 0.5, 0.4, 0.5]).reshape(5, 2) * 32
    np.testing.assert_allclose(face.keypoints, (np.array([cx, cy]) + offsets) / scale, atol=1e-3)


def test_scrfd_sees_no_face_in_a_dark_image(pack):
    assert SCRFDDetector(pack).detect(np.zeros((480, 640, 3), np.uint8)) == []


def test_nms_known_answer():
    boxes = np.array([[0, 0, 9, 9], [1, 1, 10, 10], [50, 50, 60, 60]], np.float64)
    scores = np.array([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.4) == [0, 2]  # IoU(0, 1) = 81 / 119 > 0.4
    assert nms(boxes, scores, 0.9) == [0, 1, 2]


def test_arcface_embedding_equals_the_same_math_in_numpy(pack, photo, landmarker):
    embedder = ArcFaceEmbedder(pack)
    assert (embedder.dim, embedder.input_side, embedder.mean, embedder.std) == (512, 112, 127.5, 127.5)
    image = photo("grace_hopper.jpg")
    kps = landmarker.detect(image)[0].keypoints5()
    got = embedder.embed(image, kps)
    # second implementation: crop, normalise, 8x8 mean pool, project, normalise
    crop = (align_face_112(image, kps).astype(np.float32) - 127.5) / 127.5
    pooled = crop.transpose(2, 0, 1).reshape(3, 14, 8, 14, 8).mean(axis=(2, 4)).ravel()
    expected = l2_normalise(pooled @ arcface_standin_weights())
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-5)


def test_insightface_backends_run_through_the_gate_stack(pack, photo):
    config = GatesConfig(
        face={
            "face": {"backend": "insightface", "insightface_pack": str(pack), "max_pose_change_deg": 7.9},
            "identity": {"backend": "insightface", "insightface_pack": str(pack), "min_cosine": 0.3, "max_cosine": 0.9},
        }
    )
    stack = GateStack.from_config(config, "face")
    image = photo("grace_hopper.jpg")
    judgement = stack.evaluate(image, image.copy())
    by_gate = {r.gate: r for r in judgement.results}
    assert by_gate["identity"].thresholds["backend"] == "insightface"
    assert by_gate["identity"].metrics["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert by_gate["identity"].metrics["embedding_dim"] == 512
    assert by_gate["face"].thresholds["backend"] == "insightface"
    # the stand-in detector finds no face in a photo: counted, not crashed
    assert by_gate["face"].reasons == ("face_count_mismatch",)
    assert load_detector("insightface", insightface_pack=pack) is load_detector("insightface", insightface_pack=pack)


def test_insightface_identity_needs_its_own_band():
    with pytest.raises(ValueError, match="min_cosine.*calibrate"):
        GatesConfig(face={"identity": {"backend": "insightface"}})


def test_missing_pack_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("COUNTERFACTORY_INSIGHTFACE_PACK", raising=False)
    with pytest.raises(SetupError, match=r"det_10g\.onnx.*buffalo_l"):
        load_detector("insightface", insightface_pack=tmp_path / "nowhere")
    with pytest.raises(SetupError, match=r"w600k_r50\.onnx"):
        load_embedder("insightface", insightface_pack=tmp_path / "nowhere")
    monkeypatch.setenv("COUNTERFACTORY_INSIGHTFACE_PACK", str(tmp_path / "from_env"))
    with pytest.raises(SetupError, match="from_env"):
        load_embedder("insightface")
    with pytest.raises(ValueError, match="valid: sface, insightface"):
        load_embedder("facenet")


def test_standin_models_have_buffalo_shapes(tmp_path):
    import onnxruntime as ort

    det = ort.InferenceSession(str(build_scrfd_standin(tmp_path / "d.onnx")), providers=["CPUExecutionProvider"])
    outs = det.run(None, {"input.1": np.zeros((1, 3, 640, 640), np.float32)})
    assert [o.shape for o in outs] == [
        (12800, 1),
        (3200, 1),
        (800, 1),
        (12800, 4),
        (3200, 4),
        (800, 4),
        (12800, 10),
        (3200, 10),
        (800, 10),
    ]
    rec = ort.InferenceSession(str(build_arcface_standin(tmp_path / "r.onnx")), providers=["CPUExecutionProvider"])
    assert rec.run(None, {"input.1": np.zeros((2, 3, 112, 112), np.float32)})[0].shape == (2, 512)


def test_missing_onnxruntime_names_the_extra(pack, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(SetupError, match=r"pip install 'counterfactory\[insightface\]'"):
        SCRFDDetector(pack)
