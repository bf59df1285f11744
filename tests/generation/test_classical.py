"""The demo editor: deterministic, edits only inside the mask, distinct per condition."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.generation.editors import EditRequest, make_editor
from counterfactory.generation.editors.classical import ClassicalEditor, ClassicalOptions
from counterfactory.manifests.errors import SetupError
from counterfactory.validation.faces import face_mask, get_face_landmarker


@pytest.fixture(scope="module")
def grace_mask(grace):
    faces = get_face_landmarker().detect(grace)
    return face_mask(faces[0].landmarks, grace.shape[:2])


def _request(image, mask, condition, *, kind="face", seed=0):
    return EditRequest(attempt_id="x", image=image, prompt="p", seed=seed, kind=kind, mask=mask, condition=condition)


def test_face_edit_changes_only_the_feathered_face(grace, grace_mask):
    editor = ClassicalEditor(ClassicalOptions(output_multiple=0, feather_px=4))
    out = editor.edit(_request(grace, grace_mask, {"race": "Black", "gender": "female"})).image
    grown = cv2.dilate(grace_mask, np.ones((25, 25), np.uint8))
    assert np.array_equal(out[grown == 0], grace[grown == 0])
    inside = np.abs(out.astype(int) - grace.astype(int))[grace_mask > 0].mean()
    assert inside > 10  # visibly different


def test_conditions_differ_and_repeat_exactly(grace, grace_mask):
    editor = ClassicalEditor()
    a1 = editor.edit(_request(grace, grace_mask, {"race": "Black", "gender": "female"})).image
    a2 = editor.edit(_request(grace, grace_mask, {"race": "Black", "gender": "female"})).image
    b = editor.edit(_request(grace, grace_mask, {"race": "White", "gender": "male"})).image
    assert np.array_equal(a1, a2)
    assert np.abs(a1.astype(int) - b.astype(int)).mean() > 1


def test_output_is_resized_to_multiple_like_diffusers(grace, grace_mask):
    out = (
        ClassicalEditor(ClassicalOptions(output_multiple=32)).edit(_request(grace, grace_mask, {"race": "Black"})).image
    )
    assert out.shape[0] % 32 == 0 and out.shape[1] % 32 == 0 and out.shape[:2] != grace.shape[:2]


def test_limb_inpainting_touches_only_the_mask(grace):
    mask = np.zeros(grace.shape[:2], np.uint8)
    mask[450:520, 100:200] = 255
    out = (
        ClassicalEditor(ClassicalOptions(output_multiple=0))
        .edit(_request(grace, mask, {"cue": "removed"}, kind="limb"))
        .image
    )
    assert np.array_equal(out[mask == 0], grace[mask == 0])
    assert not np.array_equal(out[mask > 0], grace[mask > 0])


def test_no_mask_is_a_failed_result_not_a_crash(grace):
    result = ClassicalEditor().edit(_request(grace, None, {"race": "Black"}))
    assert result.status == "failed" and result.reason.startswith("classical_no_mask")


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(SetupError, match="classical, fal, qwen"):
        make_editor("dalle", None)
