"""Qwen-Image-Edit through diffusers, in process (GPU; CPU for tiny test pipelines).

Three diffusers pipelines share one set of weights (text encoder, MMDiT transformer, VAE):

- ``QwenImageEditPipeline`` (Qwen-Image-Edit) and ``QwenImageEditPlusPipeline``
  (Qwen-Image-Edit-2509 and later) edit the whole image from the prompt: face cells.
- ``QwenImageEditInpaintPipeline`` denoises only inside ``request.mask`` and blends the
  source latents back outside it: limb cells. It still re-decodes the whole image, so pixels
  outside the mask change slightly; the factory's alignment step copies them back exactly.

All of them resize the source to about one megapixel in multiples of 16 or 32 and return
that size; this backend hands the image back as returned (``counterfactory.generation.align`` resizes it).

Every call goes through the loaded pipeline's batch worker
(:mod:`counterfactory.generation.editors.qwen_batch`): one thread that feeds the pipeline
batches from a bounded queue, so template threads align and judge on the CPU while it
generates, and their requests share batches.

The pipeline is loaded once per worker process (a module-level cache keyed by everything
that identifies the loaded object) in :meth:`QwenEditor.prepare`, which also raises
:class:`SetupError` for everything that would make the whole batch fail: missing
packages, no GPU, weights not downloaded. Problems with one image (out of memory, NaN
output, a malformed request) come back as ``EditResult(status="failed")``.

Why the processor is rebuilt without torchvision: transformers loads the Qwen2-VL
processor's *video* half through torchvision, which editing never uses. Where torchvision is
not installed (CPU machines with the CPU build of torch), the processor is assembled from
its image processor and tokenizer only; with torchvision the stock loader is used.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field

from counterfactory.generation.editors.base import EditJournal, EditorOptions, EditRequest, EditResult
from counterfactory.generation.editors.qwen_batch import BatchWorker
from counterfactory.generation.editors.registry import EDITORS, EditorCapabilities, device_gpus
from counterfactory.manifests.errors import SetupError

PipelineName = Literal["edit", "edit_plus", "inpaint"]

#: diffusers class of each pipeline this backend drives.
PIPELINE_CLASSES: dict[str, str] = {
    "edit": "QwenImageEditPipeline",
    "edit_plus": "QwenImageEditPlusPipeline",
    "inpaint": "QwenImageEditInpaintPipeline",
}

#: The edit and inpaint pipelines condition on and generate at this area whatever the
#: source size (``calculate_dimensions(1024 * 1024, ratio)`` inside diffusers).
TARGET_AREA_PX = 1024 * 1024

_INSTALL_HINT = "pip install 'counterfactory[gpu]'"


class QwenOptions(EditorOptions):
    """Options of the ``qwen`` backend (``editor.qwen`` in the spec).

    Attributes:
        pipeline: ``auto`` uses the inpaint pipeline for limb cells and the model's own edit
            pipeline (``edit`` or ``edit_plus``, read from its ``model_index.json``) for
            face cells; the other values force one pipeline for every cell.
        model_id: a Hugging Face Hub id or a local ``save_pretrained`` directory.
        revision: hub revision (branch, tag or commit); ``None`` is the cached ``main``.
        steps: denoising steps (``num_inference_steps``).
        true_cfg_scale: classifier-free guidance scale; at or below 1 there is no guidance
            and the negative prompt is not used.
        negative_prompt: used when the request carries none.
        strength: inpaint only, in [0, 1]: how much noise the masked region starts from
            (1 regenerates it entirely).
        lightning_lora: a LoRA fused into the transformer before use: a ``.safetensors``
            file, a directory holding one, or a hub repo id (then ``lightning_lora_weight_name``
            names the file in it).
        lightning_lora_weight_name: the LoRA file name inside a directory or hub repo.
        lora_scale: weight of the fused LoRA.
        scheduler_overrides: keys replaced in the scheduler's config (Lightning LoRAs ship
            their own shift settings).
        cpu_offload: keep each model on the CPU until it runs (``enable_model_cpu_offload``).
        compile: ``torch.compile`` the transformer's repeated blocks.
        batch_size: requests of the same pipeline and source size denoised together, from
            one call or from several threads (templates) through the batch worker
            (:mod:`counterfactory.generation.editors.qwen_batch`); ``edit_plus`` only runs one
            at a time (a diffusers limit).
        dtype: weights and activations.
        device: ``cuda``, ``cuda:N`` or ``cpu`` (tiny test pipelines only).
        download: fetch missing weights from the hub; by default only local files and the
            Hugging Face cache are used, so nothing is downloaded in the middle of a run.
    """

    model_config = ConfigDict(extra="forbid")

    pipeline: Literal["auto", "edit", "edit_plus", "inpaint"] = "auto"
    model_id: str = "Qwen/Qwen-Image-Edit-2509"
    revision: str | None = None
    steps: int = Field(40, ge=1)
    true_cfg_scale: float = Field(4.0, ge=0)
    negative_prompt: str = " "
    strength: float = Field(1.0, gt=0, le=1)
    lightning_lora: str | None = None
    lightning_lora_weight_name: str | None = None
    lora_scale: float = 1.0
    scheduler_overrides: dict[str, float | int | bool | str | None] = Field(default_factory=dict)
    cpu_offload: bool = False
    compile: bool = False
    batch_size: int = Field(1, ge=1)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    device: str = Field("cuda", pattern=r"^(cpu|cuda(:\d+)?)$")
    download: bool = False


@dataclass
class _Loaded:
    """One loaded set of weights and the pipelines built on it (shared modules)."""

    model_dir: Path
    model_commit: str | None
    #: the pipeline ``auto`` uses for face cells: ``edit`` or ``edit_plus``
    face_pipeline: PipelineName
    base_name: PipelineName
    processor_backend: str
    #: ``{"dtype": ...}`` or, before diffusers 0.42, ``{"torch_dtype": ...}``
    dtype_kwarg: dict[str, Any] = field(default_factory=dict)
    pipelines: dict[str, Any] = field(default_factory=dict)
    #: diffusers pipelines keep per-call state (timesteps, progress): one call at a time
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the thread that feeds these weights batches (:meth:`batch_worker`)
    worker: BatchWorker | None = None
    worker_lock: threading.Lock = field(default_factory=threading.Lock)

    def batch_worker(self) -> BatchWorker:
        """The one :class:`~counterfactory.generation.editors.qwen_batch.BatchWorker` of these
        weights, started on first use: every editor and thread of the process edits through it."""
        with self.worker_lock:
            if self.worker is None or not self.worker.alive:
                self.worker = BatchWorker(
                    _run_batch, max_queue=WORKER_QUEUE_CHUNKS, name=f"qwen-batch-{self.model_dir.name}"
                )
            return self.worker

    def close_worker(self) -> None:
        with self.worker_lock:
            if self.worker is not None:
                self.worker.close()


def _run_batch(key: tuple, requests: list[EditRequest]) -> list[EditResult]:
    """The batch worker's call: ``key`` is ``(editor, pipeline name, h, w)``."""
    editor, name = key[0], key[1]
    return editor._run(name, requests)


#: Chunks of requests that may wait for the batch worker at once: with a running batch, at
#: most ``(WORKER_QUEUE_CHUNKS + 1) * batch_size`` requests are in flight, however many
#: threads submit, so memory stays flat.
WORKER_QUEUE_CHUNKS = 4

#: Loaded pipelines of this worker process, keyed by :meth:`QwenEditor._cache_key`.
_PIPELINES: dict[tuple, _Loaded] = {}
_PIPELINES_LOCK = threading.Lock()


class QwenEditor:
    """The ``qwen`` backend: Qwen-Image-Edit through diffusers.

    ``edit`` and ``edit_many`` take :class:`EditRequest` s with ``(H, W, 3)`` uint8 RGB
    sources and return ``(h, w, 3)`` uint8 RGB at the pipeline's own size (about 1 MP).
    """

    name = "qwen"

    def __init__(self, options: QwenOptions | None = None) -> None:
        self.options = options or QwenOptions()
        self._loaded: _Loaded | None = None

    @property
    def batch_size(self) -> int:
        """Requests the factory hands over at once (and commits together): ``options.batch_size``."""
        return self.options.batch_size

    # -- lineage -------------------------------------------------------------------------

    def lineage(self) -> dict[str, Any]:
        """Everything about this backend that decides its output (hashed into attempt ids).

        Execution choices that do not change what is computed (batch size, CPU offload,
        compilation, downloading) are left out on purpose, so switching them reuses finished
        attempts; so are settings the configuration never uses (the negative prompt without
        guidance, the inpaint strength when no cell is inpainted). The device *type* is in: a
        CUDA generator draws different noise than a CPU one from the same seed.

        ``revision`` is the configured one until :meth:`prepare` ran, then the resolved one:
        the hub commit of the cached snapshot, or ``folder:<sha256>`` of a local folder's
        config files and file sizes. The factory takes the lineage after ``prepare()``.
        """
        o = self.options
        inpaints = o.pipeline in ("auto", "inpaint")
        return {
            "backend": self.name,
            "model_id": o.model_id,
            # after prepare(): the commit actually loaded, so a refreshed cache makes new attempts
            "revision": self._loaded.model_commit if self._loaded is not None else o.revision,
            "pipeline": o.pipeline,
            "steps": o.steps,
            "true_cfg_scale": o.true_cfg_scale,
            "negative_prompt": o.negative_prompt if o.true_cfg_scale > 1 else None,
            "strength": o.strength if inpaints else None,
            "lightning_lora": o.lightning_lora,
            "lightning_lora_weight_name": o.lightning_lora_weight_name,
            "lora_scale": o.lora_scale if o.lightning_lora else None,
            "scheduler_overrides": dict(sorted(o.scheduler_overrides.items())),
            "dtype": o.dtype,
            "device_type": o.device.split(":")[0],
        }

    def consumes(self, kind: str) -> frozenset[str]:
        """Prompt and seed always; the mask only where the inpaint pipeline runs (limb cells
        under ``auto``, every cell under ``inpaint``); the negative prompt only with guidance."""
        used = {"prompt", "seed"}
        if self.options.pipeline == "inpaint" or (self.options.pipeline == "auto" and kind == "limb"):
            used.add("mask")
        if self.options.true_cfg_scale > 1:
            used.add("negative_prompt")
        return frozenset(used)

    # -- set-up --------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the machine and load the pipeline once per process.

        Raises:
            SetupError: torch/diffusers missing, CUDA asked for but absent, weights or
                LoRA not on this machine, or a model directory diffusers cannot load.
        """
        if self._loaded is not None:
            return
        torch, diffusers = _import_backend()
        _check_device(torch, self.options)
        model_dir, commit = _resolve_model(self.options)
        lora_file = _resolve_lora(self.options)
        key = self._cache_key(model_dir, lora_file)
        with _PIPELINES_LOCK:
            loaded = _PIPELINES.get(key)
            if loaded is None:
                if self.options.device != "cpu":
                    # A second 20B-parameter pipeline rarely fits beside the first: a worker
                    # serves one configuration at a time.
                    for old in _PIPELINES.values():
                        old.close_worker()
                    _PIPELINES.clear()
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                loaded = _load(torch, diffusers, self.options, model_dir, commit, lora_file)
                _PIPELINES[key] = loaded
        self._loaded = loaded

    def _cache_key(self, model_dir: Path, lora_file: Path | None) -> tuple:
        o = self.options
        return (
            str(model_dir.resolve()),
            o.dtype,
            o.device,
            o.cpu_offload,
            o.compile,
            None if lora_file is None else str(lora_file.resolve()),
            o.lora_scale if lora_file is not None else None,
            json.dumps(o.scheduler_overrides, sort_keys=True),
        )

    # -- editing -------------------------------------------------------------------------

    def pipeline_for(self, request: EditRequest) -> PipelineName:
        """The pipeline a request goes through (``prepare()`` must have run for ``auto``)."""
        if self.options.pipeline != "auto":
            return self.options.pipeline
        if request.kind == "limb":
            return "inpaint"
        assert self._loaded is not None, "prepare() first"
        return self._loaded.face_pipeline

    def edit(self, request: EditRequest) -> EditResult:
        """Edit one request; see :meth:`edit_many`."""
        return self.edit_many([request])[0]

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        """Edit requests in batches of ``batch_size`` (same pipeline and source size).

        The requests go to the loaded pipeline's batch worker
        (:mod:`counterfactory.generation.editors.qwen_batch`) in chunks of ``batch_size``;
        chunks of other threads with the same pipeline, size and settings may fill a batch
        that one call leaves short. A call returns when all its requests are done.

        ``journal`` is not used: local generation costs nothing to repeat, so there is no
        remote request id worth keeping before the answer.

        Returns:
            One :class:`EditResult` per request, in order. ``metadata`` holds ``pipeline``
            (diffusers class), ``seed``, ``seconds`` (this item's share of its batch's wall
            time), ``gpu_seconds`` (its share of the batch's GPU-stream time between CUDA
            events, ``None`` on a CPU), ``batch_size``, ``output_size`` ``[w, h]``, ``input_size`` ``[w, h]``,
            ``negative_prompt`` (``None`` without guidance), ``model_commit``, ``device``,
            ``processor_backend`` and library ``versions``.
        """
        self.prepare()
        results: list[EditResult | None] = [None] * len(requests)
        groups: dict[tuple[str, int, int], list[int]] = {}
        for i, request in enumerate(requests):
            name = self.pipeline_for(request)
            problem = _request_problem(request, name)
            if problem is not None:
                results[i] = _failed(request, problem)
                continue
            h, w = request.image.shape[:2]
            groups.setdefault((name, h, w), []).append(i)
        assert self._loaded is not None
        worker = self._loaded.batch_worker()
        submitted = []
        for (name, h, w), indices in groups.items():
            size = 1 if name == "edit_plus" else self.options.batch_size
            for start in range(0, len(indices), size):
                chunk = indices[start : start + size]
                future = worker.submit((self, name, h, w), [requests[i] for i in chunk], max_batch=size)
                submitted.append((chunk, future))
        for chunk, future in submitted:
            for i, result in zip(chunk, future.result(), strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _run(self, name: PipelineName, requests: list[EditRequest]) -> list[EditResult]:
        """One pipeline call; a failed batch is retried item by item to find the culprit."""
        torch = importlib.import_module("torch")
        try:
            return self._call(name, requests)
        except Exception as exc:  # noqa: BLE001 - any per-call error becomes a value
            oom = isinstance(exc, torch.cuda.OutOfMemoryError)
            if oom and torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(requests) > 1:
                return [self._run(name, [r])[0] for r in requests]
            code = "qwen_out_of_memory" if oom else "qwen_pipeline_error"
            return [_failed(requests[0], f"{code}: {type(exc).__name__}: {exc}")]

    def _pipeline(self, name: PipelineName) -> Any:
        loaded = self._loaded
        assert loaded is not None
        if name not in loaded.pipelines:
            diffusers = importlib.import_module("diffusers")
            cls = getattr(diffusers, PIPELINE_CLASSES[name])
            # from_pipe shares the loaded modules (no second copy of the weights) but casts
            # them to float32 unless told the dtype
            pipe = cls.from_pipe(loaded.pipelines[loaded.base_name], **loaded.dtype_kwarg)
            pipe.set_progress_bar_config(disable=True)
            loaded.pipelines[name] = pipe
        return loaded.pipelines[name]

    def _call(self, name: PipelineName, requests: list[EditRequest]) -> list[EditResult]:
        import torch
        from PIL import Image

        o = self.options
        loaded = self._loaded
        assert loaded is not None
        pipe = self._pipeline(name)
        h, w = requests[0].image.shape[:2]
        images = [Image.fromarray(r.image) for r in requests]  # (H, W, 3) uint8 -> RGB
        if name != "edit_plus":
            # diffusers resizes a single PIL source before conditioning on it but passes a
            # list through unresized; resizing here the same way makes a batch compute
            # exactly what one-by-one calls compute.
            calc = importlib.import_module(type(pipe).__module__).calculate_dimensions
            cw, ch = calc(TARGET_AREA_PX, w / h)[:2]
            images = [pipe.image_processor.resize(im, ch, cw) for im in images]
        guided = o.true_cfg_scale > 1
        negatives = [
            (r.negative_prompt if r.negative_prompt is not None else o.negative_prompt) if guided else None
            for r in requests
        ]
        kwargs: dict[str, Any] = {
            "prompt": [r.prompt for r in requests],
            "negative_prompt": negatives if guided else None,
            "true_cfg_scale": o.true_cfg_scale,
            "num_inference_steps": o.steps,
            # one generator per item, seeded from the attempt's seed alone
            "generator": [torch.Generator(o.device).manual_seed(int(r.seed)) for r in requests],
            "output_type": "np",
        }
        if name == "edit_plus":
            kwargs["image"] = images  # one request: its list of reference images
        else:
            kwargs["image"] = images if len(images) > 1 else images[0]
        if name == "inpaint":
            masks = [Image.fromarray(np.ascontiguousarray(r.mask)) for r in requests]  # (H, W) uint8 -> L
            kwargs["mask_image"] = masks if len(masks) > 1 else masks[0]
            kwargs["strength"] = o.strength
        cuda = o.device.startswith("cuda")
        with loaded.lock:
            if cuda:
                # the GPU stream's time from the call's first kernel to its last
                events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                events[0].record()
            start = time.perf_counter()
            output = pipe(**kwargs).images
            seconds = time.perf_counter() - start
            gpu_seconds = None
            if cuda:
                events[1].record()
                events[1].synchronize()
                gpu_seconds = events[0].elapsed_time(events[1]) / 1000.0
        results = []
        for request, negative, array in zip(requests, negatives, output, strict=True):
            meta = {
                "pipeline": type(pipe).__name__,
                "seed": int(request.seed),
                "seconds": round(seconds / len(requests), 4),
                "gpu_seconds": None if gpu_seconds is None else round(gpu_seconds / len(requests), 4),
                "batch_size": len(requests),
                "input_size": [int(w), int(h)],
                "output_size": [int(array.shape[1]), int(array.shape[0])],
                "negative_prompt": negative,
                "model_commit": loaded.model_commit,
                "device": o.device,
                "processor_backend": loaded.processor_backend,
                "versions": _versions(),
            }
            if not np.isfinite(array).all():
                results.append(_failed(request, "qwen_nan_output: the pipeline returned NaN or inf pixels", meta))
                continue
            # the same rounding diffusers uses for its PIL output
            image = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
            results.append(EditResult(attempt_id=request.attempt_id, status="ok", image=image, metadata=meta))
        return results


# -- helpers ----------------------------------------------------------------------------


def _failed(request: EditRequest, reason: str, metadata: dict | None = None) -> EditResult:
    meta = {"seed": int(request.seed)} if metadata is None else metadata
    return EditResult(attempt_id=request.attempt_id, status="failed", reason=reason, metadata=meta)


def _request_problem(request: EditRequest, name: PipelineName) -> str | None:
    """A reason code when the request cannot be edited, else None."""
    image = request.image
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        desc = f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', type(image).__name__)}"
        return f"qwen_bad_request: image must be (H, W, 3) uint8 RGB, got {desc}"
    if min(image.shape[:2]) < 1:
        return f"qwen_bad_request: empty image {image.shape}"
    if name != "inpaint":
        return None
    mask = request.mask
    if mask is None:
        return "qwen_no_mask: the inpaint pipeline needs request.mask (the region to repaint)"
    if not isinstance(mask, np.ndarray) or mask.shape != image.shape[:2] or mask.dtype != np.uint8:
        desc = f"{getattr(mask, 'shape', None)} {getattr(mask, 'dtype', None)}"
        return f"qwen_bad_request: mask must be {image.shape[:2]} uint8, got {desc}"
    if not mask.any():
        return "qwen_no_mask: request.mask is empty, there is nothing to repaint"
    return None


def _optional_import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _import_backend() -> tuple[Any, Any]:
    """``(torch, diffusers)`` or an :class:`SetupError` naming the fix."""
    try:
        import torch
    except ImportError as exc:
        raise SetupError(f"the qwen editor needs torch, which is not installed: {_INSTALL_HINT}") from exc
    try:
        import diffusers
    except ImportError as exc:
        raise SetupError(f"the qwen editor needs diffusers, which is not installed: {_INSTALL_HINT}") from exc
    if importlib.util.find_spec("transformers") is None:
        raise SetupError(
            f"the qwen editor needs transformers (its text encoder), which is not installed: {_INSTALL_HINT}"
        )
    missing = [c for c in PIPELINE_CLASSES.values() if not hasattr(diffusers, c)]
    if missing:
        raise SetupError(
            f"diffusers {getattr(diffusers, '__version__', '?')} lacks {', '.join(missing)}; "
            f"upgrade it: {_INSTALL_HINT}"
        )
    return torch, diffusers


def _check_device(torch: Any, options: QwenOptions) -> None:
    device = options.device
    kind = device.split(":")[0]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise SetupError(
                f"editor.qwen.device is {device!r} but torch sees no CUDA GPU on this machine "
                f"(torch.cuda.is_available() is False, torch {torch.__version__}); run on a GPU "
                "machine, or set editor.qwen.device: cpu for tiny test models"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise SetupError(
                f"editor.qwen.device is {device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    if options.cpu_offload and kind == "cpu":
        raise SetupError("editor.qwen.cpu_offload needs a CUDA device; it means nothing with device: cpu")


def _looks_like_path(name: str) -> bool:
    """True for names that cannot be hub ids (``org/name``), so a missing folder is reported as such."""
    return name.startswith(("/", ".", "~")) or name.count("/") != 1 or "\\" in name


def folder_fingerprint(folder: Path) -> str:
    """``folder:<sha256>`` over every file's relative path and size and the bytes of its JSON
    configs: what tells two local pipeline folders apart without reading gigabytes of weights."""
    digest = hashlib.sha256()
    for item in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = item.relative_to(folder).as_posix()
        digest.update(f"{rel}\0{item.stat().st_size}\0".encode())
        if item.suffix == ".json":
            digest.update(item.read_bytes())
    return f"folder:{digest.hexdigest()}"


def _resolve_model(options: QwenOptions) -> tuple[Path, str | None]:
    """The local folder holding the pipeline and its resolved revision: the hub commit hash, or
    :func:`folder_fingerprint` for a plain folder."""
    model_id, revision = options.model_id, options.revision
    path = Path(model_id).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise SetupError(
                f"{path} has no model_index.json: editor.qwen.model_id must be a diffusers "
                "pipeline folder (save_pretrained output) or a hub id"
            )
        return path, folder_fingerprint(path)
    if _looks_like_path(model_id):
        raise SetupError(
            f"the model directory {model_id!r} does not exist (editor.qwen.model_id must be an "
            "existing save_pretrained folder or a hub id such as Qwen/Qwen-Image-Edit-2509)"
        )
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(model_id, revision=revision, local_files_only=not options.download))
    except Exception as exc:  # noqa: BLE001 - hub errors have many types; all mean "not here"
        rev = f" --revision {revision}" if revision else ""
        how = "is not in the Hugging Face cache on this machine" if not options.download else "could not be downloaded"
        raise SetupError(
            f"{model_id}{'@' + revision if revision else ''} {how} ({type(exc).__name__}); "
            f"run `hf download {model_id}{rev}` first, or set editor.qwen.download: true"
        ) from exc
    if not (folder / "model_index.json").is_file():
        raise SetupError(f"{model_id} in the Hugging Face cache has no model_index.json: not a diffusers pipeline")
    return folder, folder.name


def _resolve_lora(options: QwenOptions) -> Path | None:
    """The local ``.safetensors`` file of the LoRA, or None without one."""
    name, weight = options.lightning_lora, options.lightning_lora_weight_name
    if not name:
        return None
    if importlib.util.find_spec("peft") is None:
        raise SetupError(f"editor.qwen.lightning_lora needs peft, which is not installed: {_INSTALL_HINT}")
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        candidate = path / (weight or "pytorch_lora_weights.safetensors")
        if not candidate.is_file():
            raise SetupError(f"LoRA folder {path} has no {candidate.name}; set editor.qwen.lightning_lora_weight_name")
        return candidate
    if _looks_like_path(name) or name.endswith(".safetensors"):
        raise SetupError(f"the LoRA file {name!r} does not exist (editor.qwen.lightning_lora)")
    if not weight:
        raise SetupError(
            f"editor.qwen.lightning_lora {name!r} is a hub repo: set lightning_lora_weight_name to "
            "the .safetensors file in it (e.g. Qwen-Image-Edit-2509-Lightning-8steps-V1.0-bf16.safetensors)"
        )
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(name, weight, local_files_only=not options.download))
    except Exception as exc:  # noqa: BLE001
        raise SetupError(
            f"LoRA {name}/{weight} is not in the Hugging Face cache ({type(exc).__name__}); "
            f"run `hf download {name} {weight}` first, or set editor.qwen.download: true"
        ) from exc


@functools.cache
def _image_only_processor_class() -> type:
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2-VL processor without its video half (which needs torchvision)."""

        def __init__(
            self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any
        ):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlyQwen2VLProcessor


def _load_processor(model_dir: Path) -> tuple[dict[str, Any], str]:
    """Keyword overrides for ``from_pretrained`` and the image-processor backend in use."""
    if importlib.util.find_spec("torchvision") is not None:
        return {}, "torchvision"
    from transformers import AutoImageProcessor, AutoTokenizer

    folder = model_dir / "processor"
    image_processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    processor = _image_only_processor_class()(image_processor=image_processor, tokenizer=tokenizer)
    return {"processor": processor}, "pil"


def _load(
    torch: Any,
    diffusers: Any,
    options: QwenOptions,
    model_dir: Path,
    commit: str | None,
    lora_file: Path | None,
) -> _Loaded:
    try:
        class_name = json.loads((model_dir / "model_index.json").read_text()).get("_class_name", "")
    except (OSError, ValueError, AttributeError) as exc:
        raise SetupError(f"{model_dir / 'model_index.json'} is unreadable: {exc}") from exc
    by_class = {v: k for k, v in PIPELINE_CLASSES.items()}
    base_name: PipelineName = by_class.get(class_name, "edit")  # type: ignore[assignment]
    face_pipeline: PipelineName = "edit_plus" if class_name == PIPELINE_CLASSES["edit_plus"] else "edit"
    where = f"{options.model_id} ({model_dir})"
    dtype_kwarg = {_dtype_keyword(diffusers): getattr(torch, options.dtype)}
    try:
        overrides, backend = _load_processor(model_dir)
        cls = getattr(diffusers, PIPELINE_CLASSES[base_name])
        pipe = cls.from_pretrained(model_dir, local_files_only=True, **dtype_kwarg, **overrides)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        rev = f" --revision {options.revision}" if options.revision else ""
        raise SetupError(
            f"diffusers could not load {where}: {type(exc).__name__}: {exc}. If the download is "
            f"incomplete, run `hf download {options.model_id}{rev}` again"
        ) from exc
    if options.scheduler_overrides:
        # from_config ignores unknown keys silently; a typo must not go unnoticed
        unknown = sorted(set(options.scheduler_overrides) - set(pipe.scheduler.config))
        if unknown:
            valid = ", ".join(sorted(pipe.scheduler.config))
            raise SetupError(
                f"editor.qwen.scheduler_overrides has keys {unknown} that "
                f"{type(pipe.scheduler).__name__} does not have; valid: {valid}"
            )
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, **options.scheduler_overrides)
    if lora_file is not None:
        try:
            pipe.load_lora_weights(str(lora_file), adapter_name="lightning")
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise SetupError(f"could not load the LoRA {lora_file}: {type(exc).__name__}: {exc}") from exc
        # fused and unloaded: the LoRA costs nothing per step afterwards
        pipe.fuse_lora(lora_scale=options.lora_scale, adapter_names=["lightning"])
        pipe.unload_lora_weights()
    if options.cpu_offload:
        pipe.enable_model_cpu_offload(device=options.device)
    else:
        pipe.to(options.device)
    if options.compile:
        pipe.transformer.compile_repeated_blocks(fullgraph=True)
    pipe.set_progress_bar_config(disable=True)
    loaded = _Loaded(
        model_dir=model_dir,
        model_commit=commit,
        face_pipeline=face_pipeline,
        base_name=base_name,
        processor_backend=backend,
        dtype_kwarg=dtype_kwarg,
    )
    loaded.pipelines[base_name] = pipe
    return loaded


def _dtype_keyword(diffusers: Any) -> str:
    """diffusers 0.42 renamed ``torch_dtype`` to ``dtype`` (the old name warns)."""
    from packaging.version import Version

    return "dtype" if Version(diffusers.__version__).release >= (0, 42) else "torch_dtype"


@functools.cache
def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "diffusers", "transformers"):
        module = _optional_import(name)
        out[name] = getattr(module, "__version__", "?") if module is not None else "missing"
    return out


__all__ = ["PIPELINE_CLASSES", "QwenEditor", "QwenOptions", "TARGET_AREA_PX"]


EDITORS.register(
    "qwen",
    QwenOptions,
    QwenEditor,
    capabilities=EditorCapabilities(batch_size=lambda options: options.batch_size, limit="gpu", resources=device_gpus),
)
