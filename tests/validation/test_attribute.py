"""Target-attribute gate with stand-in ONNX classifiers of the real input and output shapes
(FairFace ``(N, 3, 224, 224) -> (N, 18)`` or three heads; InsightFace genderage
``(1, 3, 96, 96) -> (1, 3)``), built here with ``onnx``; bad label maps and weights."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.manifests.errors import SetupError
from counterfactory.validation.backends.attributes import (
    FAIRFACE_RACES,
    FairFaceClassifier,
    GenderAgeClassifier,
    fairface_chip,
)
from counterfactory.validation.backends.base import similarity_transform
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.gates.attribute import AttributeGate, AttributeGateConfig, check_label_map
from counterfactory.validation.gates.base import PairContext

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

# race logits favour "Black" (index 1), gender logits "Male" (index 7), age "40-49" (index 14)
FAIRFACE_BIAS = np.zeros(18, np.float32)
FAIRFACE_BIAS[[1, 7, 14]] = [3.0, 2.0, 1.0]


def _bias_model(
    path: Path,
    input_shape: list,
    widths: list[int],
    biases: list[np.ndarray],
    input_name: str,
    weights: list[np.ndarray] | None = None,
) -> Path:
    """Global average pool, then per output ``pooled @ W + bias`` with ``W = 0`` unless given:
    constant logits, so the expected probabilities are a softmax of ``bias`` computed by hand."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
    ]
    inits, outputs = [], []
    for i, (width, bias) in enumerate(zip(widths, biases, strict=True)):
        nodes.append(helper.make_node("Gemm", ["flat", f"w{i}", f"b{i}"], [f"out{i}"]))
        inits += [
            numpy_helper.from_array(
                np.zeros((3, width), np.float32) if weights is None else np.asarray(weights[i], np.float32), f"w{i}"
            ),
            numpy_helper.from_array(np.asarray(bias, np.float32), f"b{i}"),
        ]
        outputs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, ["N", width]))
    graph = helper.make_graph(
        nodes, "standin", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, input_shape)], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fairface_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fairface") / "fairface.onnx"
    return _bias_model(path, ["N", 3, 224, 224], [18], [FAIRFACE_BIAS], "input")


@pytest.fixture(scope="module")
def buffalo(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("buffalo_l")
    # female 0.2, male 1.4, age / 100 = 0.35
    _bias_model(folder / "genderage.onnx", [1, 3, 96, 96], [3], [np.array([0.2, 1.4, 0.35])], "data")
    return folder


@pytest.fixture(scope="module")
def portrait():
    image = load_rgb(PHOTOS_DIR / "obama_portrait.jpg")
    return image, get_face_landmarker().detect(image)


def _pair(image, faces, condition):
    return PairContext(
        source=image,
        candidate=image,
        kind="face",
        face_mask=None,
        edit_mask=None,
        source_faces=faces,
        candidate_faces=faces,
        extras={"condition": condition},
    )


RACE_MAP = {"White": "White", "Black": "Black", "East Asian": "East Asian", "Southeast Asian": "East Asian"}
GENDER_MAP = {"Male": "male", "Female": "female"}


def _fairface_config(path: Path, **over) -> AttributeGateConfig:
    data = {
        "backend": "fairface",
        "weights": path,
        "sha256": _sha(path),
        "label_map": {"race": RACE_MAP, "gender": GENDER_MAP},
    }
    return AttributeGateConfig(**{**data, **over})


def _softmax_top(logits) -> float:
    z = [math.exp(v) for v in logits]
    return max(z) / sum(z)


def test_fairface_standin_reads_the_expected_classes(fairface_file, portrait):
    image, faces = portrait
    clf = FairFaceClassifier(fairface_file, _sha(fairface_file))
    got = clf.classify(image, faces[0].dlib_points5())
    assert got.labels == {"race": "Black", "gender": "Male", "age": "40-49"}
    assert got.probabilities["race"] == pytest.approx(_softmax_top([0, 3, 0, 0, 0, 0, 0]), rel=1e-5)
    assert got.probabilities["gender"] == pytest.approx(1 / (1 + math.exp(-2.0)), rel=1e-5)
    assert len(FAIRFACE_RACES) == 7


def test_fairface_three_head_layout(tmp_path, portrait):
    image, faces = portrait
    path = _bias_model(
        tmp_path / "heads.onnx",
        ["N", 3, 224, 224],
        [7, 2, 9],
        [FAIRFACE_BIAS[:7], FAIRFACE_BIAS[7:9], FAIRFACE_BIAS[9:]],
        "input",
    )
    got = FairFaceClassifier(path, _sha(path)).classify(image, faces[0].dlib_points5())
    assert got.labels == {"race": "Black", "gender": "Male", "age": "40-49"}


def test_gate_matches_mismatches_and_unmapped(fairface_file, portrait):
    image, faces = portrait
    gate = AttributeGate(_fairface_config(fairface_file))
    ok = gate(_pair(image, faces, {"race": "Black", "gender": "male"}))
    assert ok.passed and ok.review == ()
    assert ok.metrics["match_race"] is True and ok.metrics["perceived_gender"] == "male"
    wrong = gate(_pair(image, faces, {"race": "White", "gender": "male"}))
    assert wrong.passed and wrong.review == ("attribute_mismatch",)  # people decide, never a rejection
    assert wrong.metrics["match_race"] is False and wrong.metrics["match_gender"] is True
    # a map that covers the design but not the class the model gave: unmapped, sent to review
    partial = AttributeGate(
        _fairface_config(fairface_file, label_map={"race": {"White": "White", "Indian": "Black"}}),
        classifier=gate.classifier,
    )
    unmapped = partial(_pair(image, faces, {"race": "Black", "gender": "male"}))
    assert unmapped.review == ("attribute_label_unmapped",) and unmapped.metrics["perceived_race"] is None
    assert gate(_pair(image, [], {"race": "Black"})).review == ("attribute_no_face",)
    assert gate(_pair(image, faces, {})).review == ()  # no condition: nothing to check


def test_insightface_genderage_standin_for_gender_only(buffalo, portrait):
    image, faces = portrait
    clf = GenderAgeClassifier(buffalo)
    got = clf.classify(image, faces[0].box)
    assert got.labels == {"gender": "Male"}
    assert got.probabilities["gender"] == pytest.approx(1 / (1 + math.exp(-1.2)), rel=1e-5)
    assert got.age_years == pytest.approx(35.0, abs=1e-4)
    config = AttributeGateConfig(backend="insightface", insightface_pack=buffalo, label_map={"gender": GENDER_MAP})
    gate = AttributeGate(config)
    assert gate(_pair(image, faces, {"race": "Black", "gender": "female"})).review == ("attribute_mismatch",)
    result = gate(_pair(image, faces, {"race": "White", "gender": "male"}))
    assert result.review == () and "match_race" not in result.metrics


def test_weights_sha256_mismatch_is_a_clear_setup_error(fairface_file):
    with pytest.raises(SetupError, match="sha256 .* but the spec expects"):
        FairFaceClassifier(fairface_file, "0" * 64)
    with pytest.raises(SetupError, match="not found"):
        FairFaceClassifier(fairface_file.parent / "missing.onnx", "0" * 64)


def test_label_map_must_cover_the_design(fairface_file):
    config = _fairface_config(fairface_file)
    check_label_map(config, {"race": ["White", "Black", "East Asian"], "gender": ["female", "male"]})
    with pytest.raises(ValueError, match=r"label_map.race maps no fairface class to \['Latino', 'South Asian'\]"):
        check_label_map(config, {"race": ["White", "Black", "Latino", "South Asian"], "gender": ["female", "male"]})
    with pytest.raises(ValueError, match="does not output"):
        _fairface_config(fairface_file, label_map={"race": {"Caucasian": "White"}})
    with pytest.raises(ValueError, match="reads only"):
        AttributeGateConfig(backend="insightface", label_map={"race": {"Male": "x"}})
    with pytest.raises(ValueError, match="needs weights"):
        AttributeGateConfig(backend="fairface", label_map={"gender": GENDER_MAP})


def test_stack_runs_the_configured_gate_and_leaves_it_off_otherwise(fairface_file, portrait):
    from counterfactory.validation.gate_stack import GatesConfig, GateStack

    assert GatesConfig().face.attribute is None  # opt-in: it needs the user's classifier
    cfg = GatesConfig(face={"attribute": _fairface_config(fairface_file).model_dump(mode="json")})
    stack = GateStack.from_config(cfg, "face")
    image, _ = portrait
    judgement = stack.evaluate(image, image.copy(), extras={"condition": {"race": "White", "gender": "male"}})
    assert "attribute_mismatch" in judgement.to_dict()["gates"]["attribute"]["review"]


# -- FairFace's own face preparation ---------------------------------------------------------

# dlib's 5-point mean face (get_face_chip_details), copied here from dlib, not from the code
DLIB_MEAN_FACE = [(0.8595674595992, 0.2134981538014), (0.6460604764104, 0.2289674387677)]
DLIB_MEAN_FACE += [(0.1205750620789, 0.2137274526848), (0.3340850613712, 0.2290642403242)]
DLIB_MEAN_FACE += [(0.4901123135679, 0.6277975316475)]


def _blobs(shape: tuple[int, int], points: np.ndarray, sigma: float) -> np.ndarray:
    """A black RGB image with a Gaussian white blob at each point."""
    ys, xs = np.mgrid[: shape[0], : shape[1]]
    image = np.zeros(shape, np.float64)
    for x, y in points:
        image = np.maximum(image, np.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * sigma**2)))
    return np.repeat((image * 255).round().astype(np.uint8)[..., None], 3, axis=2)


@pytest.mark.parametrize("photo_scale", [1.0, 2.0])  # 2.0: an 1600 px photo, which FairFace first resizes to 800
def test_fairface_chip_puts_the_five_points_where_dlib_and_fairface_put_them(photo_scale):
    # By hand: a 300 px dlib chip with padding 0.25 has part k at (0.25 + m_k) / 1.5 * 300 px,
    # and FairFace resizes that chip to 224 px: (0.25 + m_k) / 1.5 * 224, pixel centres mapped
    # as PIL maps them, ((c + 0.5) * 224 / 300 - 0.5).
    mean_face = np.array(DLIB_MEAN_FACE)
    in_chip = (0.25 + mean_face) / 1.5 * 300
    expected = (in_chip + 0.5) * 224 / 300 - 0.5
    # the face on the photo: the chip's points turned by 12 degrees, scaled by 1.4, moved
    angle = np.deg2rad(12)
    turn = 1.4 * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    on_photo = (in_chip @ turn.T + [230, 120]) * photo_scale
    photo = _blobs((int(600 * photo_scale), int(800 * photo_scale)), on_photo, sigma=5 * photo_scale)

    chip = fairface_chip(photo, on_photo)

    assert chip.shape == (224, 224, 3) and chip.dtype == np.uint8
    grey = chip[..., 0].astype(np.float64)
    for (ex, ey), k in zip(expected, range(5), strict=True):
        x0, y0 = int(round(ex)) - 8, int(round(ey)) - 8
        patch = grey[y0 : y0 + 17, x0 : x0 + 17]
        ys, xs = np.mgrid[y0 : y0 + 17, x0 : x0 + 17]
        centre = np.array([(xs * patch).sum(), (ys * patch).sum()]) / patch.sum()
        assert np.allclose(centre, (ex, ey), atol=0.5), (k, centre, (ex, ey))


def test_fairface_chip_samples_the_photo_through_the_fitted_similarity():
    # a photo whose red and green channels are x / 4 and y / 4: bilinear sampling and resizing
    # keep a ramp a ramp, so every chip pixel's colour says which photo point it came from
    ys, xs = np.mgrid[:600, :800]
    photo = np.stack([xs / 4, ys / 4, np.full_like(xs, 128)], axis=-1).round().astype(np.uint8)
    in_chip = (0.25 + np.array(DLIB_MEAN_FACE)) / 1.5 * 300
    to_photo = np.array([[1.1, -0.2], [0.2, 1.1]])
    chip = fairface_chip(photo, in_chip @ to_photo.T + [250, 140]).astype(np.float64)
    # output pixel (i, j) <- chip point ((j + 0.5) * 300 / 224 - 0.5, ...) <- photo point
    rows, cols = np.mgrid[20:204, 20:204]
    u, v = (cols + 0.5) * 300 / 224 - 0.5, (rows + 0.5) * 300 / 224 - 0.5
    px = 1.1 * u - 0.2 * v + 250
    py = 0.2 * u + 1.1 * v + 140
    assert np.abs(chip[20:204, 20:204, 0] - px / 4).max() < 1.0
    assert np.abs(chip[20:204, 20:204, 1] - py / 4).max() < 1.0


def test_the_mesh_points_are_dlibs_five_points(portrait):
    """Eye corners and subnasale from the MediaPipe mesh fit dlib's 5-point mean face (its
    published shape, scaled) within 2.5 % of the eye distance on a real portrait, closer than
    the nose tip would."""
    image, faces = portrait
    points = faces[0].dlib_points5().astype(np.float64)
    mean_face = np.array(DLIB_MEAN_FACE)
    eye_distance = np.linalg.norm(points[0] - points[2])

    def residual(pts: np.ndarray) -> float:
        m = similarity_transform(mean_face, pts)
        return float(np.sqrt(((mean_face @ m[:, :2].T + m[:, 2] - pts) ** 2).sum(axis=1).mean()))

    assert residual(points) < 0.025 * eye_distance
    with_nose_tip = points.copy()
    with_nose_tip[4] = faces[0].landmarks[1, :2]
    assert residual(points) < residual(with_nose_tip)
    # dlib's part order: image-right eye (outer, inner), image-left eye (outer, inner), nose below
    assert points[0, 0] > points[1, 0] > points[3, 0] > points[2, 0]
    assert points[4, 1] > points[:4, 1].max()


def test_fairface_input_is_rgb_with_imagenet_normalisation(tmp_path):
    # a model whose race logits are the mean of each input channel (then four zeros): for a
    # uniform photo they are (v_c / 255 - mean_c) / std_c, worked out here from ImageNet's
    # published mean and std
    weights = np.zeros((3, 18), np.float32)
    weights[[0, 1, 2], [0, 1, 2]] = 1.0
    path = _bias_model(tmp_path / "means.onnx", ["N", 3, 224, 224], [18], [np.zeros(18)], "input", [weights])
    rgb = (40, 200, 90)
    photo = np.empty((600, 800, 3), np.uint8)
    photo[:] = rgb
    in_chip = (0.25 + np.array(DLIB_MEAN_FACE)) / 1.5 * 300
    got = FairFaceClassifier(path, _sha(path)).classify(photo, in_chip + [250, 150])
    logits = [(v / 255 - m) / s for v, m, s in zip(rgb, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), strict=True)]
    assert got.labels["race"] == "Black"  # channel 1, green, is the largest
    assert got.probabilities["race"] == pytest.approx(_softmax_top(logits + [0, 0, 0, 0]), rel=1e-4)
