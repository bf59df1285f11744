"""SAM-assisted limb masks: a box or a few clicks around a limb give a binary mask.

Segment Anything (Kirillov et al., "Segment Anything", ICCV 2023) through Meta's
``segment-anything`` package: ``sam_model_registry[model_type](checkpoint=...)`` builds the
model and loads a user-supplied checkpoint, ``SamPredictor`` embeds the image once and
decodes masks from prompts. The model is loaded once per worker process and per
(checkpoint, model type, device); the last image's embedding is kept, so several prompts on
one photo pay for the image encoder once.

Conventions are those of :mod:`counterfactory.generation.masks`: masks are ``(H, W)`` ``uint8`` with 255
inside and 0 outside; coordinates are continuous pixels, x right and y down, and pixel
``(col, row)`` counts as inside a box when its centre ``(col + 0.5, row + 0.5)`` is.

Why a stand-in for torchvision: ``segment_anything`` imports torchvision at import time for
two helpers (a PIL bilinear resize and ``to_pil_image``, used by ``SamPredictor.set_image``)
and for the automatic mask generator's NMS, which this module does not use. Where torchvision
is missing (CPU machines with the CPU build of torch), the import runs with a temporary
module giving the same two PIL operations; it is removed from ``sys.modules`` right after,
so nothing else ever sees it. With torchvision installed the real one is used.

Masks a study uses are drawn once and stored (:func:`store_sam_masks`, the ``counterfactory masks``
command): a source record asks for one with ``limb_mask: {sam: {box: [x0, y0, x1, y1]}}``, the
mask is written as a PNG under the photos folder's ``sam_masks/`` (with a JSON note of the
prompt, checkpoint sha256 and model type beside it), and a run reads that PNG like any mask
file. Attempt ids hash the mask's pixels, so a run never depends on a SAM call, its device or
its version, and a person may correct a stored mask by hand.

Checkpoints (download once, pass the path): ``vit_h`` sam_vit_h_4b8939.pth, ``vit_l``
sam_vit_l_0b3195.pth, ``vit_b`` sam_vit_b_01ec64.pth, from
https://github.com/facebookresearch/segment-anything#model-checkpoints.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image

from counterfactory.generation.errors import SourceError
from counterfactory.generation.images import DEFAULT_MAX_PIXELS, load_image
from counterfactory.generation.masks import MaskError, load_mask_file
from counterfactory.generation.metadata import load_metadata
from counterfactory.generation.records import SamMask, sam_mask_file
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.safefiles import sha256_file

_INSTALL_HINT = "pip install 'counterfactory[sam]'"

#: Released checkpoint file of each model type, for error messages.
CHECKPOINT_FILES = {
    "vit_h": "sam_vit_h_4b8939.pth",
    "vit_l": "sam_vit_l_0b3195.pth",
    "vit_b": "sam_vit_b_01ec64.pth",
}


@dataclass
class _Predictor:
    predictor: Any
    #: sha1 of the image whose embedding the predictor holds
    image_key: str | None = None
    #: SamPredictor keeps the current image's embedding: one prompt at a time
    lock: threading.Lock = field(default_factory=threading.Lock)


_PREDICTORS: dict[tuple[str, str, str], _Predictor] = {}
_PREDICTORS_LOCK = threading.Lock()
_IMPORT_LOCK = threading.Lock()


def clear_sam_cache() -> None:
    """Drop every SAM model this process loaded."""
    with _PREDICTORS_LOCK:
        _PREDICTORS.clear()


def sam_mask(
    image: np.ndarray,
    *,
    box: Sequence[float] | np.ndarray | None = None,
    points: Sequence[Sequence[float]] | np.ndarray | None = None,
    point_labels: Sequence[int] | np.ndarray | None = None,
    checkpoint: str | Path,
    model_type: str = "vit_b",
    multimask: bool = False,
    clip_to_box: bool = True,
    device: str | None = None,
) -> np.ndarray:
    """Segment the object that a box and/or points indicate.

    Args:
        image: ``(H, W, 3)`` ``uint8`` RGB.
        box: ``[x0, y0, x1, y1]`` in pixels, ``x0 < x1`` and ``y0 < y1``, overlapping the image.
        points: ``(N, 2)`` ``(x, y)`` pixel coordinates of clicks.
        point_labels: ``(N,)`` 1 for a click on the object, 0 for one on the background;
            all 1 when omitted.
        checkpoint: path to a ``segment-anything`` checkpoint (a state dict ``.pth``).
        model_type: a key of ``segment_anything.sam_model_registry`` matching the checkpoint.
        multimask: let SAM propose three masks and keep the one with the highest predicted
            IoU (better for ambiguous single clicks); otherwise SAM's single mask.
        clip_to_box: set everything outside ``box`` to 0 (a box drawn around a limb bounds it).
        device: ``cuda``, ``cuda:N`` or ``cpu``; default CUDA when available.

    Returns:
        ``(H, W)`` ``uint8`` mask, 255 inside and 0 outside.

    Raises:
        MaskError: a malformed image or prompt.
        SetupError: segment-anything or torch missing, checkpoint missing or not of
            ``model_type``, CUDA asked for but absent.
    """
    _check_image(image)
    h, w = image.shape[:2]
    box_arr = _check_box(box, (h, w))
    coords, labels = _check_points(points, point_labels)
    if box_arr is None and coords is None:
        raise MaskError("sam_mask needs a box, points, or both")
    entry = load_sam_predictor(checkpoint, model_type=model_type, device=device)
    import torch

    key = hashlib.sha1(np.ascontiguousarray(image).data, usedforsecurity=False).hexdigest() + str(image.shape)
    with entry.lock, torch.inference_mode():
        if entry.image_key != key:
            entry.predictor.set_image(image, image_format="RGB")
            entry.image_key = key
        masks, scores, _ = entry.predictor.predict(
            point_coords=coords, point_labels=labels, box=box_arr, multimask_output=multimask
        )
    best = int(np.argmax(scores)) if multimask else 0
    out = masks[best].astype(np.uint8) * 255
    if clip_to_box and box_arr is not None:
        out &= box_region(box_arr, (h, w))
    return out


@dataclass(frozen=True)
class StoredSamMask:
    """What :func:`store_sam_masks` did for one source whose record asks SAM for its limb mask.

    Attributes:
        source_id: the record's id.
        path: the stored mask PNG (absolute), where runs read it.
        status: ``written`` (drawn now), ``kept`` (already stored for this prompt and photo:
            left as it is, hand corrections included) or ``failed`` (see ``reason``).
        inside_share: share of the photo's pixels inside the mask, in [0, 1] (None if failed).
        reason: why it failed and how to fix it.
    """

    source_id: str
    path: Path
    status: Literal["written", "kept", "failed"]
    inside_share: float | None = None
    reason: str | None = None


def store_sam_masks(
    photos_dir: str | Path,
    metadata_path: str | Path,
    *,
    checkpoint: str | Path,
    model_type: str = "vit_b",
    device: str | None = None,
    force: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> list[StoredSamMask]:
    """Draw and store the limb mask of every record with ``limb_mask: {sam: ...}``.

    Each mask is SAM's answer to the record's prompt on the upright photo, clipped to the box
    (:func:`sam_mask`), written as an 8-bit PNG (255 inside) to
    ``photos_dir / sam_mask_file(id, prompt)``, with a JSON note beside it (``.json``: source
    sha256, prompt, checkpoint path and sha256, model type, mask sha256). The note is written
    first and the PNG renamed into place last, so a crash leaves no half mask. A PNG already
    stored is kept (a person may have corrected it) unless ``force``, or unless its note says
    it was drawn on another photo.

    Args:
        photos_dir: the spec's photos folder (record paths and mask files are relative to it).
        metadata_path: the spec's metadata file.
        checkpoint, model_type, device: as for :func:`sam_mask`.
        force: redraw masks that are already stored.
        max_pixels: as for :func:`~counterfactory.generation.images.load_image`.

    Returns:
        One :class:`StoredSamMask` per record that asks for a SAM mask, in metadata order; a
        photo that cannot be read or a prompt outside it is a ``failed`` item, not an error.

    Raises:
        MetadataError: the metadata file is broken.
        SetupError: SAM cannot run here (segment-anything or torch missing, bad checkpoint).
    """
    folder = Path(photos_dir).resolve()
    out: list[StoredSamMask] = []
    checkpoint_sha: str | None = None
    for record in load_metadata(metadata_path):
        if not isinstance(record.limb_mask, SamMask):
            continue
        prompt = record.limb_mask.sam
        target = (folder / sam_mask_file(record.id, prompt)).resolve()
        photo = (folder / record.path).resolve()
        if not photo.is_relative_to(folder) or not target.is_relative_to(folder):
            out.append(StoredSamMask(record.id, target, "failed", reason=f"{record.path}: outside {folder}"))
            continue
        try:
            loaded = load_image(photo, max_pixels=max_pixels)
        except SourceError as exc:
            out.append(StoredSamMask(record.id, target, "failed", reason=exc.reason))
            continue
        note_path = target.with_suffix(".json")
        if target.is_file() and not force and _drawn_on(note_path) in (None, loaded.sha256):
            try:
                kept = load_mask_file(target, loaded.pixels.shape[:2])
            except MaskError as exc:
                out.append(StoredSamMask(record.id, target, "failed", reason=f"{exc}; delete it or use --force"))
                continue
            out.append(StoredSamMask(record.id, target, "kept", float((kept > 0).mean())))
            continue
        try:
            mask = sam_mask(
                loaded.pixels,
                box=prompt.box,
                points=prompt.points,
                point_labels=prompt.point_labels,
                checkpoint=checkpoint,
                model_type=model_type,
                device=device,
            )
        except MaskError as exc:
            out.append(StoredSamMask(record.id, target, "failed", reason=f"SAM prompt: {exc}"))
            continue
        if checkpoint_sha is None:
            checkpoint_sha = sha256_file(Path(checkpoint))
        note = {
            "source_id": record.id,
            "source_sha256": loaded.sha256,
            "prompt": prompt.model_dump(mode="json"),
            "checkpoint": Path(checkpoint).name,
            "checkpoint_sha256": checkpoint_sha,
            "model_type": model_type,
            "mask_sha256": hashlib.sha256(np.ascontiguousarray(mask).data).hexdigest(),
        }
        _write_mask(target, note_path, mask, note)
        out.append(StoredSamMask(record.id, target, "written", float((mask > 0).mean())))
    return out


def _drawn_on(note_path: Path) -> str | None:
    """The source sha256 a stored mask's note names (None: no readable note, a hand-made mask)."""
    try:
        return json.loads(note_path.read_text())["source_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_mask(target: Path, note_path: Path, mask: np.ndarray, note: dict[str, Any]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_note = note_path.with_name(f".{note_path.name}.tmp")
    tmp_note.write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_note, note_path)
    tmp = target.with_name(f".{target.name}.tmp")
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8)).save(tmp, format="PNG")
    os.replace(tmp, target)


def box_region(box: Sequence[float] | np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` ``uint8``: 255 on pixels whose centres lie inside ``[x0, y0, x1, y1]``."""
    x0, y0, x1, y1 = (float(v) for v in box)
    cols = np.arange(shape[1]) + 0.5
    rows = np.arange(shape[0]) + 0.5
    inside = ((rows >= y0) & (rows <= y1))[:, None] & ((cols >= x0) & (cols <= x1))[None, :]
    return inside.astype(np.uint8) * 255


def load_sam_predictor(checkpoint: str | Path, *, model_type: str = "vit_b", device: str | None = None) -> _Predictor:
    """The cached ``SamPredictor`` for a checkpoint (loaded on first use in this process).

    Raises:
        SetupError: see :func:`sam_mask`.
    """
    torch = _import_torch()
    sam = import_segment_anything()
    device = _resolve_device(torch, device)
    registry = sam.sam_model_registry
    if model_type not in registry:
        raise SetupError(f"unknown SAM model_type {model_type!r}; valid: {', '.join(sorted(registry))}")
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        wanted = CHECKPOINT_FILES.get(model_type, "the checkpoint")
        raise SetupError(
            f"the SAM checkpoint {str(checkpoint)!r} does not exist; download {wanted} from "
            "https://github.com/facebookresearch/segment-anything#model-checkpoints and pass its path"
        )
    key = (str(path.resolve()), model_type, device)
    with _PREDICTORS_LOCK:
        entry = _PREDICTORS.get(key)
        if entry is None:
            try:
                model = registry[model_type](checkpoint=str(path))
            except RuntimeError as exc:  # load_state_dict: missing/unexpected keys, shapes
                raise SetupError(
                    f"{path} is not a {model_type} SAM checkpoint ({str(exc).splitlines()[0]}); "
                    f"check model_type (valid: {', '.join(sorted(registry))})"
                ) from exc
            except Exception as exc:  # noqa: BLE001 - torch.load's errors vary by version
                raise SetupError(f"could not read the SAM checkpoint {path}: {type(exc).__name__}: {exc}") from exc
            model.to(device).eval()
            entry = _Predictor(predictor=sam.SamPredictor(model))
            _PREDICTORS[key] = entry
    return entry


def import_segment_anything() -> types.ModuleType:
    """``segment_anything``, imported without torchvision where that is missing.

    Raises:
        SetupError: segment-anything is not installed.
    """
    if "segment_anything" in sys.modules and sys.modules["segment_anything"] is not None:
        return sys.modules["segment_anything"]
    if _find_spec("segment_anything") is None:
        raise SetupError(f"SAM masks need segment-anything, which is not installed: {_INSTALL_HINT}")
    with _IMPORT_LOCK:
        if _find_spec("torchvision") is not None:
            return importlib.import_module("segment_anything")
        with _torchvision_stand_in():
            return importlib.import_module("segment_anything")


# -- helpers ----------------------------------------------------------------------------


def _find_spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ValueError, ImportError):
        return None


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise SetupError(f"SAM masks need torch, which is not installed: {_INSTALL_HINT}") from exc
    return torch


def _resolve_device(torch: Any, device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.split(":")[0] == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"device {device!r} asked for but torch sees no CUDA GPU; use device='cpu'")
    return device


def _check_image(image: Any) -> None:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        desc = f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', type(image).__name__)}"
        raise MaskError(f"image must be (H, W, 3) uint8 RGB, got {desc}")
    if min(image.shape[:2]) < 1:
        raise MaskError(f"image is empty: {image.shape}")


def _check_box(box: Any, shape: tuple[int, int]) -> np.ndarray | None:
    if box is None:
        return None
    arr = np.asarray(box, dtype=np.float64).reshape(-1)
    if arr.shape != (4,) or not np.isfinite(arr).all():
        raise MaskError(f"box must be 4 finite numbers [x0, y0, x1, y1], got {box!r}")
    x0, y0, x1, y1 = arr
    if not (x0 < x1 and y0 < y1):
        raise MaskError(f"box must have x0 < x1 and y0 < y1, got {arr.tolist()}")
    h, w = shape
    if x1 <= 0 or y1 <= 0 or x0 >= w or y0 >= h:
        raise MaskError(f"box {arr.tolist()} lies outside the {w} x {h} image")
    return arr


def _check_points(points: Any, labels: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    if points is None:
        if labels is not None:
            raise MaskError("point_labels given without points")
        return None, None
    coords = np.asarray(points, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[1] != 2 or len(coords) == 0 or not np.isfinite(coords).all():
        raise MaskError(f"points must be (N, 2) finite (x, y) pixel coordinates, got shape {coords.shape}")
    if labels is None:
        return coords, np.ones(len(coords), dtype=np.int64)
    lab = np.asarray(labels).reshape(-1)
    if lab.shape != (len(coords),) or not np.isin(lab, (0, 1)).all():
        raise MaskError(f"point_labels must be {len(coords)} values of 0 or 1, got {np.asarray(labels).tolist()}")
    return coords, lab.astype(np.int64)


def _pil_resize(image: Any, size: Sequence[int]) -> Any:
    """torchvision's ``resize`` on a PIL image with a ``(h, w)`` size: PIL bilinear."""
    from PIL import Image

    h, w = (int(v) for v in size)
    return image.resize((w, h), Image.BILINEAR)


def _to_pil_image(array: np.ndarray) -> Any:
    """torchvision's ``to_pil_image`` for an ``(H, W, 3)`` uint8 array."""
    from PIL import Image

    return Image.fromarray(np.asarray(array))


def _needs_torchvision(*_: Any, **__: Any) -> Any:
    raise ImportError("SamAutomaticMaskGenerator needs torchvision (its NMS); sam_mask does not")


@contextlib.contextmanager
def _torchvision_stand_in() -> Iterator[None]:
    """Temporarily provide the names segment_anything imports from torchvision."""
    names = {
        "torchvision": {},
        "torchvision.transforms": {},
        "torchvision.transforms.functional": {"resize": _pil_resize, "to_pil_image": _to_pil_image},
        "torchvision.ops": {},
        "torchvision.ops.boxes": {"batched_nms": _needs_torchvision, "box_area": _needs_torchvision},
    }
    added = {}
    for name, attrs in names.items():
        module = types.ModuleType(name, "stand-in for torchvision while segment_anything imports")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__dict__.update(attrs)
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(added[parent], child, module)
        else:
            module.__path__ = []  # a package, so its submodules resolve
        added[name] = module
    for name in ("torchvision.transforms", "torchvision.ops"):
        added[name].__path__ = []
    absent = object()
    saved = {name: sys.modules.get(name, absent) for name in added}
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if sys.modules.get(name) is added[name]:
                if previous is absent:
                    del sys.modules[name]
                else:
                    sys.modules[name] = previous


__all__ = [
    "CHECKPOINT_FILES",
    "box_region",
    "StoredSamMask",
    "clear_sam_cache",
    "import_segment_anything",
    "load_sam_predictor",
    "sam_mask",
    "store_sam_masks",
]
