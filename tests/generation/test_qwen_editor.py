"""The qwen editor on a tiny, randomly initialised Qwen-Image-Edit pipeline (CPU, offline).

The pipeline folder is written by ``tests/generation/conftest_qwen.py`` with the real
component classes and layout, so the editor's real loading code runs on it. Its weights are
random: outputs are noise at the pipelines' own ~1 MP size, and every pipeline call costs a
few seconds of VAE work on a CPU, so results are computed once per module and shared.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pydantic
import pytest

from counterfactory.generation.align import AlignConfig, align_candidate
from counterfactory.generation.editors import make_editor
from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.qwen import QwenEditor, QwenOptions
from counterfactory.manifests.errors import SetupError
from tests.conftest import read_rgb
from tests.generation.conftest_qwen import build_tiny_qwen_pipeline, write_tiny_lora

PROMPT_A = "Change the person's apparent race to East Asian; keep everything else identical."
PROMPT_B = "Make her look older."
ONE_MP = 1024 * 1024


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("qwen") / "tiny-qwen-image-edit"
    components = build_tiny_qwen_pipeline(folder)
    return folder, components


@pytest.fixture(scope="module")
def source() -> np.ndarray:
    return read_rgb("grace_hopper.jpg")  # (600, 512, 3)


@pytest.fixture(scope="module")
def face_mask(source) -> np.ndarray:
    mask = np.zeros(source.shape[:2], np.uint8)
    mask[110:330, 150:370] = 255
    return mask


@pytest.fixture(scope="module")
def limb_mask(source) -> np.ndarray:
    mask = np.zeros(source.shape[:2], np.uint8)
    mask[430:560, 60:220] = 255
    return mask


def tiny_options(folder: Path, **changes) -> QwenOptions:
    base = {"model_id": str(folder), "device": "cpu", "dtype": "float32", "steps": 2, "true_cfg_scale": 1.0}
    return QwenOptions(**{**base, **changes})


def face_request(source, face_mask, *, seed=0, prompt=PROMPT_A, attempt="face") -> EditRequest:
    return EditRequest(attempt_id=attempt, image=source, prompt=prompt, seed=seed, kind="face", mask=face_mask)


def limb_request(source, limb_mask, *, seed=0, attempt="limb") -> EditRequest:
    return EditRequest(
        attempt_id=attempt,
        image=source,
        prompt="Remove the visible arm.",
        seed=seed,
        kind="limb",
        mask=limb_mask,
    )


@pytest.fixture(scope="module")
def face_runs(tiny, source, face_mask) -> dict:
    """Two face edits, one request at a time: seed 0 / prompt A and seed 1 / prompt B."""
    editor = QwenEditor(tiny_options(tiny[0]))
    a = editor.edit(face_request(source, face_mask, seed=0, prompt=PROMPT_A, attempt="a"))
    b = editor.edit(face_request(source, face_mask, seed=1, prompt=PROMPT_B, attempt="b"))
    return {"a": a, "b": b}


@pytest.fixture(scope="module")
def limb_run(tiny, source, limb_mask):
    return QwenEditor(tiny_options(tiny[0])).edit(limb_request(source, limb_mask))


def expected_size(h: int, w: int, multiple: int = 32) -> tuple[int, int]:
    """``(h, w)`` the Qwen-Image-Edit pipelines work at: 1 MP, source aspect, multiples of 32."""
    ratio = w / h
    width = math.sqrt(ONE_MP * ratio)
    return round(width / ratio / multiple) * multiple, round(width / multiple) * multiple


# -- lineage and registry (no model) ------------------------------------------------------


def test_lineage_changes_with_every_option_that_decides_the_output(tmp_path):
    base = QwenEditor(QwenOptions()).lineage()
    assert base["backend"] == "qwen" and base["model_id"] == "Qwen/Qwen-Image-Edit-2509"
    json.dumps(base)  # hashed into attempt ids: must serialise
    deciding = {
        "model_id": "Qwen/Qwen-Image-Edit",
        "revision": "0123abc",
        "pipeline": "inpaint",
        "steps": 8,
        "true_cfg_scale": 1.0,
        "negative_prompt": "blurry",
        "strength": 0.8,
        "lightning_lora": "lightx2v/Qwen-Image-Lightning",
        "scheduler_overrides": {"shift": 3.0},
        "dtype": "float16",
        "device": "cpu",
    }
    for name, value in deciding.items():
        changed = QwenEditor(QwenOptions(**{name: value})).lineage()
        assert changed != base, f"{name} does not change the lineage"
    with_lora = QwenOptions(lightning_lora="x/y")
    assert QwenEditor(with_lora.model_copy(update={"lora_scale": 0.5})).lineage() != QwenEditor(with_lora).lineage()
    execution_only = {
        "batch_size": 4,
        "cpu_offload": True,
        "compile": True,
        "download": True,
        "device": "cuda:1",
    }
    for name, value in execution_only.items():
        assert QwenEditor(QwenOptions(**{name: value})).lineage() == base, f"{name} changes the lineage"
    # settings a configuration never uses do not split attempts either
    unguided = QwenOptions(true_cfg_scale=1.0)
    assert (
        QwenEditor(unguided.model_copy(update={"negative_prompt": "blurry"})).lineage()
        == QwenEditor(unguided).lineage()
    )
    edit_only = QwenOptions(pipeline="edit")
    assert QwenEditor(edit_only.model_copy(update={"strength": 0.5})).lineage() == QwenEditor(edit_only).lineage()


def test_registry_builds_the_qwen_backend():
    editor = make_editor("qwen", QwenOptions(steps=3))
    assert isinstance(editor, QwenEditor) and editor.name == "qwen"
    assert editor.lineage()["steps"] == 3


def test_options_reject_unknown_fields_and_devices():
    with pytest.raises(pydantic.ValidationError, match="stepz"):
        QwenOptions(stepz=3)
    with pytest.raises(pydantic.ValidationError, match="device"):
        QwenOptions(device="gpu")


# -- set-up errors ------------------------------------------------------------------------


@pytest.mark.slow
def test_cuda_without_gpu_is_a_setup_error(monkeypatch, tiny):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    editor = QwenEditor(tiny_options(tiny[0], device="cuda"))
    with pytest.raises(SetupError) as info:
        editor.prepare()
    message = str(info.value)
    assert "torch.cuda.is_available() is False" in message
    assert "editor.qwen.device: cpu" in message and "GPU machine" in message


# prepare() imports torch and diffusers (tens of seconds on a busy CPU)
@pytest.mark.slow
def test_missing_model_directory_is_a_setup_error(tmp_path):
    editor = QwenEditor(tiny_options(tmp_path / "no-such-model"))
    with pytest.raises(SetupError, match="does not exist"):
        editor.prepare()


@pytest.mark.slow
def test_folder_without_model_index_is_a_setup_error(tmp_path):
    with pytest.raises(SetupError, match="model_index.json"):
        QwenEditor(tiny_options(tmp_path)).prepare()


@pytest.mark.slow
def test_model_not_in_cache_names_the_download_command():
    options = QwenOptions(model_id="counterfactory-tests/not-a-model", revision="v9", device="cpu")
    with pytest.raises(SetupError) as info:
        QwenEditor(options).prepare()
    assert "hf download counterfactory-tests/not-a-model --revision v9" in str(info.value)
    assert "download: true" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["torch", "diffusers", "transformers"])
def test_missing_package_names_the_extra(monkeypatch, tiny, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(SetupError, match=r"pip install 'counterfactory\[gpu\]'"):
        QwenEditor(tiny_options(tiny[0])).prepare()


@pytest.mark.slow
def test_cpu_offload_on_cpu_is_a_setup_error(tiny):
    with pytest.raises(SetupError, match="cpu_offload"):
        QwenEditor(tiny_options(tiny[0], cpu_offload=True)).prepare()


@pytest.mark.slow
def test_unknown_scheduler_override_is_a_setup_error(tiny):
    with pytest.raises(SetupError, match="shfit"):
        QwenEditor(tiny_options(tiny[0], scheduler_overrides={"shfit": 3.0})).prepare()


@pytest.mark.slow
def test_missing_lora_is_a_setup_error(tiny, tmp_path):
    with pytest.raises(SetupError, match="does not exist"):
        QwenEditor(tiny_options(tiny[0], lightning_lora=str(tmp_path / "lora.safetensors"))).prepare()
    with pytest.raises(SetupError, match="lightning_lora_weight_name"):
        QwenEditor(tiny_options(tiny[0], lightning_lora="lightx2v/Qwen-Image-Lightning")).prepare()


# -- editing ------------------------------------------------------------------------------


@pytest.mark.slow
def test_face_edit_output_contract(face_runs, source):
    result = face_runs["a"]
    assert result.status == "ok", result.reason
    h, w = expected_size(*source.shape[:2])
    assert result.image.shape == (h, w, 3) and result.image.dtype == np.uint8
    meta = result.metadata
    assert meta["pipeline"] == "QwenImageEditPipeline"
    assert meta["output_size"] == [w, h] and meta["input_size"] == [source.shape[1], source.shape[0]]
    assert meta["seed"] == 0 and meta["seconds"] > 0 and meta["batch_size"] == 1
    assert meta["negative_prompt"] is None  # true_cfg_scale 1: no guidance, no negative prompt


@pytest.mark.slow
def test_same_seed_matches_a_plain_diffusers_call_and_other_seeds_differ(face_runs, tiny, source):
    import torch
    from diffusers import QwenImageEditPipeline
    from PIL import Image

    # the second implementation: diffusers itself, built in memory from the same weights
    components = dict(tiny[1])
    if face_runs["a"].metadata["processor_backend"] == "torchvision":  # the stock processor loads
        from transformers import Qwen2VLProcessor

        components["processor"] = Qwen2VLProcessor.from_pretrained(tiny[0] / "processor")
    pipe = QwenImageEditPipeline(**components).to("cpu")
    pipe.set_progress_bar_config(disable=True)
    reference = pipe(
        image=Image.fromarray(source),
        prompt=PROMPT_A,
        true_cfg_scale=1.0,
        num_inference_steps=2,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="pil",
    ).images[0]
    np.testing.assert_array_equal(face_runs["a"].image, np.asarray(reference))
    assert np.abs(face_runs["a"].image.astype(int) - face_runs["b"].image.astype(int)).mean() > 5


@pytest.mark.slow
def test_batches_compute_what_one_by_one_calls_compute(tiny, source, face_mask, face_runs):
    editor = QwenEditor(tiny_options(tiny[0], batch_size=2))
    batch = editor.edit_many(
        [
            face_request(source, face_mask, seed=0, prompt=PROMPT_A, attempt="a"),
            face_request(source, face_mask, seed=1, prompt=PROMPT_B, attempt="b"),
        ]
    )
    assert [r.attempt_id for r in batch] == ["a", "b"]
    for got, single in zip(batch, (face_runs["a"], face_runs["b"]), strict=True):
        assert got.status == "ok" and got.metadata["batch_size"] == 2
        # prompts of different lengths are padded in a batch, which reorders float sums:
        # at most one grey level on a few pixels, never a different image
        diff = np.abs(got.image.astype(int) - single.image.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


@pytest.mark.slow
def test_limb_cells_inpaint_and_align_bit_exact_outside_the_mask(limb_run, face_runs, source, limb_mask):
    assert limb_run.status == "ok", limb_run.reason
    assert limb_run.metadata["pipeline"] == "QwenImageEditInpaintPipeline"
    assert limb_run.image.shape == (*expected_size(*source.shape[:2]), 3)
    assert not np.array_equal(limb_run.image, face_runs["a"].image)
    # The tiny model's weights are random, so its output is noise with nothing to register
    # against; registration itself is tested in test_align.py. Here: the editor's output goes
    # through alignment as it comes (size, dtype) and the composite restores the source.
    alignment = align_candidate(source, limb_run.image, mask=limb_mask, kind="limb", config=AlignConfig(method="none"))
    assert alignment.ok, alignment.reason
    assert alignment.image.shape == source.shape and alignment.image.dtype == np.uint8
    outside = limb_mask == 0
    np.testing.assert_array_equal(alignment.image[outside], source[outside])
    assert np.abs(alignment.image[~outside].astype(int) - source[~outside].astype(int)).mean() > 5


@pytest.mark.slow
def test_face_candidates_align_to_the_source_frame(face_runs, source, face_mask):
    alignment = align_candidate(
        source, face_runs["a"].image, mask=face_mask, kind="face", config=AlignConfig(method="none")
    )
    assert alignment.ok, alignment.reason
    assert alignment.image.shape == source.shape and alignment.image.dtype == np.uint8
    assert alignment.resize_from == tuple(face_runs["a"].metadata["output_size"])
    assert not alignment.composited


@pytest.mark.slow
def test_per_item_problems_are_values_and_spare_the_batch(tiny, source, limb_mask, limb_run):
    editor = QwenEditor(tiny_options(tiny[0], pipeline="inpaint", batch_size=4))
    # torch refuses to seed a generator with 2**70: a per-item error inside the pipeline call
    bad_seed = dataclasses.replace(limb_request(source, limb_mask, attempt="bad-seed"), seed=2**70)
    results = editor.edit_many(
        [
            limb_request(source, limb_mask, attempt="good"),
            bad_seed,
            EditRequest(attempt_id="no-mask", image=source, prompt="x", seed=0, kind="limb"),
            EditRequest(attempt_id="grey", image=source[..., 0], prompt="x", seed=0, kind="limb", mask=limb_mask),
        ]
    )
    by_id = {r.attempt_id: r for r in results}
    assert [r.attempt_id for r in results] == ["good", "bad-seed", "no-mask", "grey"]
    # the good item is retried alone after its batch failed, and seeding makes it repeatable
    assert by_id["good"].status == "ok"
    np.testing.assert_array_equal(by_id["good"].image, limb_run.image)
    assert by_id["bad-seed"].status == "failed" and by_id["bad-seed"].reason.startswith("qwen_pipeline_error")
    assert by_id["no-mask"].status == "failed" and by_id["no-mask"].reason.startswith("qwen_no_mask")
    assert by_id["grey"].status == "failed" and by_id["grey"].reason.startswith("qwen_bad_request")


@pytest.mark.slow
def test_nan_output_is_a_failed_result(tiny, tmp_path, source, face_mask):
    import torch

    folder = tmp_path / "nan-vae"
    shutil.copytree(tiny[0], folder)
    vae = copy.deepcopy(tiny[1]["vae"])
    with torch.no_grad():
        vae.post_quant_conv.weight.fill_(float("nan"))
    vae.save_pretrained(folder / "vae")
    result = QwenEditor(tiny_options(folder)).edit(face_request(source, face_mask))
    assert result.status == "failed" and result.image is None
    assert result.reason.startswith("qwen_nan_output")
    assert result.metadata["seed"] == 0 and result.metadata["pipeline"] == "QwenImageEditPipeline"


@pytest.mark.slow
def test_lightning_lora_is_fused_at_its_scale(tiny, tmp_path, source, face_mask, face_runs):
    from safetensors.torch import load_file

    lora = write_tiny_lora(tmp_path / "lora", tiny[1]["transformer"])
    editor = QwenEditor(tiny_options(tiny[0], lightning_lora=str(lora), lora_scale=0.5))
    assert editor.lineage() != QwenEditor(tiny_options(tiny[0])).lineage()
    result = editor.edit(face_request(source, face_mask, seed=0, prompt=PROMPT_A))
    assert result.status == "ok", result.reason
    assert not np.array_equal(result.image, face_runs["a"].image)
    # known answer: a fused LoRA adds scale * B @ A to each adapted weight (alpha == rank)
    transformer = editor._loaded.pipelines["edit"].transformer
    assert not any("lora" in name for name, _ in transformer.named_parameters())  # unloaded after fusing
    weights = load_file(lora)
    base = dict(tiny[1]["transformer"].named_parameters())
    fused = dict(transformer.named_parameters())
    for layer in ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.img_mod.1"):
        a = weights[f"transformer.{layer}.lora_A.weight"]
        b = weights[f"transformer.{layer}.lora_B.weight"]
        expected = base[f"{layer}.weight"].detach() + 0.5 * b @ a
        np.testing.assert_allclose(fused[f"{layer}.weight"].detach().numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.slow
def test_auto_uses_edit_plus_for_2509_models_with_guidance(tmp_path, tiny, source, face_mask):
    folder = tmp_path / "tiny-plus"
    shutil.copytree(tiny[0], folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "QwenImageEditPlusPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    editor = QwenEditor(tiny_options(folder, true_cfg_scale=4.0, batch_size=2))
    request = dataclasses.replace(face_request(source, face_mask), negative_prompt="cartoon")
    result = editor.edit(request)
    assert result.status == "ok", result.reason
    assert result.metadata["pipeline"] == "QwenImageEditPlusPipeline"
    assert result.metadata["negative_prompt"] == "cartoon"  # the request's, over the options'
    assert result.image.shape == (*expected_size(*source.shape[:2]), 3)


@pytest.mark.slow
def test_pipeline_output_with_qwen_like_drift_is_registered_and_composited(limb_run, source, limb_mask):
    """What the real inpaint pipeline returns: the whole image re-decoded at its ~1 MP size,
    content drifted by a few pixels (QwenLM/Qwen-Image issues 160, 229), new pixels in the
    mask. Built from the tiny pipeline's own output inside the mask and the drifted source
    outside; the factory's default alignment must find the drift and restore the source."""
    import cv2

    h, w = source.shape[:2]
    drift = np.float64([[1.01, 0, 2.5], [0, 1.01, -1.5]])  # source -> candidate coordinates
    drifted = cv2.warpAffine(source, drift, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    inside = cv2.warpAffine(limb_mask, drift, (w, h), flags=cv2.INTER_NEAREST) > 0
    out_h, out_w = limb_run.image.shape[:2]
    painted = drifted.copy()
    painted[inside] = cv2.resize(limb_run.image, (w, h), interpolation=cv2.INTER_AREA)[inside]
    candidate = cv2.resize(painted, (out_w, out_h), interpolation=cv2.INTER_AREA)

    alignment = align_candidate(source, candidate, mask=limb_mask, kind="limb", config=AlignConfig())
    assert alignment.ok, alignment.reason
    assert alignment.resize_from == (out_w, out_h)
    ys, xs = np.mgrid[0:h:32, 0:w:32]
    points = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    error = points @ alignment.transform[:, :2].T + alignment.transform[:, 2] - (points @ drift[:, :2].T + drift[:, 2])
    assert np.abs(error).max() < 0.5
    outside = limb_mask == 0
    np.testing.assert_array_equal(alignment.image[outside], source[outside])


@pytest.mark.slow
def test_lineage_carries_the_resolved_revision_of_what_was_loaded(tiny, tmp_path):
    editor = QwenEditor(tiny_options(tiny[0]))
    editor.prepare()  # the module's pipeline is already loaded: this resolves, it does not reload
    resolved = editor.lineage()["revision"]
    assert resolved is not None and resolved.startswith("folder:")
    # the same folder name holding another model (a refreshed cache) must not reuse attempts
    refreshed = tmp_path / "tiny-qwen-image-edit"
    shutil.copytree(tiny[0], refreshed)
    config = refreshed / "scheduler" / "scheduler_config.json"
    data = json.loads(config.read_text())
    data["shift"] = float(data.get("shift", 1.0)) + 0.5
    config.write_text(json.dumps(data))
    from counterfactory.generation.editors.qwen import _resolve_model

    assert _resolve_model(tiny_options(refreshed))[1] not in (None, resolved)
    assert _resolve_model(tiny_options(tiny[0]))[1] == resolved
