"""SAM-assisted masks on randomly initialised SAM models (CPU, offline).

A tiny SAM (same classes as ``vit_b``, a 64-pixel image encoder) is registered in
``sam_model_registry`` under its own model type, so ``sam_mask`` runs its real path: registry
build, checkpoint loading with ``torch.load``, ``SamPredictor``. Its weights are random, so
the masks mean nothing; the tests check the plumbing against ``SamPredictor`` called
directly (the second implementation), the box clipping, caching and the errors.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.masks import MaskError
from counterfactory.generation.masks_sam import (
    box_region,
    clear_sam_cache,
    import_segment_anything,
    load_sam_predictor,
    sam_mask,
)
from counterfactory.manifests.errors import SetupError
from tests.conftest import read_rgb

TINY = "tiny_test"


def build_tiny_sam(checkpoint=None):
    """segment_anything's ``_build_sam`` with small dimensions: 64 px input, 8x8 embedding."""
    import torch
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    dim, size, patch = 16, 64, 8
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=2,
            embed_dim=32,
            img_size=size,
            mlp_ratio=2,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_heads=2,
            patch_size=patch,
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=(1,),
            window_size=4,
            out_chans=dim,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=dim,
            image_embedding_size=(size // patch, size // patch),
            input_image_size=(size, size),
            mask_in_chans=4,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=dim, mlp_dim=32, num_heads=2),
            transformer_dim=dim,
            iou_head_depth=3,
            iou_head_hidden_dim=16,
        ),
        pixel_mean=[123.675, 116.28, 103.53],
        pixel_std=[58.395, 57.12, 57.375],
    )
    sam.eval()
    if checkpoint is not None:
        with open(checkpoint, "rb") as f:
            sam.load_state_dict(torch.load(f))
    return sam


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    import torch

    sam = import_segment_anything()
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("sam") / "tiny_sam.pth"
    torch.save(build_tiny_sam().state_dict(), path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sam.sam_model_registry, TINY, build_tiny_sam)
        yield path
    clear_sam_cache()


@pytest.fixture(scope="module")
def photo():
    return read_rgb("grace_hopper.jpg")[:400, :300].copy()  # (400, 300, 3)


def direct_masks(checkpoint, image, **prompt):
    """SamPredictor called directly on a freshly loaded model: masks (bool) and scores."""
    import torch

    sam = import_segment_anything()
    predictor = sam.SamPredictor(sam.sam_model_registry[TINY](checkpoint=str(checkpoint)))
    with torch.inference_mode():
        predictor.set_image(image)
        masks, scores, _ = predictor.predict(**prompt)
    return masks, scores


BOX = [40.0, 60.0, 220.0, 330.0]


@pytest.mark.slow
def test_box_mask_matches_sam_predictor(tiny_checkpoint, photo):
    got = sam_mask(photo, box=BOX, checkpoint=tiny_checkpoint, model_type=TINY, clip_to_box=False, device="cpu")
    assert got.shape == photo.shape[:2] and got.dtype == np.uint8
    assert set(np.unique(got)) <= {0, 255}
    masks, _ = direct_masks(tiny_checkpoint, photo, box=np.array(BOX), multimask_output=False)
    np.testing.assert_array_equal(got, masks[0].astype(np.uint8) * 255)


@pytest.mark.slow
def test_points_are_x_then_y(tiny_checkpoint, photo):
    points, labels = [[120.0, 80.0], [30.0, 350.0]], [1, 0]
    got = sam_mask(photo, points=points, point_labels=labels, checkpoint=tiny_checkpoint, model_type=TINY, device="cpu")
    masks, _ = direct_masks(
        tiny_checkpoint,
        photo,
        point_coords=np.array(points),
        point_labels=np.array(labels),
        multimask_output=False,
    )
    np.testing.assert_array_equal(got, masks[0].astype(np.uint8) * 255)


@pytest.mark.slow
def test_multimask_keeps_the_best_scored(tiny_checkpoint, photo):
    got = sam_mask(
        photo, points=[[150, 200]], checkpoint=tiny_checkpoint, model_type=TINY, multimask=True, device="cpu"
    )
    masks, scores = direct_masks(
        tiny_checkpoint,
        photo,
        point_coords=np.array([[150.0, 200.0]]),
        point_labels=np.array([1]),
        multimask_output=True,
    )
    assert masks.shape[0] == 3
    np.testing.assert_array_equal(got, masks[int(np.argmax(scores))].astype(np.uint8) * 255)


@pytest.mark.slow
def test_box_clipping_zeroes_only_the_outside(tiny_checkpoint, photo):
    kwargs = {"box": BOX, "checkpoint": tiny_checkpoint, "model_type": TINY, "device": "cpu"}
    free = sam_mask(photo, clip_to_box=False, **kwargs)
    clipped = sam_mask(photo, **kwargs)
    inside = box_region(BOX, photo.shape[:2]) > 0
    assert not clipped[~inside].any()
    np.testing.assert_array_equal(clipped[inside], free[inside])


def test_box_region_uses_pixel_centres():
    region = box_region([1.0, 0.5, 3.0, 2.4], (4, 5))
    # columns 1, 2 (centres 1.5, 2.5) and rows 0, 1 (centres 0.5, 1.5) are inside
    expected = np.zeros((4, 5), np.uint8)
    expected[0:2, 1:3] = 255
    np.testing.assert_array_equal(region, expected)


@pytest.mark.slow
def test_cached_embedding_follows_the_image(tiny_checkpoint, photo):
    kwargs = {
        "box": BOX,
        "checkpoint": tiny_checkpoint,
        "model_type": TINY,
        "device": "cpu",
        "clip_to_box": False,
    }
    first = sam_mask(photo, **kwargs)
    other = np.ascontiguousarray(photo[:, ::-1])
    flipped = sam_mask(other, **kwargs)
    again = sam_mask(photo, **kwargs)
    np.testing.assert_array_equal(first, again)
    masks, _ = direct_masks(tiny_checkpoint, other, box=np.array(BOX), multimask_output=False)
    np.testing.assert_array_equal(flipped, masks[0].astype(np.uint8) * 255)
    # one model per (checkpoint, type, device) in this process
    assert load_sam_predictor(tiny_checkpoint, model_type=TINY, device="cpu") is load_sam_predictor(
        tiny_checkpoint, model_type=TINY, device="cpu"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ({}, "needs a box, points"),
        ({"box": [50, 10, 20, 40]}, "x0 < x1"),
        ({"box": [400, 500, 600, 700]}, "outside"),
        ({"box": [1, 2, 3]}, "4 finite numbers"),
        ({"points": [[1, 2, 3]]}, r"\(N, 2\)"),
        ({"points": [[1, 2]], "point_labels": [1, 0]}, "point_labels"),
        ({"points": [[1, 2]], "point_labels": [2]}, "0 or 1"),
        ({"point_labels": [1]}, "without points"),
    ],
)
def test_bad_prompts_raise_mask_errors(tiny_checkpoint, photo, prompt, message):
    with pytest.raises(MaskError, match=message):
        sam_mask(photo, checkpoint=tiny_checkpoint, model_type=TINY, device="cpu", **prompt)


@pytest.mark.slow
def test_bad_image_raises_mask_error(tiny_checkpoint, photo):
    with pytest.raises(MaskError, match="uint8"):
        sam_mask(photo.astype(np.float32), box=BOX, checkpoint=tiny_checkpoint, model_type=TINY)


@pytest.mark.slow
def test_missing_checkpoint_is_a_setup_error(tmp_path, tiny_checkpoint):
    with pytest.raises(SetupError, match="does not exist.*sam_vit_b_01ec64.pth"):
        sam_mask(np.zeros((8, 8, 3), np.uint8), box=[0, 0, 4, 4], checkpoint=tmp_path / "sam.pth", device="cpu")


@pytest.mark.slow
def test_unknown_model_type_lists_the_valid_ones(tiny_checkpoint):
    with pytest.raises(SetupError, match="vit_b"):
        load_sam_predictor(tiny_checkpoint, model_type="vit_xl", device="cpu")


@pytest.mark.slow
def test_checkpoint_of_another_model_type_is_a_setup_error(tiny_checkpoint):
    with pytest.raises(SetupError, match="is not a vit_b SAM checkpoint"):
        load_sam_predictor(tiny_checkpoint, model_type="vit_b", device="cpu")


@pytest.mark.slow
def test_cuda_without_gpu_is_a_setup_error(monkeypatch, tiny_checkpoint):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SetupError, match="no CUDA GPU"):
        load_sam_predictor(tiny_checkpoint, model_type=TINY, device="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("module", ["torch", "segment_anything"])
def test_missing_package_names_the_extra(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(SetupError, match=r"pip install 'counterfactory\[sam\]'"):
        load_sam_predictor("any.pth", device="cpu")


@pytest.mark.slow
def test_import_leaves_no_torchvision_stand_in_behind(tiny_checkpoint):
    import importlib.machinery

    sam = import_segment_anything()
    assert hasattr(sam, "SamPredictor") and "vit_b" in sam.sam_model_registry
    if importlib.machinery.PathFinder.find_spec("torchvision") is None:  # not installed here
        assert not [name for name in sys.modules if name.split(".")[0] == "torchvision"]


@pytest.mark.slow
def test_real_vit_b_checkpoint_loads_through_the_registry(tmp_path):
    import torch

    sam = import_segment_anything()
    torch.manual_seed(0)
    path = tmp_path / "sam_vit_b_random.pth"
    torch.save(sam.sam_model_registry["vit_b"]().state_dict(), path)
    entry = load_sam_predictor(path, model_type="vit_b", device="cpu")
    assert entry.predictor.model.image_encoder.img_size == 1024
    clear_sam_cache()


# --- a study's SAM masks: drawn once by `counterfactory masks`, stored, read by runs ------------

SPEC_BOX = [100.0, 300.0, 400.0, 590.0]


def _sam_study(tmp_path, specs_dir, limb_mask) -> tuple[Path, Path]:
    """A limb study over one bundled photo whose record asks SAM for its mask: (spec, photos)."""
    photos = tmp_path / "photos"
    photos.mkdir(parents=True)
    shutil.copy(PHOTOS_DIR / "grace_hopper.jpg", photos / "grace_hopper.jpg")
    record = {"id": "grace", "path": "grace_hopper.jpg", "licence": "public domain (U.S. Navy)", "context": "portrait"}
    (photos / "meta.yaml").write_text(yaml.safe_dump({"sources": [{**record, "limb_mask": limb_mask}]}))
    data = yaml.safe_load((specs_dir / "demo-limb.yaml").read_text())
    data["sources"] = {"photos": str(photos), "metadata": str(photos / "meta.yaml")}
    data["editor"]["max_attempts"] = 1
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec, photos


def _masks_cli(spec, checkpoint, *extra):
    from click.testing import CliRunner

    from counterfactory.flows.cli import main

    args = ["masks", str(spec), "--sam", str(checkpoint), "--model-type", TINY, "--device", "cpu", *extra]
    return CliRunner().invoke(main, args)


@pytest.mark.slow
def test_masks_command_stores_the_sam_mask_a_run_then_edits_inside(tiny_checkpoint, tmp_path, specs_dir):
    from counterfactory.flows.engine import execute, run_folder, sources, template
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.generation.masks import apply_mask_options
    from counterfactory.generation.records import SamPrompt, sam_mask_file

    spec_path, photos = _sam_study(tmp_path, specs_dir, {"sam": {"box": SPEC_BOX}})
    stored = photos / sam_mask_file("grace", SamPrompt(box=SPEC_BOX))
    # before the command, the source names the missing mask and the fix
    spec = load_spec(spec_path)
    ws = run_folder.open_workspace(spec, tmp_path / "before")
    prepared, failed = sources.prepare_sources(spec, ws.ledger)
    ws.ledger.close()
    assert not prepared and "counterfactory masks" in failed[0].reason and str(stored) in failed[0].reason

    result = _masks_cli(spec_path, tiny_checkpoint)
    assert result.exit_code == 0, result.output
    assert "grace: written" in result.output and "1 stored, 0 failed" in result.output
    # the stored pixels are SAM's answer (the predictor called directly) clipped to the box
    masks, _ = direct_masks(
        tiny_checkpoint, read_rgb("grace_hopper.jpg"), box=np.array(SPEC_BOX), multimask_output=False
    )
    expected = (masks[0].astype(np.uint8) * 255) & box_region(SPEC_BOX, masks[0].shape)
    np.testing.assert_array_equal(np.asarray(Image.open(stored)), expected)
    note = json.loads(stored.with_suffix(".json").read_text())
    assert note["checkpoint_sha256"] == hashlib.sha256(tiny_checkpoint.read_bytes()).hexdigest()
    assert note["model_type"] == TINY and note["prompt"]["box"] == SPEC_BOX
    first_bytes = stored.read_bytes()

    # a second call keeps what is stored (a person may have corrected it)
    again = _masks_cli(spec_path, tiny_checkpoint)
    assert again.exit_code == 0 and "grace: kept" in again.output and stored.read_bytes() == first_bytes

    # a run reads the stored file: no SAM call (the checkpoint may be gone), and attempt ids
    # follow the mask's pixels
    def attempt_ids(out):
        spec = load_spec(spec_path)
        ws = run_folder.open_workspace(spec, out)
        prepared, failed = sources.prepare_sources(spec, ws.ledger)
        assert not failed
        (source,) = prepared
        np.testing.assert_array_equal(source.region, apply_mask_options(np.asarray(Image.open(stored)), spec.masks))
        editor = execute.build_editor(spec)
        grid = sources.plan_grid(spec, prepared)
        outcome = template.process_template(
            spec, ws, source, grid.cells_of(source.id), editor, execute.build_gate_stack(spec)
        )
        ids = sorted(a for c in outcome.cells for a in c.attempt_ids)
        assert len(ids) == 2 and outcome.editor_calls == 2
        ws.ledger.close()
        return ids

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("counterfactory.generation.masks_sam.load_sam_predictor", _no_sam)
        before = attempt_ids(tmp_path / "run1")
        corrected = np.asarray(Image.open(stored)).copy()
        corrected[: corrected.shape[0] // 2 + 100] = 0  # a hand correction: the top part was not the limb
        assert corrected.any()
        Image.fromarray(corrected).save(stored)
        after = attempt_ids(tmp_path / "run2")
    assert set(before).isdisjoint(after)


def _no_sam(*_args, **_kwargs):
    raise AssertionError("a run must not call SAM")


def test_masks_command_reports_bad_prompts_and_studies_without_sam(tmp_path, specs_dir):
    # both are found before any model is loaded (the checkpoint need not exist)
    checkpoint = tmp_path / "never-loaded.pth"
    spec_path, _ = _sam_study(tmp_path, specs_dir, {"sam": {"box": [600.0, 700.0, 900.0, 800.0]}})
    result = _masks_cli(spec_path, checkpoint)
    assert result.exit_code == 1 and "grace: failed: SAM prompt" in result.output
    plain, _ = _sam_study(tmp_path / "plain", specs_dir, {"polygons": [[[10, 10], [60, 10], [60, 60]]]})
    result = _masks_cli(plain, checkpoint)
    assert result.exit_code == 2 and "no source asks for a SAM mask" in result.output


@pytest.mark.parametrize(
    "prompt, match",
    [
        ({}, "a box"),
        ({"box": [50, 10, 40, 90]}, "x0 < x1"),
        ({"points": [[1, 2]], "point_labels": [1, 0]}, "one point label per point"),
        ({"box": [0, 0, 10, 10], "checkpoint": "x.pth"}, "checkpoint"),
    ],
)
def test_bad_sam_prompt_names_the_problem(prompt, match):
    from pydantic import ValidationError

    from counterfactory.generation.records import SourceRecord

    with pytest.raises(ValidationError, match=match):
        SourceRecord(id="a", path="a.jpg", licence="cc0", limb_mask={"sam": prompt})
