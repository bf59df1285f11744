"""A source's check in the engine (``flows/engine/sources.py``): the edit region a face design
measures around, and the key its face check is cached under (the photo, the face-mask mode, the
region, the landmarker; none for a limb design)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from counterfactory.flows.engine.sources import edit_region_name, source_check_key
from counterfactory.flows.engine.spec import load_spec
from counterfactory.generation.prompts import face_region


@pytest.fixture(scope="module")
def specs(specs_dir):
    return load_spec(specs_dir / "demo-face.yaml"), load_spec(specs_dir / "demo-limb.yaml")


def _gates(spec, **changes):
    return spec.model_copy(update={"gates": spec.gates.model_copy(update=changes)})


def test_the_edit_region_is_the_gates_else_the_prompts(specs):
    face, _ = specs
    assert edit_region_name(face) == face_region(face.prompts) == "face_neck_ears"  # face_only_v1 in regions.yaml
    assert edit_region_name(_gates(face, edit_region="face")) == "face"


def test_a_face_check_is_keyed_by_what_decides_it(specs):
    face, limb = specs
    photo = SimpleNamespace(sha256="a" * 64, pixels=np.zeros((40, 30, 3), np.uint8))
    key = source_check_key(face, photo)
    assert len(key) == 64 and source_check_key(face, photo) == key
    assert source_check_key(face, SimpleNamespace(sha256="b" * 64, pixels=photo.pixels)) != key
    assert source_check_key(face, SimpleNamespace(sha256="a" * 64, pixels=np.zeros((30, 40, 3), np.uint8))) != key
    other_mask = "skin" if face.gates.face_mask != "skin" else "oval"
    assert source_check_key(_gates(face, face_mask=other_mask), photo) != key
    assert source_check_key(_gates(face, edit_region="face"), photo) != source_check_key(
        _gates(face, edit_region="face_neck_ears"), photo
    )
    assert source_check_key(limb, photo) is None  # a limb's masks are read from files every run
