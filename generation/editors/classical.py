"""The ``classical`` backend: a CPU editor for demos and pipeline tests. Demo quality.

It makes **no** demographic change of features and claims none. It exists so that every later
stage (alignment, gates, review, release) runs for real on a laptop with no GPU and no network:

- face cells: a skin-tone shift toward a real donor face of the requested group, inside the
  edit region the factory passes in ``EditRequest.mask`` (the region the prompt names:
  ``face_only_v1`` asks for face, neck, ears and facial hair). The donors are the 82 people of
  the Face Research Lab London Set (CC BY 4.0), each summarised by the median CIELAB and
  spread of their face skin (``assets/models/donor_skin_tones.json``); the skin inside the
  region (pixels near the region's own skin colour: not the eyes, brows, hair, lips or a
  collar) is moved to the donor's lightness, lightness spread and chroma (Reinhard et al.,
  "Color Transfer between Images", 2001), and its chroma half-way toward the donor's (the set's
  studio white balance is not the photo's), feathered at the region's edge. Features, shape
  and expression are the source's: the face stays recognisable, and only its tone follows the
  condition. The donor is a person of the requested race and gender (race alone when the set
  has none of both), the seed-th in the set's order; a race the set does not hold (FOCUS's
  "Latino") takes a person of the requested gender at an offset fixed by its label, and the
  attempt's metadata (``donor_match``) says so (:func:`pick_donor`);
- limb cells, by the cue (InclusiveCFImageBias): a treatment (``cue=removed``, any cue but a
  control's) is OpenCV inpainting (Telea 2004) inside the limb mask, the cue erased; the
  same-cue control (``cue=kept``, :data:`LIMB_CONTROL_CUES`: "re-inpainted with the cue kept
  visible", the paper's check against inpainting residue) is the image through the re-render
  below, the cue's pixels re-synthesised as a real inpainting editor returns a region it was
  asked to keep. Before lineage version 4 a control was inpainted as well: it was the
  treatment's image, cue erased. With ``rerender`` off a control comes back as the source
  (the CPU editor has no other way to re-synthesise a region it must keep; Telea would erase
  the cue), so its mask region is unchanged (the locality gate sends such a control to review:
  a copy carries none of the treatment's inpainting). The attempt's ``limb_fill`` says which
  (``telea``, ``rerender`` or ``copy``).

Then, for face cells (``rerender``, on by default), the whole image goes through a real
pretrained latent autoencoder (TAEF2, :mod:`counterfactory.generation.rerender`), as every
diffusion editor's decoder does: the pixels it was told to keep come back re-synthesised, so
the gates meet what real editors return. Limb cells are composited by the factory (every
pixel outside the mask copied back): a treatment is not re-rendered, and of a control only the
mask's re-rendered pixels are kept.

Like the diffusers pipelines, it returns its output resized to a multiple of
``output_multiple`` pixels, so the factory's alignment has real work to undo. For real
datasets use the ``qwen`` (local GPU) or ``fal`` (Nano Banana) backends.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, ClassVar

import cv2
import numpy as np
from pydantic import ConfigDict, Field

from counterfactory.assets import MODELS_DIR
from counterfactory.generation.editors.base import EditorOptions, EditRequest, EditResult, SequentialEditor
from counterfactory.generation.editors.registry import EDITORS
from counterfactory.generation.masks import feather


class ClassicalOptions(EditorOptions):
    """Options of the ``classical`` backend (``editor.classical`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    #: what a release made with this backend must say first among its limitations (the Hub
    #: card, :func:`~counterfactory.manifests.hub_card.card_body`): a backend declares it, the
    #: card never names one
    release_caveat: ClassVar[str] = (
        "Made with the `classical` demo editor, which paints a tone inside the face mask and makes "
        "NO real demographic change: use it to exercise pipelines, not to study bias."
    )

    #: how far toward the donor's tone (1: all the way)
    strength: float = Field(0.85, ge=0.0, le=1.0)
    feather_px: float = Field(6.0, ge=0.0)
    inpaint_radius_px: float = Field(5.0, gt=0.0)
    #: resize outputs to a multiple of this many pixels (as diffusers does); 0 keeps the size.
    output_multiple: int = Field(16, ge=0)
    #: face cells: re-render the whole edited image through TAEF2, as a real editor's decoder does
    rerender: bool = True
    #: the re-render's long side at most (the output stays at that size, as an editor returns
    #: its own resolution); None: the source's own size (slower: cost grows with pixels)
    rerender_max_side: int | None = Field(512, ge=64)


DONOR_TONES = MODELS_DIR / "donor_skin_tones.json"
#: the share of the donor's chroma (a*, b*) offset applied, and its largest size per axis: the
#: London set's studio white balance is not the photo's, so chroma moves only part of the way
CHROMA_SHARE = 0.5
MAX_CHROMA_SHIFT = 6.0
#: the feather at the region's edge grows with the region: this share of sqrt(area) at least
FEATHER_SHARE = 0.03
#: the donor's lightness spread is taken only within this factor of the face's own
SPREAD_RANGE = (0.75, 1.33)


@functools.cache
def donor_tones() -> tuple[dict[str, Any], ...]:
    """The donors of ``assets/models/donor_skin_tones.json``: ``{id, race, gender,
    lab_median, lab_std}`` each (race and gender as the London set's labels)."""
    return tuple(json.loads(DONOR_TONES.read_text())["donors"])


def _key(value: str) -> str:
    return "_".join(str(value).casefold().replace("-", " ").split())


_GENDERS = {"man": "male", "woman": "female", "men": "male", "women": "female"}

#: study labels that name one of the London set's groups under another name: FOCUS's "Asian"
#: (its examples are East Asian faces) and "Middle Eastern" (the set's ``west_asian``: Arab,
#: Persian, Turkish and Levantine people), and the usual synonyms. A label neither here nor in
#: the set (FOCUS's "Latino", "South Asian") has no donor of its own: see :func:`pick_donor`.
RACE_ALIASES = {
    "asian": "east_asian",
    "middle_eastern": "west_asian",
    "arab": "west_asian",
    "mena": "west_asian",
    "african": "black",
    "african_american": "black",
    "caucasian": "white",
    "european": "white",
}


def _pool_offset(label: str) -> int:
    """A fixed offset into a shared donor pool for a group label with no donors of its own, so
    that two such groups (or such a group and everyone) do not get the same donor for a seed."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:4], "big")


def pick_donor(condition: dict[str, str], seed: int) -> dict[str, Any]:
    """The donor for ``condition`` (axes ``race`` and ``gender``, matched case- and
    space-insensitively to the set's labels, through :data:`RACE_ALIASES`) and ``seed``, with
    ``match``: how it was found.

    Of the group (race and gender: ``match`` ``"race+gender"``; else race: ``"race"``), the
    seed-th in the set's order. A race the set does not hold takes a donor of the requested
    gender (``"gender"``; everyone: ``"any"``), at an offset fixed by the race's label, so that
    two such races, or two genders, never share every donor: before, they all fell back to the
    same person, and several conditions of one source came back as one image.
    """
    donors = sorted(donor_tones(), key=lambda d: d["id"])  # each pool in the set's order
    race = _key(condition.get("race", ""))
    race = RACE_ALIASES.get(race, race)
    gender = _key(condition.get("gender", ""))
    gender = _GENDERS.get(gender, gender)
    for match, pool, offset in (
        ("race+gender", [d for d in donors if d["race"] == race and d["gender"] == gender], 0),
        ("race", [d for d in donors if d["race"] == race], 0),
        ("gender", [d for d in donors if d["gender"] == gender], _pool_offset(race)),
        ("any", list(donors), _pool_offset(f"{race}/{gender}")),
    ):
        if pool:
            return {**pool[(seed + offset) % len(pool)], "match": match}
    raise ValueError("the donor set is empty")  # pragma: no cover - the bundled set has 82


def _skin_weight(lab: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(weight, median, spread)``: each pixel's closeness in [0, 1] to the skin colour of the
    region ``inside`` (a Gaussian in robust a*, b* and lightness units about the region's
    median), and the median and robust spread of the region's skin-like pixels."""
    pixels = lab[inside]
    med = np.median(pixels, axis=0)
    sd = np.maximum(1.4826 * np.median(np.abs(pixels - med), axis=0), [4.0, 2.0, 2.0])
    z = (lab - med) / (2.5 * sd)
    weight = np.exp(-0.5 * (z[..., 1] ** 2 + z[..., 2] ** 2 + np.minimum(z[..., 0], 0.0) ** 2))
    skin = pixels[weight[inside] > 0.5]
    if skin.shape[0] >= 50:
        med = np.median(skin, axis=0)
        sd = np.maximum(1.4826 * np.median(np.abs(skin - med), axis=0), [1.0, 0.5, 0.5])
    return weight.astype(np.float32), med, sd


def donor_tone_shift(
    image: np.ndarray, mask: np.ndarray, condition: dict[str, str], seed: int, *, strength: float, feather_px: float
) -> tuple[np.ndarray, dict[str, Any]]:
    """``(edited, facts)``: the skin inside ``mask`` moved toward a donor's tone (module
    docstring). ``image`` ``(H, W, 3)`` uint8 RGB, ``mask`` ``(H, W)`` nonzero inside;
    ``facts`` names the donor and the CIELAB shift of the median skin."""
    lab = cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)
    inside = mask > 0
    weight, med, sd = _skin_weight(lab, inside)
    donor = pick_donor(condition, seed)
    t_med = np.asarray(donor["lab_median"], np.float32)
    t_sd = np.asarray(donor["lab_std"], np.float32)
    gain = float(np.clip(t_sd[0] / sd[0], *SPREAD_RANGE))
    moved = lab.copy()
    moved[..., 0] = np.clip((lab[..., 0] - med[0]) * gain + t_med[0], 0.0, 100.0)
    chroma = np.clip(CHROMA_SHARE * (t_med[1:] - med[1:]), -MAX_CHROMA_SHIFT, MAX_CHROMA_SHIFT)
    moved[..., 1:] = lab[..., 1:] + chroma
    edge = max(feather_px, FEATHER_SHARE * float(np.sqrt(np.count_nonzero(inside))))
    alpha = feather(mask, edge) * weight * strength
    out_lab = lab + alpha[..., None] * (moved - lab)
    out = np.clip(np.rint(cv2.cvtColor(out_lab, cv2.COLOR_Lab2RGB) * 255.0), 0, 255).astype(np.uint8)
    # the Lab round trip rounds: pixels the edit does not reach keep their exact values
    untouched = alpha <= 0
    out[untouched] = image[untouched]
    shift = [float(t_med[0] - med[0]), *(float(x) for x in chroma)]
    facts = {"donor": donor["id"], "donor_match": donor["match"], "lab_shift": [round(x, 2) for x in shift]}
    return out, facts


#: limb cells: the cue values of a same-cue control (the mask's content re-synthesised with the
#: cue kept); every other cue is a treatment, inpainted away. The gates' default control condition
#: is the same cue (``validation.gates.skin.CONTROL_CONDITIONS``); generation does not import the gates
LIMB_CONTROL_CUES = frozenset({"kept"})


def _resize_multiple(image: np.ndarray, multiple: int) -> np.ndarray:
    if multiple <= 0:
        return image
    h, w = image.shape[:2]
    nh, nw = max(multiple, round(h / multiple) * multiple), max(multiple, round(w / multiple) * multiple)
    if (nh, nw) == (h, w):
        return image
    return cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA)


class ClassicalEditor(SequentialEditor):
    """CPU editor; see the module docstring."""

    name = "classical"

    def __init__(self, options: ClassicalOptions | None = None) -> None:
        self.options = options or ClassicalOptions()
        self._rerenderer = None

    def prepare(self) -> None:
        """Load the autoencoder once, before any work, when re-rendering is on."""
        if self.options.rerender and self._rerenderer is None:
            from counterfactory.generation.rerender import get_rerenderer

            self._rerenderer = get_rerenderer(self.options.rerender_max_side)

    def rerender(self, image: np.ndarray) -> np.ndarray:
        """``image`` through the autoencoder (:class:`~counterfactory.generation.rerender.Rerenderer`)."""
        self.prepare()
        return self._rerenderer(image)

    def lineage(self) -> dict[str, Any]:
        # version 4: a limb cell's same-cue control (cue=kept) is re-rendered, no longer
        # inpainted like its treatment (it was the treatment's image); version 3: a race the
        # donor set lacks no longer falls back to one shared donor
        return {"backend": self.name, "version": 4, **self.options.model_dump()}

    def consumes(self, kind: str) -> frozenset[str]:
        """The tint comes from the condition and seed, inside the mask; the prompt is not read.
        A limb cell's output comes from its cue (the condition, which every attempt id hashes)
        and the mask: Telea and the re-render draw no random numbers, so no seed."""
        return frozenset({"seed", "mask"}) if kind == "face" else frozenset({"mask"})

    def edit(self, request: EditRequest) -> EditResult:
        image = request.image
        if request.mask is None or not np.any(request.mask):
            return EditResult(
                request.attempt_id,
                "failed",
                reason="classical_no_mask: the classical editor edits only inside the cell's mask",
            )
        if request.kind == "limb":
            out, facts = self._limb(request)
        elif not request.condition:
            # a request without a condition asks for the photo unchanged (the noise-floor
            # request): what comes back is the re-rendering alone, as from a real editor
            out, facts = image.copy(), {"noise_floor": True}
            if self.options.rerender:
                out = self.rerender(out)
        else:
            out, facts = donor_tone_shift(
                image,
                request.mask,
                dict(request.condition),
                request.seed,
                strength=self.options.strength,
                feather_px=self.options.feather_px,
            )
            if self.options.rerender:
                out = self.rerender(out)
        out = _resize_multiple(out, self.options.output_multiple)
        metadata: dict[str, Any] = {"output_size": [int(out.shape[1]), int(out.shape[0])]}
        metadata.update(facts)
        if request.kind != "limb":
            metadata["rerendered"] = self.options.rerender
        return EditResult(request.attempt_id, "ok", image=out, metadata=metadata)

    def _limb(self, request: EditRequest) -> tuple[np.ndarray, dict[str, Any]]:
        """A limb cell's image and facts (module docstring): the cue inpainted away, or, for the
        same-cue control, the image re-rendered (the source with ``rerender`` off)."""
        image = request.image
        if str((request.condition or {}).get("cue", "")) in LIMB_CONTROL_CUES:
            # the factory keeps only the mask's pixels: the cue re-synthesised, not removed
            if self.options.rerender:
                return self.rerender(image), {"limb_fill": "rerender"}
            return image.copy(), {"limb_fill": "copy"}
        mask = (request.mask > 0).astype(np.uint8) * 255
        out = cv2.inpaint(image, mask, self.options.inpaint_radius_px, cv2.INPAINT_TELEA)
        return out, {"limb_fill": "telea"}


EDITORS.register("classical", ClassicalOptions, ClassicalEditor)
