"""The ``classical`` backend: a CPU editor for demos and pipeline tests. Demo quality.

It makes **no** demographic change and claims none. It exists so that every later stage
(alignment, gates, review, release) runs for real on a laptop with no GPU and no network:

- face cells: a deterministic, visibly different tone and colour change per condition, inside
  the feathered face mask the factory passes in ``EditRequest.mask``;
- limb cells: OpenCV inpainting (Telea 2004) inside the limb mask.

Then, for face cells (``rerender``, on by default), the whole image goes through a real
pretrained latent autoencoder (TAEF2, :mod:`counterfactory.generation.rerender`), as every
diffusion editor's decoder does: the pixels it was told to keep come back re-synthesised, so
the gates meet what real editors return. Limb cells are composited by the factory (every
pixel outside the mask copied back), so they are not re-rendered.

Like the diffusers pipelines, it returns its output resized to a multiple of
``output_multiple`` pixels, so the factory's alignment has real work to undo. For real
datasets use the ``qwen`` (local GPU) or ``fal`` (Nano Banana) backends.
"""

from __future__ import annotations

import colorsys
import hashlib
from typing import Any

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.editors.base import EditRequest, EditResult, SequentialEditor
from counterfactory.generation.masks import feather
from counterfactory.manifests.registry import EDITORS


class ClassicalOptions(BaseModel):
    """Options of the ``classical`` backend (``editor.classical`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    strength: float = Field(0.55, ge=0.0, le=1.0)
    feather_px: float = Field(6.0, ge=0.0)
    inpaint_radius_px: float = Field(5.0, gt=0.0)
    #: resize outputs to a multiple of this many pixels (as diffusers does); 0 keeps the size.
    output_multiple: int = Field(16, ge=0)
    #: face cells: re-render the whole edited image through TAEF2, as a real editor's decoder does
    rerender: bool = True
    #: the re-render's long side at most (the output stays at that size, as an editor returns
    #: its own resolution); None: the source's own size (slower: cost grows with pixels)
    rerender_max_side: int | None = Field(512, ge=64)


def condition_tint(condition: dict[str, str], seed: int) -> tuple[np.ndarray, float]:
    """A stable RGB tint in [0, 1] and a lightness gain for one condition (and seed jitter).

    The hue comes from every axis but ``gender`` and the gain from ``gender``, so conditions
    that share a race share a colour family and the two genders differ in lightness.
    """
    rest = "|".join(f"{k}={v}" for k, v in sorted(condition.items()) if k != "gender")
    digest = hashlib.sha256(rest.encode()).digest()
    hue = digest[0] / 255.0
    gender = condition.get("gender", "")
    gender_digest = hashlib.sha256(gender.encode()).digest()
    gain = {"female": 1.2, "male": 0.8}.get(gender.lower(), 0.75 + 0.5 * gender_digest[0] / 255.0)
    jitter = (seed % 7) / 70.0  # retries with the next seed differ a little
    r, g, b = colorsys.hsv_to_rgb((hue + jitter) % 1.0, 0.7, 1.0)
    return np.array([r, g, b], np.float32), gain


def _resize_multiple(image: np.ndarray, multiple: int) -> np.ndarray:
    if multiple <= 0:
        return image
    h, w = image.shape[:2]
    nh, nw = max(multiple, round(h / multiple) * multiple), max(multiple, round(w / multiple) * multiple)
    if (nh, nw) == (h, w):
        return image
    return cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA)


class ClassicalEditor(SequentialEditor):
    """CPU editor; see the module docstring."""

    name = "classical"

    def __init__(self, options: ClassicalOptions | None = None) -> None:
        self.options = options or ClassicalOptions()
        self._rerenderer = None

    def prepare(self) -> None:
        """Load the autoencoder once, before any work, when re-rendering is on."""
        if self.options.rerender and self._rerenderer is None:
            from counterfactory.generation.rerender import get_rerenderer

            self._rerenderer = get_rerenderer(self.options.rerender_max_side)

    def rerender(self, image: np.ndarray) -> np.ndarray:
        """``image`` through the autoencoder (:class:`~counterfactory.generation.rerender.Rerenderer`)."""
        self.prepare()
        return self._rerenderer(image)

    def lineage(self) -> dict[str, Any]:
        return {"backend": self.name, "version": 1, **self.options.model_dump()}

    def consumes(self, kind: str) -> frozenset[str]:
        """The tint comes from the condition and seed, inside the mask; the prompt is not read."""
        return frozenset({"seed", "mask"}) if kind == "face" else frozenset({"mask"})

    def edit(self, request: EditRequest) -> EditResult:
        image = request.image
        if request.mask is None or not np.any(request.mask):
            return EditResult(
                request.attempt_id,
                "failed",
                reason="classical_no_mask: the classical editor edits only inside the cell's mask",
            )
        if request.kind == "limb":
            out = cv2.inpaint(
                image,
                (request.mask > 0).astype(np.uint8) * 255,
                self.options.inpaint_radius_px,
                cv2.INPAINT_TELEA,
            )
        else:
            tint, gain = condition_tint(dict(request.condition), request.seed)
            alpha = feather(request.mask, self.options.feather_px)[..., None] * self.options.strength
            pixels = image.astype(np.float32) / 255.0
            luminance = pixels.mean(axis=2, keepdims=True)
            toned = np.clip(luminance * gain * 1.6 * tint, 0.0, 1.0)
            out = np.rint(255.0 * ((1 - alpha) * pixels + alpha * toned)).astype(np.uint8)
            if self.options.rerender:
                out = self.rerender(out)
        out = _resize_multiple(out, self.options.output_multiple)
        return EditResult(
            request.attempt_id,
            "ok",
            image=out,
            metadata={"output_size": [int(out.shape[1]), int(out.shape[0])]},
        )


EDITORS.register("classical", ClassicalOptions, ClassicalEditor)
