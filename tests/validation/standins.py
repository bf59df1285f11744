"""Stand-ins for model files that no registry carries (InsightFace buffalo_l, LibreFace).

Each has the real model's interface: the same input and output names' roles, shapes and
layout, so the real loading and decoding code runs on them unchanged. Their numbers are
chosen so that the expected outputs can be computed by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SCRFD_STRIDES = (8, 16, 32)


def _conv_head(helper, numpy_helper, name, pooled, out_channels, weight, bias, reshape_to, activation=None):
    nodes = [
        helper.make_node("Conv", [pooled, f"{name}_w", f"{name}_b"], [f"{name}_conv"], kernel_shape=[1, 1]),
    ]
    last = f"{name}_conv"
    if activation:
        nodes.append(helper.make_node(activation, [last], [f"{name}_act"]))
        last = f"{name}_act"
    nodes.append(helper.make_node("Transpose", [last], [f"{name}_t"], perm=[0, 2, 3, 1]))
    nodes.append(helper.make_node("Reshape", [f"{name}_t", f"{name}_shape"], [name]))
    inits = [
        numpy_helper.from_array(np.asarray(weight, np.float32).reshape(out_channels, 3, 1, 1), f"{name}_w"),
        numpy_helper.from_array(np.asarray(bias, np.float32).reshape(out_channels), f"{name}_b"),
        numpy_helper.from_array(np.array([-1, reshape_to], np.int64), f"{name}_shape"),
    ]
    return nodes, inits


def build_scrfd_standin(
    path: Path,
    *,
    score_gain: float = 20.0,
    score_bias: float = -10.0,
    box_distance: float = 1.5,
    kps_offsets: tuple[float, ...] = (-0.5, -0.5, 0.5, -0.5, 0.0, 0.0, -0.4, 0.5, 0.4, 0.5),
) -> Path:
    """An SCRFD-shaped ONNX (``det_10g.onnx`` layout): input ``input.1`` ``(1, 3, H, W)``,
    nine outputs: scores ``(H/s * W/s * 2, 1)``, box distances ``(.., 4)`` and keypoint offsets
    ``(.., 10)`` for strides 8, 16, 32, two anchors per location, as SCRFD's heads emit them.

    Only stride 32 can fire: its score is ``sigmoid(score_gain * mean + score_bias)`` of the
    cell's mean normalised intensity; strides 8 and 16 score ``sigmoid(-30)``. Box distances
    are ``box_distance`` and keypoint offsets ``kps_offsets`` (in stride units) everywhere.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, outputs = [], [], {"score": [], "bbox": [], "kps": []}
    for s in SCRFD_STRIDES:
        pooled = f"pool{s}"
        nodes.append(helper.make_node("AveragePool", ["input.1"], [pooled], kernel_shape=[s, s], strides=[s, s]))
        fires = s == 32
        w = np.full((2, 3), score_gain / 3.0 if fires else 0.0)
        b = np.full(2, score_bias if fires else -30.0)
        n, i = _conv_head(helper, numpy_helper, f"score_{s}", pooled, 2, w, b, 1, activation="Sigmoid")
        nodes += n
        inits += i
        outputs["score"].append(f"score_{s}")
        n, i = _conv_head(helper, numpy_helper, f"bbox_{s}", pooled, 8, np.zeros((8, 3)), np.full(8, box_distance), 4)
        nodes += n
        inits += i
        outputs["bbox"].append(f"bbox_{s}")
        n, i = _conv_head(helper, numpy_helper, f"kps_{s}", pooled, 20, np.zeros((20, 3)), np.tile(kps_offsets, 2), 10)
        nodes += n
        inits += i
        outputs["kps"].append(f"kps_{s}")
    graph = helper.make_graph(
        nodes,
        "scrfd_standin",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width])
            for key, width in (("score", 1), ("bbox", 4), ("kps", 10))
            for name in outputs[key]
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def arcface_standin_weights(dim: int = 512, seed: int = 0) -> np.ndarray:
    """The ``(588, dim)`` projection the ArcFace stand-in applies after 8 x 8 average pooling."""
    return np.random.default_rng(seed).standard_normal((3 * 14 * 14, dim)).astype(np.float32) / 24.0


def build_arcface_standin(path: Path, *, dim: int = 512, seed: int = 0) -> Path:
    """An ArcFace-shaped ONNX (``w600k_r50.onnx`` layout): input ``input.1`` ``(N, 3, 112,
    112)``, one output ``(N, dim)``: 8 x 8 average pooling, flatten, a fixed random projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = arcface_standin_weights(dim, seed)
    nodes = [
        helper.make_node("AveragePool", ["input.1"], ["pooled"], kernel_shape=[8, 8], strides=[8, 8]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "proj"], ["683"]),
    ]
    graph = helper.make_graph(
        nodes,
        "arcface_standin",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 3, 112, 112])],
        [helper.make_tensor_value_info("683", TensorProto.FLOAT, ["N", dim])],
        [numpy_helper.from_array(weights, "proj")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build_buffalo_standin(folder: Path) -> Path:
    """A folder laid out like an unzipped ``buffalo_l`` pack, holding the two stand-ins."""
    folder.mkdir(parents=True, exist_ok=True)
    build_scrfd_standin(folder / "det_10g.onnx")
    build_arcface_standin(folder / "w600k_r50.onnx")
    return folder


def build_libreface_standin(path: Path, *, seed: int = 0) -> Path:
    """LibreFace-architecture weights (random, with non-trivial batch-norm statistics), saved
    as LibreFace saves its checkpoints: ``{"model": state_dict}``."""
    import torch

    from counterfactory.validation.backends.libreface import build_libreface_resnet

    torch.manual_seed(seed)
    model = build_libreface_resnet()
    for module in model.modules():
        if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    torch.save({"model": model.state_dict()}, str(path))
    return path
