"""ECC divergence: a registration started in the wrong frame is not taken for one.

With no keypoint seed (a plain backdrop, a face region grown over most of a small source),
:func:`register` runs ECC from every :func:`editor_frames` start and keeps the best correlation.
From the ``fill`` start of an output padded to ``fit`` (a 1.5x zoom off) ECC can run off to a
degenerate warp that squeezes the source into a strip and correlates *better* than the right
start's result; whether it does, or stops with an error, depends on the CPU's float kernels.
Measured on London 030 (the import set's re-framed row pair033), AMD EPYC, AVX2/FMA: the
``fill`` start returned an axis ratio of 9.59 at correlation 0.690 against ``fit``'s 1.17 at 0.613,
so the row was labelled ``fill``; with AVX2/FMA disabled (``OPENCV_CPU_DISABLE``) ``fill`` raised
and the row was ``fit``. :func:`ecc_diverged` puts the decision far from both: 1.5.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from counterfactory.generation import align
from counterfactory.generation.align import (
    ECC_MAX_ANISOTROPY,
    ECC_MAX_SCALE_FACTOR,
    align_candidate,
    ecc_diverged,
    editor_frames,
)
from tests.conftest import read_rgb

SOURCE, OUTPUT = (384, 384), (1024, 1536)  # a square source padded to 3:2, as the import set does


def _in(frame: str, linear: np.ndarray) -> np.ndarray:
    """The 2x3 result whose editor motion (``frame`` undone) has ``linear`` as linear part."""
    motion = np.hstack([linear, [[1.5], [-2.0]]])
    return align._compose(editor_frames(SOURCE, OUTPUT)[frame], motion)


def _rotation(deg: float) -> np.ndarray:
    r = math.radians(deg)
    return np.array([[math.cos(r), -math.sin(r)], [math.sin(r), math.cos(r)]])


@pytest.mark.parametrize("ratio, diverged", [(1.0, False), (1.17, False), (1.45, False), (1.55, True), (9.59, True)])
@pytest.mark.parametrize("turn_deg", [30.0, 90.0])
def test_the_axis_ratio_bound_on_either_side(ratio, diverged, turn_deg):
    """The ``fit`` motion stretched by ``ratio`` (its singular values' ratio) along an axis
    turned from x (stretching x by about 1.5 is the ``stretch`` frame itself, below)."""
    linear = _rotation(turn_deg) @ np.diag([math.sqrt(ratio), 1 / math.sqrt(ratio)]) @ _rotation(-turn_deg)
    reason = ecc_diverged(_in("fit", linear), SOURCE, OUTPUT)
    assert (reason is not None) == diverged, reason
    if diverged:
        assert reason.startswith("axis ratio") and f"> {ECC_MAX_ANISOTROPY}" in reason


@pytest.mark.parametrize(
    "frame, scale, diverged",
    [("fit", 0.45, True), ("fit", 0.55, False), ("fit", 1.03, False), ("fill", 1.9, False), ("fill", 2.1, True)],
)
def test_the_scale_bound_on_either_side(frame, scale, diverged):
    """Judged from the nearest frame: ``fill`` is 1.5x ``fit``, so the smallest scale is read
    above ``fit`` and the largest above ``fill``."""
    reason = ecc_diverged(_in(frame, scale * _rotation(5.0)), SOURCE, OUTPUT)
    assert (reason is not None) == diverged, reason
    assert ECC_MAX_SCALE_FACTOR == 2.0


@pytest.mark.parametrize("name", ["fill", "fit", "stretch"])
def test_a_result_in_any_frame_is_judged_in_its_own_frame(name):
    """A start converges to another frame's map (``stretch`` to ``fit`` is an axis ratio of 1.5
    from its start): what is judged is the motion once the nearest frame is undone."""
    assert ecc_diverged(editor_frames(SOURCE, OUTPUT)[name], SOURCE, OUTPUT) is None


def test_the_measured_results_of_the_flipping_row():
    """The two ECC results of pair033 on AMD EPYC (rounded as logged): the degenerate one is a
    divergence, the poor but real one is not."""
    degenerate = np.array([[2.824, 0.245, 155.394], [-2.046, 27.113, -5716.862]])
    real = np.array([[3.215, -0.095, 151.314], [-0.101, 2.78, 8.628]])
    assert ecc_diverged(degenerate, SOURCE, OUTPUT).startswith("axis ratio 9.59")
    assert ecc_diverged(real, SOURCE, OUTPUT) is None
    assert ecc_diverged(np.full((2, 3), np.nan), SOURCE, OUTPUT) == "not finite"


@pytest.mark.slow
@pytest.mark.parametrize("photo", ["grace_hopper.jpg", "obama_portrait.jpg"])
def test_a_padded_output_without_keypoints_registers_in_fit(monkeypatch, photo):
    """A real photo at 384 px, resized 8/3 and padded by a quarter of its width each side (the
    import set's re-frame): with the keypoint seed taken away, ECC runs from every frame, the
    alignment says ``fit`` and is within 1 px of the truth."""
    image = read_rgb(photo)
    h, w = image.shape[:2]
    f = 384 / max(h, w)
    source = cv2.resize(image, (round(w * f), round(h * f)), interpolation=cv2.INTER_AREA)
    zoom = 1024 / 384
    big = cv2.resize(source, None, fx=zoom, fy=zoom, interpolation=cv2.INTER_CUBIC)
    pad = big.shape[1] // 4
    candidate = np.full((big.shape[0], big.shape[1] + 2 * pad, 3), 127, np.uint8)
    candidate[:, pad : pad + big.shape[1]] = big
    monkeypatch.setattr(align, "_feature_estimate", lambda *a: (None, np.zeros((0, 2)), np.zeros((0, 2))))
    result = align_candidate(source, candidate, config=align.AlignConfig())
    assert result.ok and result.frame == "fit"
    truth = np.array([[zoom, 0, 0.5 * zoom - 0.5 + pad], [0, zoom, 0.5 * zoom - 0.5]])
    ys, xs = np.mgrid[0 : source.shape[0] : 16, 0 : source.shape[1] : 16]
    points = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    error = points @ (result.raw_transform - truth)[:, :2].T + (result.raw_transform - truth)[:, 2]
    assert float(np.abs(error).max()) / zoom < 1.0
