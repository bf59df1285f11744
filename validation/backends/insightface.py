"""InsightFace backends from a ``buffalo_l`` model pack, run with onnxruntime.

- :class:`SCRFDDetector` (``det_10g.onnx``): Guo et al., "Sample and Computation
  Redistribution for Efficient Face Detection" (SCRFD, ICLR 2022).
- :class:`ArcFaceEmbedder` (``w600k_r50.onnx``): Deng et al., "ArcFace: Additive Angular
  Margin Loss for Deep Face Recognition" (CVPR 2019); a ResNet-50 trained on WebFace600K.

The ``insightface`` package itself is not needed (nor installed): these classes read the
pack's ONNX files directly, with the same pre- and post-processing as insightface's
``model_zoo/scrfd.py`` and ``model_zoo/arcface_onnx.py``. The packs carry a non-commercial
research licence and are not on any package registry: download ``buffalo_l.zip`` from the
insightface model zoo, unzip it, and point ``insightface_pack`` (or the environment variable
``COUNTERFACTORY_INSIGHTFACE_PACK``) at the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from counterfactory.manifests.errors import SetupError
from counterfactory.validation.backends.base import DetectedFace, align_face_112, l2_normalise

PACK_ENV = "COUNTERFACTORY_INSIGHTFACE_PACK"
DEFAULT_PACK = Path("~/.insightface/models/buffalo_l")
DETECTOR_FILE = "det_10g.onnx"
RECOGNISER_FILE = "w600k_r50.onnx"
INSTALL_HINT = "pip install 'counterfactory[insightface]'"


def resolve_pack(pack: str | Path | None = None) -> Path:
    """The buffalo_l folder: ``pack``, else ``$COUNTERFACTORY_INSIGHTFACE_PACK``, else
    ``~/.insightface/models/buffalo_l`` (where insightface itself unpacks it)."""
    if pack is None:
        pack = os.environ.get(PACK_ENV) or DEFAULT_PACK
    return Path(pack).expanduser()


def _pack_file(pack: str | Path | None, filename: str) -> Path:
    folder = resolve_pack(pack)
    path = folder / filename
    if not path.is_file():
        raise SetupError(
            f"InsightFace model {filename} not found in {folder}: download the buffalo_l pack "
            f"(insightface model zoo, non-commercial research licence), unzip it there, or set "
            f"gates.<kind>.<gate>.insightface_pack / ${PACK_ENV} to the folder holding "
            f"{DETECTOR_FILE} and {RECOGNISER_FILE}"
        )
    return path


def _session(path: Path, threads: int):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise SetupError(f"the InsightFace backends need onnxruntime: {INSTALL_HINT}") from exc
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> list[int]:
    """Greedy non-maximum suppression; indices kept, highest score first.

    Areas use insightface's inclusive-pixel convention (``x1 - x0 + 1``) so that the same
    boxes are kept as in ``SCRFD.nms``.
    """
    x0, y0, x1, y1 = boxes.T
    areas = (x1 - x0 + 1) * (y1 - y0 + 1)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]) + 1)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[iou <= iou_threshold]
    return keep


class SCRFDDetector:
    """SCRFD face detector (boxes, scores, five keypoints).

    Args:
        pack: the buffalo_l folder (see :func:`resolve_pack`); ignored when ``model_path`` is given.
        model_path: an SCRFD ONNX file (``det_10g.onnx``) to use directly.
        input_size: ``(width, height)`` the image is letterboxed into when the model's input
            is dynamic (insightface's ``det_size``, 640 x 640 by default).
        min_score: score threshold (insightface default 0.5).
        nms_iou: NMS IoU threshold (insightface default 0.4).
        threads: onnxruntime intra-op threads (0: onnxruntime's default; 1 per worker
            process scales best).
    """

    name = "insightface"

    def __init__(
        self,
        pack: str | Path | None = None,
        *,
        model_path: str | Path | None = None,
        input_size: tuple[int, int] = (640, 640),
        min_score: float = 0.5,
        nms_iou: float = 0.4,
        threads: int = 0,
    ) -> None:
        path = Path(model_path) if model_path is not None else _pack_file(pack, DETECTOR_FILE)
        if not path.is_file():
            raise SetupError(f"SCRFD model not found at {path}")
        self.session = _session(path, threads)
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        fixed = inp.shape[2:4]
        self.input_size = (
            (int(fixed[1]), int(fixed[0])) if all(isinstance(d, int) for d in fixed) else tuple(input_size)
        )
        self.output_names = [o.name for o in self.session.get_outputs()]
        n = len(self.output_names)
        layouts = {
            6: ((8, 16, 32), 2, False),
            9: ((8, 16, 32), 2, True),
            10: ((8, 16, 32, 64, 128), 1, False),
            15: ((8, 16, 32, 64, 128), 1, True),
        }
        if n not in layouts:
            raise SetupError(f"{path} has {n} outputs; an SCRFD model has 6, 9, 10 or 15")
        self.strides, self.num_anchors, self.use_kps = layouts[n]
        self.min_score = min_score
        self.nms_iou = nms_iou
        self._centers: dict[tuple[int, int, int], np.ndarray] = {}

    def _anchor_centers(self, height: int, width: int, stride: int) -> np.ndarray:
        key = (height, width, stride)
        if key not in self._centers:
            ys, xs = np.mgrid[:height, :width]
            centers = (np.stack([xs, ys], axis=-1).astype(np.float32) * stride).reshape(-1, 2)
            self._centers[key] = np.repeat(centers, self.num_anchors, axis=0)
        return self._centers[key]

    def detect(self, image: np.ndarray) -> list[DetectedFace]:
        """Faces in ``(H, W, 3)`` uint8 RGB, highest score first."""
        h, w = image.shape[:2]
        in_w, in_h = self.input_size
        scale = min(in_w / w, in_h / h)
        new_w, new_h = max(int(w * scale), 1), max(int(h * scale), 1)
        canvas = np.zeros((in_h, in_w, 3), np.uint8)
        canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h))
        # insightface feeds RGB, (x - 127.5) / 128; our images are RGB already.
        blob = ((canvas.astype(np.float32) - 127.5) / 128.0).transpose(2, 0, 1)[None]
        outputs = self.session.run(self.output_names, {self.input_name: blob})
        outputs = [o[0] if o.ndim == 3 else o for o in outputs]  # batched exports add a leading 1
        k = len(self.strides)
        boxes, scores, kpss = [], [], []
        for i, stride in enumerate(self.strides):
            score = outputs[i].reshape(-1)
            dist = outputs[i + k].reshape(-1, 4) * stride
            centers = self._anchor_centers(in_h // stride, in_w // stride, stride)
            keep = np.flatnonzero(score >= self.min_score)
            c = centers[keep]
            d = dist[keep]
            boxes.append(np.column_stack([c[:, 0] - d[:, 0], c[:, 1] - d[:, 1], c[:, 0] + d[:, 2], c[:, 1] + d[:, 3]]))
            scores.append(score[keep])
            if self.use_kps:
                kd = outputs[i + 2 * k].reshape(-1, 10)[keep] * stride
                kpss.append(kd.reshape(-1, 5, 2) + c[:, None, :])
        all_boxes = np.concatenate(boxes) / scale
        all_scores = np.concatenate(scores)
        all_kps = np.concatenate(kpss) / scale if self.use_kps else None
        faces = []
        for j in nms(all_boxes, all_scores, self.nms_iou):
            kp = all_kps[j].astype(np.float32) if all_kps is not None else None
            faces.append(
                DetectedFace(box=tuple(float(v) for v in all_boxes[j]), score=float(all_scores[j]), keypoints=kp)
            )
        return faces


class ArcFaceEmbedder:
    """ArcFace embedding (512-d for ``w600k_r50``) of the ArcFace-template crop.

    Args:
        pack: the buffalo_l folder (see :func:`resolve_pack`); ignored when ``model_path`` is given.
        model_path: an ArcFace ONNX file (``w600k_r50.onnx``) to use directly.
        threads: onnxruntime intra-op threads (0: onnxruntime's default).
    """

    name = "insightface"

    def __init__(
        self, pack: str | Path | None = None, *, model_path: str | Path | None = None, threads: int = 0
    ) -> None:
        path = Path(model_path) if model_path is not None else _pack_file(pack, RECOGNISER_FILE)
        if not path.is_file():
            raise SetupError(f"ArcFace model not found at {path}")
        self.session = _session(path, threads)
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        side = inp.shape[2] if isinstance(inp.shape[2], int) else 112
        self.input_side = int(side)
        out = self.session.get_outputs()
        if len(out) != 1:
            raise SetupError(f"{path} has {len(out)} outputs; an ArcFace model has one")
        self.output_name = out[0].name
        dim = out[0].shape[-1]
        self.dim = int(dim) if isinstance(dim, int) else 512
        self.mean, self.std = self._input_normalisation(path)

    @staticmethod
    def _input_normalisation(path: Path) -> tuple[float, float]:
        """``(mean, std)`` of the input: mxnet-converted models normalise inside the graph
        (their first nodes subtract and multiply), the others expect (x - 127.5) / 127.5."""
        try:
            import onnx
        except ImportError:
            return 127.5, 127.5
        graph = onnx.load(str(path), load_external_data=False).graph
        names = [n.name for n in graph.node[:8]]
        has_sub = any(n.startswith(("Sub", "_minus")) for n in names)
        has_mul = any(n.startswith(("Mul", "_mul")) for n in names)
        return (0.0, 1.0) if has_sub and has_mul else (127.5, 127.5)

    def crop(self, image: np.ndarray, keypoints: np.ndarray) -> np.ndarray:
        return align_face_112(image, keypoints, size=self.input_side)

    def embed(self, image: np.ndarray, keypoints: np.ndarray) -> np.ndarray:
        """``(dim,)`` unit-norm float32 of the face at ``keypoints`` in ``(H, W, 3)`` uint8 RGB."""
        crop = self.crop(image, keypoints)
        blob = ((crop.astype(np.float32) - self.mean) / self.std).transpose(2, 0, 1)[None]
        feature = self.session.run([self.output_name], {self.input_name: blob})[0]
        return l2_normalise(feature)
