"""LibreFace action-unit intensities (an optional backend of the expression gate).

Chang et al., "LibreFace: An Open-Source Toolkit for Deep Facial Expression Analysis",
WACV 2024. The AU-intensity model is a ResNet-18 encoder with a small MLP head, distilled
from a Swin teacher and trained on DISFA; it predicts 12 DISFA AUs on a 0-5 scale from a
face aligned FFHQ-style on MediaPipe mesh points. This module rebuilds that network in plain
torch (no torchvision) with the same parameter names, so LibreFace's checkpoint
(``resnet_disfa_all/DISFA/all/resnet.pt``: ``{"model": state_dict}``) loads with
``strict=True``. The weights carry LibreFace's USC research licence and are not on any
package registry; pass their path as ``libreface_weights``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np

from counterfactory.manifests.errors import SetupError
from counterfactory.validation.faces import LEFT_EYE, LIPS, RIGHT_EYE, FaceObservation

INSTALL_HINT = "pip install 'counterfactory[libreface]'"
#: The 12 DISFA AUs, in the order of the model's outputs.
DISFA_AUS = ("AU01", "AU02", "AU04", "AU05", "AU06", "AU09", "AU12", "AU15", "AU17", "AU20", "AU25", "AU26")
#: LibreFace multiplies the sigmoid outputs by this and clamps to [0, 5] (DISFA's 0-5 scale).
INTENSITY_MAX = 5.0
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise SetupError(f"the LibreFace backend needs torch: {INSTALL_HINT}") from exc
    return torch


def build_libreface_resnet(num_labels: int = len(DISFA_AUS), dropout: float = 0.1):
    """LibreFace's ``AU_Recognition/models/resnet18.py`` network, randomly initialised.

    ``encoder``: torchvision's ResNet-18 without its ``fc`` (children 0-8: conv1, bn1, relu,
    maxpool, layer1-4, avgpool); ``classifier``: Linear(512, 128), ReLU, BatchNorm1d(128),
    Dropout, Linear(128, num_labels), Sigmoid. Input ``(N, 3, 224, 224)`` ImageNet-normalised
    RGB; output ``(N, num_labels)`` in [0, 1].
    """
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    def layer(cin: int, cout: int, stride: int):
        return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))

    class LibreFaceResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
                layer(64, 64, 1),
                layer(64, 128, 2),
                layer(128, 256, 2),
                layer(256, 512, 2),
                nn.AdaptiveAvgPool2d((1, 1)),
            )
            self.classifier = nn.Sequential(
                nn.Linear(512, 128),
                nn.ReLU(),
                nn.BatchNorm1d(num_features=128),
                nn.Dropout(p=dropout),
                nn.Linear(128, num_labels),
                nn.Sigmoid(),
            )

        def forward(self, images):
            features = self.encoder(images).reshape(images.shape[0], -1)
            return self.classifier(features)

    return LibreFaceResNet18()


def ffhq_align(image: np.ndarray, landmarks: np.ndarray, output_size: int = 256) -> np.ndarray:
    """LibreFace's face alignment (FFHQ-style, from ``detect_mediapipe_image.image_align``).

    The crop square is centred just below the eyes' midpoint, oriented along the eye line
    (tilted by the eye-to-mouth vector) and sized from the eye distance and eye-to-mouth
    distance; eyes are the means of MediaPipe's eye contours, the mouth the mid-point of the
    leftmost and rightmost lip points.

    Returns ``(output_size, output_size, 3)`` uint8 in ``image``'s channel order.
    """
    lm = np.asarray(landmarks, dtype=np.float64)[:, :2]
    eye_image_left = lm[list(RIGHT_EYE)].mean(axis=0)
    eye_image_right = lm[list(LEFT_EYE)].mean(axis=0)
    lips = lm[list(LIPS)]
    mouth = (lips[np.argmin(lips[:, 0])] + lips[np.argmax(lips[:, 0])]) / 2.0
    eye_avg = (eye_image_left + eye_image_right) / 2.0
    eye_to_eye = eye_image_right - eye_image_left
    eye_to_mouth = mouth - eye_avg
    x = eye_to_eye - np.flipud(eye_to_mouth) * np.array([-1.0, 1.0])
    x /= max(np.hypot(*x), 1e-9)
    x *= max(np.hypot(*eye_to_eye) * 2.0, np.hypot(*eye_to_mouth) * 1.8)
    y = np.flipud(x) * np.array([-1.0, 1.0])
    c = eye_avg + eye_to_mouth * 0.1
    # corners of the output square: (0,0) <- c-x-y, (0,S) <- c-x+y, (S,S) <- c+x+y
    src = np.float32([c - x - y, c - x + y, c + x + y])
    s = float(output_size)
    dst = np.float32([[0, 0], [0, s], [s, s]])
    m = cv2.getAffineTransform(src, dst)
    return cv2.warpAffine(image, m, (output_size, output_size), flags=cv2.INTER_AREA, borderValue=0)


class LibreFaceAUs:
    """LibreFace ResNet-18 AU intensities, kept loaded, on CPU unless told otherwise.

    Args:
        weights: LibreFace's ``resnet.pt`` (``{"model": state_dict}`` or a bare state dict).
        device: torch device string.
        threads: torch intra-op threads for this process (None leaves torch's setting).

    ``estimate`` returns the 12 DISFA AUs divided by 5, so in [0, 1] like the MediaPipe mapping.
    """

    name = "libreface"
    aus = DISFA_AUS

    def __init__(self, weights: str | Path | None, *, device: str = "cpu", threads: int | None = None) -> None:
        torch = _torch()
        if weights is None:
            raise SetupError(
                "the LibreFace backend needs its AU-intensity weights: set "
                "gates.<kind>.expression.libreface_weights to LibreFace's "
                "resnet_disfa_all/DISFA/all/resnet.pt (USC research licence, from the "
                "ihp-lab/LibreFace releases)"
            )
        path = Path(weights).expanduser()
        if not path.is_file():
            raise SetupError(
                f"LibreFace weights not found at {path}; download LibreFace's "
                "resnet_disfa_all/DISFA/all/resnet.pt and pass its path as libreface_weights"
            )
        if threads is not None:
            torch.set_num_threads(threads)
        checkpoint = torch.load(str(path), map_location=device, weights_only=True)
        state = checkpoint.get("model", checkpoint) if isinstance(checkpoint, dict) else checkpoint
        self.model = build_libreface_resnet().to(device)
        self.model.load_state_dict(state, strict=True)
        self.model.eval()
        self.device = device
        self._lock = threading.Lock()

    def preprocess(self, image: np.ndarray, face: FaceObservation):
        """``(1, 3, 224, 224)`` float32 tensor: aligned to 256, centre crop 224, ImageNet norm."""
        torch = _torch()
        aligned = ffhq_align(image, face.landmarks, 256)
        crop = aligned[16:240, 16:240].astype(np.float32) / 255.0
        crop = (crop - IMAGENET_MEAN) / IMAGENET_STD
        return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)[None])).to(self.device)

    def intensities(self, image: np.ndarray, face: FaceObservation) -> dict[str, float]:
        """The 12 DISFA AU intensities on LibreFace's 0-5 scale."""
        torch = _torch()
        batch = self.preprocess(image, face)
        with self._lock, torch.inference_mode():
            out = self.model(batch)[0].float().cpu().numpy()
        out = np.clip(out * INTENSITY_MAX, 0.0, INTENSITY_MAX)
        return {au: float(v) for au, v in zip(self.aus, out)}

    def estimate(self, image: np.ndarray, face: FaceObservation) -> dict[str, float]:
        return {au: v / INTENSITY_MAX for au, v in self.intensities(image, face).items()}
