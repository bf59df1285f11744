"""Named edit regions: what part of the person a prompt asks the editor to change.

One definition serves both ends: a prompt template names its region
(``assets/prompts/regions.yaml``, read by :func:`template_region`), and the mask builder
(:func:`counterfactory.validation.faces.region_mask`) draws that region from the face mesh and
the person segmentation. The gates measure "body skin" *outside* it: a prompt that asks for the
face and neck must not have its neck counted as skin that should not have changed.

``face_only_v1`` ("change only the facial features, skin tone of the face and neck, and facial
hair") names ``face_neck_ears``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from counterfactory.assets import PROMPTS_DIR
from counterfactory.manifests.errors import SetupError


@dataclass(frozen=True)
class EditRegion:
    """One named region.

    Attributes:
        name: the registry key (``face``, ``face_neck_ears``, ``all_visible_skin``).
        description: what a prompt naming it asks for.
        neck: the neck below the jaw belongs to it.
        ears: the ears beside the face oval belong to it.
        facial_hair: the oval's border (beard, moustache, sideburns) grown outward belongs to it.
        forehead: the forehead above the mesh's top edge, up to the hairline, belongs to it
            (the mesh stops short of the hairline; a tone change that stops there shows a seam).
        all_skin: every pixel of the person belongs to it (body skin is then empty).
    """

    name: str
    description: str
    neck: bool = False
    ears: bool = False
    facial_hair: bool = False
    forehead: bool = False
    all_skin: bool = False


#: the regions a prompt may name
REGIONS: dict[str, EditRegion] = {
    r.name: r
    for r in (
        EditRegion("face", "the face-mesh oval only, forehead to chin"),
        EditRegion(
            "face_neck_ears",
            "the face (forehead to chin), the neck, the ears and the facial-hair area",
            neck=True,
            ears=True,
            facial_hair=True,
            forehead=True,
        ),
        EditRegion("all_visible_skin", "the face and every visible part of the person", all_skin=True),
    )
}
#: a template that names no region edits the face oval only
DEFAULT_REGION = "face"
#: the file that maps template names to region names, next to the templates
REGIONS_FILE = "regions.yaml"


def get_region(name: str) -> EditRegion:
    """The :class:`EditRegion` called ``name``; raises ``ValueError`` naming the known ones."""
    try:
        return REGIONS[name]
    except KeyError:
        raise ValueError(f"unknown edit region {name!r}; known regions: {', '.join(sorted(REGIONS))}") from None


@functools.lru_cache(maxsize=64)
def _resolved(folder: str) -> str:
    """``folder`` resolved, once per folder (every cell's prompt asks; a resolve is a syscall per part)."""
    return str(Path(folder).resolve())


@functools.lru_cache(maxsize=16)
def _region_map(folder: str) -> Mapping[str, str]:
    """``regions.yaml`` of ``folder`` as a read-only mapping (the cached value is shared by
    every caller: a caller cannot change what the next one reads)."""
    path = Path(folder) / REGIONS_FILE
    if not path.is_file():
        return MappingProxyType({})
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SetupError(f"{path} must map template names to region names, got {type(data).__name__}")
    for template, region in data.items():
        if region not in REGIONS:
            raise SetupError(
                f"{path}: template {template!r} names unknown edit region {region!r}; known: {', '.join(sorted(REGIONS))}"
            )
    return MappingProxyType({str(k): str(v) for k, v in data.items()})


def template_region(template: str, directory: Path | None = None) -> str:
    """The region name the prompt template ``template`` asks the editor to change.

    Looked up in ``regions.yaml`` of ``directory`` (a spec's own prompt folder) first, then of
    the bundled ``assets/prompts``; :data:`DEFAULT_REGION` when neither names it.
    """
    for folder in [d for d in (directory, PROMPTS_DIR) if d is not None]:
        found = _region_map(_resolved(str(folder))).get(template)
        if found is not None:
            return found
    return DEFAULT_REGION
