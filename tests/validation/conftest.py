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


@pytest.fixture(scope="session")
def limb_ask_release(tmp_path_factory):
    """``limb_ask.yaml``'s release, made once per session by the real command line (a demo-sized
    limb run with trials): ``ask --backend fal`` and the InclusiveCF scores read it; each writes
    its answers elsewhere."""
    from pathlib import Path

    from tests.flows.unchanged import run_cli

    out = tmp_path_factory.mktemp("limb-ask") / "out"
    run_cli(Path(__file__).with_name("limb_ask.yaml"), out)
    return out / "releases" / "limb-ask" / "0.1.0"
