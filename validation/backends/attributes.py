"""Perceived-attribute classifiers behind the target-attribute gate, run with onnxruntime.

- :class:`FairFaceClassifier`: a FairFace-style ONNX export (Kärkkäinen & Joo, "FairFace:
  Face Attribute Dataset for Balanced Race, Gender, and Age", WACV 2021): input
  ``(N, 3, 224, 224)`` RGB normalised with the ImageNet mean and standard deviation; output
  either one ``(N, 18)`` tensor (7 race, 2 gender, 9 age logits, the layout of the authors'
  ``res34_fair_align_multi_7``) or three tensors ``(N, 7)``, ``(N, 2)``, ``(N, 9)`` in that
  order. The weights are the user's file, checked against the sha256 the spec gives
  (FairFace's weights carry their own licence and are on no package registry; none was
  available to test against, so the tests use stand-in ONNX files of these shapes).

  The face is prepared as the authors' ``predict.py`` prepares it, so that the weights see
  what they were trained on: the photo resized to a long side of 800 px (bilinear, as
  ``dlib.resize_image``), a ``dlib.get_face_chip`` of 300 x 300 px with padding 0.25 aligned
  on dlib's five points (eye corners and the bottom of the nose, fitted by a least-squares
  similarity to dlib's 5-point mean face), then torchvision's ``Resize((224, 224))``
  (bilinear, antialiased, as PIL) and ``Normalize`` with the ImageNet mean and standard
  deviation, RGB. Two things differ from the original: the five points come from the
  MediaPipe face mesh (:data:`~counterfactory.validation.faces.DLIB5_POINTS`), not from
  dlib's CNN detector and shape predictor; and dlib's image pyramid, used when a chip
  shrinks its region by more than half, is approximated by halving the image with
  ``cv2.pyrDown`` until it does not.
- :class:`GenderAgeClassifier`: ``genderage.onnx`` of an InsightFace ``buffalo_l`` pack: input
  ``(1, 3, 96, 96)`` RGB in 0-255 (mean 0, std 1), output ``(1, 3)``: female and male scores,
  then age / 100; the crop is InsightFace's (``model_zoo/attribute.py``): the face box's
  centre, scaled so that 1.5 x its long side fills the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.safefiles import sha256_file
from counterfactory.validation.backends.base import similarity_transform

FAIRFACE_RACES = ("White", "Black", "Latino_Hispanic", "East Asian", "Southeast Asian", "Indian", "Middle Eastern")
FAIRFACE_GENDERS = ("Male", "Female")
FAIRFACE_AGES = ("0-2", "3-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60-69", "70+")
FAIRFACE_HEADS = {"race": FAIRFACE_RACES, "gender": FAIRFACE_GENDERS, "age": FAIRFACE_AGES}
GENDERAGE_GENDERS = ("Female", "Male")
GENDERAGE_FILE = "genderage.onnx"
#: dlib's 5-point mean face in a unit chip (``get_face_chip_details``, dlib 19.x), in its
#: part order: image-right eye outer, inner corner, image-left eye outer, inner corner, nose.
DLIB5_MEAN_FACE = np.array(
    [
        [0.8595674595992, 0.2134981538014],
        [0.6460604764104, 0.2289674387677],
        [0.1205750620789, 0.2137274526848],
        [0.3340850613712, 0.2290642403242],
        [0.4901123135679, 0.6277975316475],
    ]
)
#: FairFace's ``predict.py``: photos resized to this long side, chips of this size and padding.
FAIRFACE_MAX_SIDE = 800
FAIRFACE_CHIP_PX = 300
FAIRFACE_PADDING = 0.25
FAIRFACE_INPUT_PX = 224
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
INSTALL_HINT = "pip install 'counterfactory[insightface]'"


@dataclass(frozen=True)
class Perceived:
    """One classifier's reading of one face: per head, the top class and its probability.

    Attributes:
        labels: head -> class name in the model's vocabulary (``{"race": "Black", ...}``).
        probabilities: head -> softmax probability of that class in [0, 1].
        age_years: estimated age in years where the model regresses it, else None.
    """

    labels: dict[str, str]
    probabilities: dict[str, float]
    age_years: float | None = None


def _session(path: Path, threads: int | None):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise SetupError(f"the attribute classifiers need onnxruntime: {INSTALL_HINT}") from exc
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise SetupError(f"cannot load ONNX model {path}: {exc}; give an ONNX export of the model") from None


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


class FairFaceClassifier:
    """FairFace race, gender and age from a user-supplied ONNX file (see the module docstring).

    Args:
        weights: path of the ONNX file.
        sha256: its expected hex sha256; a mismatch raises before anything runs.
        threads: onnxruntime intra-op threads (0 or None: its default).

    Raises:
        SetupError: the file is missing, its sha256 differs, or it is not a model of
            the expected shapes.
    """

    name = "fairface"

    def __init__(self, weights: str | Path, sha256: str, *, threads: int | None = None) -> None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise SetupError(
                f"FairFace weights not found at {path}: export the FairFace model to ONNX and set "
                "gates.<kind>.attribute.weights to its path (and .sha256 to its checksum)"
            )
        actual = sha256_file(path)
        if actual != sha256.lower():
            raise SetupError(
                f"FairFace weights {path} have sha256 {actual}, but the spec expects {sha256}: "
                "the file is not the one the spec was written for; fix the path or the sha256"
            )
        self._session = _session(path, threads)
        inputs = self._session.get_inputs()
        shape = inputs[0].shape
        if len(shape) != 4 or shape[1] != 3 or shape[2] != 224 or shape[3] != 224:
            raise SetupError(f"FairFace model {path} takes input {shape}, expected (N, 3, 224, 224)")
        self._input = inputs[0].name
        widths = [o.shape[-1] for o in self._session.get_outputs()]
        if widths not in ([18], [7, 2, 9]):
            raise SetupError(
                f"FairFace model {path} has outputs of widths {widths}; expected one (N, 18) "
                "(7 race, 2 gender, 9 age logits) or three (N, 7), (N, 2), (N, 9)"
            )

    @staticmethod
    def crop(image: np.ndarray, dlib_points5: np.ndarray) -> np.ndarray:
        """``(224, 224, 3)`` uint8 RGB: the face as FairFace's ``predict.py`` feeds it to its
        model, before normalisation (see :func:`fairface_chip`)."""
        return fairface_chip(image, dlib_points5)

    def classify(self, image: np.ndarray, dlib_points5: np.ndarray) -> Perceived:
        """The face at ``dlib_points5`` (``(5, 2)`` pixels in dlib's part order,
        :meth:`FaceObservation.dlib_points5`) in ``(H, W, 3)`` uint8 RGB."""
        face = self.crop(image, dlib_points5).astype(np.float32) / 255.0
        blob = ((face - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None].astype(np.float32)
        outputs = [np.asarray(o, np.float64).reshape(-1) for o in self._session.run(None, {self._input: blob})]
        if len(outputs) == 1:
            logits = outputs[0]
            outputs = [logits[:7], logits[7:9], logits[9:18]]
        labels, probs = {}, {}
        for (head, classes), logits in zip(FAIRFACE_HEADS.items(), outputs, strict=True):
            p = _softmax(logits)
            i = int(np.argmax(p))
            labels[head], probs[head] = classes[i], float(p[i])
        return Perceived(labels, probs)


def fairface_chip(
    image: np.ndarray,
    dlib_points5: np.ndarray,
    *,
    max_side: int = FAIRFACE_MAX_SIDE,
    chip_px: int = FAIRFACE_CHIP_PX,
    padding: float = FAIRFACE_PADDING,
    out_px: int = FAIRFACE_INPUT_PX,
) -> np.ndarray:
    """FairFace's face preparation: ``(out_px, out_px, 3)`` uint8 in ``image``'s channels.

    Args:
        image: ``(H, W, 3)`` uint8 RGB photo.
        dlib_points5: ``(5, 2)`` pixels of ``image`` in dlib's 5-point part order.
        max_side: the photo is first resized to this long side (FairFace: 800).
        chip_px: side of the aligned chip (FairFace: 300).
        padding: dlib's chip padding, a fraction of the mean face on each side (FairFace: 0.25).
        out_px: the model's input side (FairFace: 224).

    A chip pixel ``(c, r)`` samples the resized photo at ``A @ (c, r) + t``, where ``A, t`` is
    the least-squares similarity taking the padded mean face (``(padding + DLIB5_MEAN_FACE) /
    (1 + 2 * padding) * chip_px``) to the points, as dlib fits it; outside the photo is black,
    as dlib's chips are.
    """
    h, w = image.shape[:2]
    points = np.asarray(dlib_points5, np.float64).reshape(5, 2)
    # predict.py: the long side becomes max_side, the short side is truncated to an int
    if w > h:
        new_w, new_h = max_side, int(max_side * h / w)
    else:
        new_w, new_h = int(max_side * w / h), max_side
    if (new_w, new_h) != (w, h):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        points = points * np.array([new_w / w, new_h / h])
    chip_points = (padding + DLIB5_MEAN_FACE) / (1.0 + 2.0 * padding) * chip_px
    to_image = similarity_transform(chip_points, points)
    # dlib samples from a 2x pyramid level when the chip shrinks its region by more than half
    while np.sqrt(abs(np.linalg.det(to_image[:, :2]))) > 2.0 and min(image.shape[:2]) > 1:
        image = cv2.pyrDown(image)
        to_image = to_image / 2.0
    chip = cv2.warpAffine(
        image,
        to_image,
        (chip_px, chip_px),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(0, 0, 0),
    )
    from PIL import Image

    resized = Image.fromarray(chip).resize((out_px, out_px), Image.BILINEAR)
    return np.asarray(resized, dtype=np.uint8)


class GenderAgeClassifier:
    """InsightFace ``genderage.onnx`` from a ``buffalo_l`` pack (see the module docstring)."""

    name = "insightface"

    def __init__(self, pack: str | Path | None = None, *, threads: int | None = None) -> None:
        from counterfactory.validation.backends.insightface import PACK_ENV, resolve_pack

        folder = resolve_pack(pack)
        path = folder / GENDERAGE_FILE
        if not path.is_file():
            raise SetupError(
                f"InsightFace model {GENDERAGE_FILE} not found in {folder}: unzip the buffalo_l pack "
                f"there, or set gates.<kind>.attribute.insightface_pack / ${PACK_ENV} to its folder"
            )
        self._session = _session(path, threads)
        self._input = self._session.get_inputs()[0].name
        shape = self._session.get_inputs()[0].shape
        self.size = int(shape[2]) if isinstance(shape[2], int) else 96

    def crop(self, image: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
        """``(size, size, 3)`` uint8 RGB centred on ``box`` (x0, y0, x1, y1 pixels), 1.5 x its
        long side across, as InsightFace's ``Attribute.get``."""
        x0, y0, x1, y1 = box
        scale = self.size / (max(x1 - x0, y1 - y0) * 1.5)
        cx, cy = (x0 + x1) / 2.0, (y0 + y1) / 2.0
        m = np.array([[scale, 0, self.size / 2 - scale * cx], [0, scale, self.size / 2 - scale * cy]], np.float64)
        return cv2.warpAffine(image, m, (self.size, self.size), flags=cv2.INTER_LINEAR)

    def classify(self, image: np.ndarray, box: tuple[float, float, float, float]) -> Perceived:
        """Gender (``Female`` / ``Male``) and age of the face in ``box`` of ``(H, W, 3)`` uint8 RGB."""
        face = self.crop(image, box).astype(np.float32)
        blob = face.transpose(2, 0, 1)[None]
        out = np.asarray(self._session.run(None, {self._input: blob})[0], np.float64).reshape(-1)
        p = _softmax(out[:2])
        i = int(np.argmax(p))
        return Perceived({"gender": GENDERAGE_GENDERS[i]}, {"gender": float(p[i])}, age_years=float(out[2] * 100.0))
