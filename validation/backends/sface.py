"""OpenCV SFace identity embeddings (the offline default of the identity gate).

Zhong et al., "SFace: Sigmoid-Constrained Hypersphere Loss for Robust Face Recognition",
IEEE TIP 30 (2021). OpenCV Zoo's ``face_recognition_sface_2021dec.onnx`` (Apache-2.0) gives a
128-d feature; OpenCV documents a cosine of 0.363 or more as "the same identity".
"""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np

from counterfactory.assets import SFACE
from counterfactory.manifests.errors import SetupError
from counterfactory.validation.backends.base import align_face_112, l2_normalise
from counterfactory.validation.quiet import native_quiet

#: Same-identity cosine threshold documented for SFace by OpenCV (``face_recognition_sface``
#: in OpenCV Zoo and the ``FaceRecognizerSF`` tutorial).
OPENCV_SAME_PERSON_COSINE = 0.363


class SFaceEmbedder:
    """``cv2.FaceRecognizerSF`` on the ArcFace-template crop of a face.

    Args:
        model_path: ``face_recognition_sface_2021dec.onnx`` (the bundled copy by default).
    """

    name = "sface"
    dim = 128

    def __init__(self, model_path: str | Path = SFACE) -> None:
        path = Path(model_path)
        if not path.is_file():
            raise SetupError(
                f"SFace model not found at {path}; pass the path of "
                "face_recognition_sface_2021dec.onnx (the package ships one in assets/models/)"
            )
        if not hasattr(cv2, "FaceRecognizerSF"):
            raise SetupError("this OpenCV build has no FaceRecognizerSF; pip install 'opencv-python-headless>=4.9'")
        with native_quiet():  # OpenCV's DNN logs its backend choice to stderr
            self._model = cv2.FaceRecognizerSF.create(str(path), "")
        self._lock = threading.Lock()

    def crop(self, image: np.ndarray, keypoints: np.ndarray) -> np.ndarray:
        """The 112 x 112 RGB crop the embedding is computed on."""
        return align_face_112(image, keypoints)

    def embed(self, image: np.ndarray, keypoints: np.ndarray) -> np.ndarray:
        """``(128,)`` unit-norm float32 of the face at ``keypoints`` in ``(H, W, 3)`` uint8 RGB."""
        crop = self.crop(image, keypoints)
        # FaceRecognizerSF swaps B and R itself (it expects what cv2.imread returns).
        bgr = np.ascontiguousarray(crop[:, :, ::-1])
        with self._lock:
            feature = self._model.feature(bgr)
        return l2_normalise(feature)
