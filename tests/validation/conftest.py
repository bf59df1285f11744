"""Fixtures for the validation tests: bundled photos as RGB arrays, the real models loaded
once for the session, and gate stacks built from the shipped calibration."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.gate_stack import GatesConfig, GateStack


@functools.cache
def _photo(name: str) -> np.ndarray:
    image = load_rgb(PHOTOS_DIR / name)
    image.setflags(write=False)
    return image


@pytest.fixture(scope="session")
def photo():
    """``photo("grace_hopper.jpg")`` -> read-only ``(H, W, 3)`` uint8 RGB of a bundled photo."""
    return _photo


@pytest.fixture(scope="session")
def gates_config() -> GatesConfig:
    return GatesConfig()


@pytest.fixture(scope="session")
def face_stack(gates_config) -> GateStack:
    return GateStack.from_config(gates_config, "face")


@pytest.fixture(scope="session")
def limb_stack(gates_config) -> GateStack:
    return GateStack.from_config(gates_config, "limb")


@pytest.fixture(scope="session")
def landmarker(face_stack):
    return face_stack.landmarker
