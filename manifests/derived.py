"""Robustness variants: derived items made from released items by fixed image transforms.

``robustness`` in the spec (opt-in): ``mirror`` flips every item left-right; ``crops`` makes a
three-level series (``original``, ``medium``, ``close``) whose boxes come from one face box per
template, measured on the source, so every variant of a template is cut at the same pixels and
a scoring harness compares like with like. Boxes are nested and always contain the face box.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x1/y1 exclusive


class RobustnessConfig(BaseModel):
    """``robustness``: derived items written to ``derived.jsonl``.

    Attributes:
        mirror: add a left-right mirrored copy of every item.
        crops: add the three-level crop series of every item.
        medium_scale, close_scale: crop width and height as multiples of the face box's
            (clipped to the enclosing level), ``close_scale < medium_scale``.
    """

    model_config = ConfigDict(extra="forbid")

    mirror: bool = False
    crops: bool = False
    medium_scale: float = Field(3.0, gt=1.0, le=100.0)
    close_scale: float = Field(1.6, gt=1.0, le=100.0)


def _window(centre: float, size: int, lo: int, hi: int) -> tuple[int, int]:
    start = int(round(centre - size / 2))
    start = min(max(start, lo), hi - size)
    return start, start + size


def crop_series(
    face_box: tuple[float, float, float, float], shape: tuple[int, int], config: RobustnessConfig
) -> dict[str, Box]:
    """``{"original", "medium", "close"}`` boxes for an image of ``shape`` ``(H, W)``.

    Each level is centred on the face box, as large as its scale times the face box (at least
    the face box; the medium level at most half-way between the close-up and the whole image),
    and moved inside the enclosing level, so the levels are nested, each contains the face box
    (clipped to the image), and each is smaller than the one enclosing it unless the face fills
    the image.
    """
    h, w = shape
    x0, y0, x1, y1 = face_box
    fx0, fy0 = max(0, int(np.floor(x0))), max(0, int(np.floor(y0)))
    fx1, fy1 = min(w, int(np.ceil(x1))), min(h, int(np.ceil(y1)))
    if fx1 <= fx0 or fy1 <= fy0:
        raise ValueError(f"face box {face_box} lies outside the {w}x{h} image")
    fw, fh = fx1 - fx0, fy1 - fy0
    cx, cy = (fx0 + fx1) / 2, (fy0 + fy1) / 2
    # close: a multiple of the face box; medium: a multiple too, but at most half-way between
    # the close-up and the whole image, so the three levels differ even for a tight portrait
    close_w = min(max(fw, int(round(fw * config.close_scale))), w)
    close_h = min(max(fh, int(round(fh * config.close_scale))), h)
    medium_w = max(close_w, min(int(round(fw * config.medium_scale)), (w + close_w) // 2))
    medium_h = max(close_h, min(int(round(fh * config.medium_scale)), (h + close_h) // 2))
    boxes: dict[str, Box] = {"original": (0, 0, w, h)}
    mx0, mx1 = _window(cx, medium_w, 0, w)
    my0, my1 = _window(cy, medium_h, 0, h)
    boxes["medium"] = (mx0, my0, mx1, my1)
    x0c, x1c = _window(cx, close_w, mx0, mx1)
    y0c, y1c = _window(cy, close_h, my0, my1)
    boxes["close"] = (x0c, y0c, x1c, y1c)
    return boxes


def derived_id(parent_item_id: str, transform: dict[str, Any]) -> str:
    """sha256 of the parent item and the transform: what decides the derived image."""
    blob = json.dumps({"parent": parent_item_id, "transform": transform}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def apply_transform(image: np.ndarray, transform: dict[str, Any]) -> np.ndarray:
    """The derived pixels: ``(H, W, 3)`` uint8 in, ``(h, w, 3)`` uint8 out."""
    if transform["kind"] == "mirror":
        return np.ascontiguousarray(image[:, ::-1])
    if transform["kind"] == "crop":
        x0, y0, x1, y1 = transform["box"]
        return np.ascontiguousarray(image[y0:y1, x0:x1])
    raise ValueError(f"unknown transform {transform['kind']!r}")
