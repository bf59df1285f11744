"""What both calibration steps share: the bundled photos, how they are read, a progress bar,
and the outward rounding of thresholds.

:mod:`counterfactory.validation.calibration.calibrate` (no-op ceilings and the different-person floor),
:mod:`counterfactory.validation.calibration.failures` (the failure corpus built from the photos) and
:mod:`counterfactory.validation.calibration.corpus_fit` (the thresholds fitted on that corpus) all read
the photos the same way; keeping these here lets each of them import it without importing
the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.sources import load_image

#: Who is in each bundled photo and which photograph each face comes from, faces ordered
#: left to right (``assets/photos/README.md``). Several files are one photograph re-framed or
#: re-encoded (the Oval Office portrait three times, the podium twice, and Biden in
#: ``two_people.jpg`` is cut from the Blue Room photograph): faces of one shot are never
#: compared as "different photos", which would inflate the same-person scores.
BUNDLED_FACES: dict[str, tuple[tuple[str, str], ...]] = {
    "astronaut.png": (("eileen_collins", "collins_nasa"),),
    "grace_hopper.jpg": (("grace_hopper", "hopper_navy"),),
    "obama_portrait.jpg": (("barack_obama", "obama_oval_office"),),
    "obama_letterbox_1080p.jpg": (("barack_obama", "obama_oval_office"),),
    "obama_partial_face.jpg": (("barack_obama", "obama_oval_office"),),
    "obama_podium.jpg": (("barack_obama", "obama_podium"),),
    "obama_rgba.png": (("barack_obama", "obama_podium"),),
    "biden_blue_room.jpg": (("joe_biden", "biden_blue_room"),),
    "biden_portrait.jpg": (("joe_biden", "biden_portrait"),),
    "two_people.jpg": (("barack_obama", "obama_two_people"), ("joe_biden", "biden_blue_room")),
}


def bundled_photo_paths() -> list[Path]:
    """The bundled photos (``assets/photos/``), sorted: the default calibration set."""
    return sorted(p for p in PHOTOS_DIR.iterdir() if p.suffix.lower() in {".png", ".jpg", ".jpeg"})


def load_rgb(path: str | Path) -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB, read exactly as the factory reads sources (:func:`load_image`)."""
    return load_image(path).pixels


def with_progress(items: Iterable, enabled: bool, desc: str, unit: str = "img") -> Iterable:
    """``items``, under a tqdm bar named ``desc`` when ``enabled`` and tqdm is installed."""
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit)


def sig_up(x: float, digits: int = 2) -> float:
    """``x`` rounded up to ``digits`` significant digits (0 for ``x <= 0``)."""
    if x <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return round(math.ceil(x / step - 1e-9) * step, 10)


def sig_down(x: float, digits: int = 2) -> float:
    """``x`` rounded down to ``digits`` significant digits (0 for ``x <= 0``)."""
    if x <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return round(math.floor(x / step + 1e-9) * step, 10)
