"""Shared fixtures: the bundled real photos and models, and an isolated Prefect home."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# Prefect's temporary server and its state live in a throwaway folder for the whole session.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="cf-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from counterfactory.assets import PHOTOS_DIR, SPECS_DIR  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def read_rgb(name: str) -> np.ndarray:
    with Image.open(PHOTOS_DIR / name) as im:
        return np.asarray(im.convert("RGB")).copy()


@pytest.fixture(scope="session")
def photos_dir() -> Path:
    return PHOTOS_DIR


@pytest.fixture(scope="session")
def specs_dir() -> Path:
    return SPECS_DIR


@pytest.fixture(scope="session")
def grace() -> np.ndarray:
    return read_rgb("grace_hopper.jpg")


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    return read_rgb("astronaut.png")
