"""An existing counterfactual set on disk, for the ``import`` backend and ``measure --batch``.

:func:`write_import_set` makes a labelled set from real photos with the failure corpus
(:func:`counterfactory.validation.calibration.failures.build_corpus`: good face-only edits and failures,
each re-rendered through TAEF2 and jittered as an editor returns it) and writes it out as a
set from an editor arrives: source photos with their metadata, candidate files in the formats
and frames editors return them in (PNG, JPEG, WebP, re-sized, re-framed), one PNG whose text
chunk has a bad CRC (a ComfyUI output), one row whose file is missing, one file in two rows,
and a pair table (``pairs.csv``) with the condition columns of the spec it writes.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.failures import GOOD, build_corpus, build_floors
from tests.conftest import REPO

LONDON = REPO.parent / "shared" / "photos" / "london"
#: (photos, the corpus classes made for them): identity swaps take their donor from another
#: photo of the same group, so each group has several people
GROUPS = (
    (
        [PHOTOS_DIR / "grace_hopper.jpg", PHOTOS_DIR / "obama_portrait.jpg", PHOTOS_DIR / "biden_portrait.jpg"],
        (GOOD, "expression", "identity_swap", "text_added", "global_colour"),
    ),
    (
        # (042.jpg is not used: at 384 px its plain backdrop leaves the aligner too little outside
        # the face, neck and ears, and it fails to register even good edits)
        [LONDON / "neutral" / "025.jpg", LONDON / "neutral" / "030.jpg"],
        (GOOD, "noop_copy", "object_added", "head_position", "hair"),
    ),
)
AXES = {
    "race": ["Black", "East Asian", "South Asian", "Middle Eastern", "Latino", "White"],
    "gender": ["female", "male"],
}
GENDERS = {
    "grace_hopper": "female",
    "obama_portrait": "male",
    "biden_portrait": "male",
    "025": "female",
    "030": "female",
}
MAX_SIDE = 384
#: zlib level of the PNGs written here: lossless at any level; level 6 (PIL's default) spent
#: a sixth of the FOCUS-shaped set's making in the encoder
PNG_LEVEL = 1


@dataclass
class ImportSet:
    """What :func:`write_import_set` wrote.

    Attributes:
        folder: the set's folder (``pairs.csv``, ``photos/``, ``candidates/``, ``spec.yaml``).
        spec: the spec that imports it.
        table: the pair table.
        rows: one dict per table row: its columns, plus ``label`` (the corpus class, or
            ``missing``), ``case_id`` and ``form`` (how the file was written).
    """

    folder: Path
    spec: Path
    table: Path
    rows: list[dict[str, str]] = field(default_factory=list)

    def by_form(self, form: str) -> list[dict[str, str]]:
        return [r for r in self.rows if r["form"] == form]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_with_damaged_text(pixels: np.ndarray) -> bytes:
    """A PNG of ``pixels`` with a ComfyUI-style ``tEXt`` workflow chunk before the pixels whose
    CRC has one byte flipped (Pillow refuses such a file; libpng warns and skips the chunk)."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    data = buf.getvalue()
    text = _chunk(b"tEXt", b'workflow\x00{"nodes": [1, 2, 3], "note": "ComfyUI"}')
    at = data.index(b"IDAT") - 4
    damaged = bytearray(data[:at] + text + data[at:])
    damaged[at + len(text) - 1] ^= 0xFF
    return bytes(damaged)


def _reframe(image: np.ndarray) -> np.ndarray:
    """Padded left and right by a quarter of its width with a grey border, as an editor that
    fits its output into a wider aspect ratio returns it."""
    h, w = image.shape[:2]
    pad = w // 4
    out = np.full((h, w + 2 * pad, 3), 127, np.uint8)
    out[:, pad : pad + w] = image
    return out


def _write(path: Path, image: np.ndarray, form: str) -> None:
    if form == "webp":
        Image.fromarray(image).save(path, format="WEBP", quality=95)
    elif form in ("jpeg", "resized"):
        Image.fromarray(image).save(path, format="JPEG", quality=95)
    elif form == "damaged_png":
        path.write_bytes(png_with_damaged_text(image))
    else:
        Image.fromarray(image).save(path, format="PNG", compress_level=PNG_LEVEL)


def write_import_set(folder: Path, *, seed: int = 0) -> ImportSet:
    """Write the set into ``folder`` (see the module docstring) and return what it holds.

    Every fifth candidate is WebP, every seventh re-sized to 60 % (JPEG), every eleventh padded
    to a wider frame (re-framed); the first good edit is the PNG with the damaged text chunk; the
    second good edit's file is named again by a second row (another condition of its source);
    one more row names a file that is not there.
    """
    photos, candidates = folder / "photos", folder / "candidates"
    photos.mkdir(parents=True, exist_ok=True)
    candidates.mkdir(exist_ok=True)
    conditions = [(race, gender) for race in AXES["race"] for gender in AXES["gender"]]
    metadata, rows = [], []
    used: dict[str, int] = {}
    n = 0
    for paths, classes in GROUPS:
        for case in build_corpus(paths, per_class=1, seed=seed, max_side=MAX_SIDE, classes=classes):
            stem = Path(case.photo).stem
            source_file = f"photos/{stem}.png"
            if stem not in used:
                used[stem] = 0
                # the source as the corpus holds it (scaled to MAX_SIDE): the candidates are edits of it
                Image.fromarray(case.source).save(folder / source_file, compress_level=PNG_LEVEL)
                metadata.append(
                    {
                        "id": f"src_{stem}",
                        "path": f"{stem}.png",
                        "licence": "CC BY 4.0 (Face Research Lab London Set)"
                        if "london" in str(paths[0])
                        else "public domain (U.S. government)",
                        "occupation": "portrait",
                        "presented_gender": GENDERS[stem],
                    }
                )
            race, gender = conditions[used[stem]]
            used[stem] += 1
            n += 1
            image, form = case.output, "png"
            if case.label == GOOD and not any(r["form"] == "damaged_png" for r in rows):
                form = "damaged_png"
            elif n % 5 == 0:
                form = "webp"
            elif n % 7 == 0:
                h, w = image.shape[:2]
                image, form = (
                    cv2.resize(image, (round(w * 0.6), round(h * 0.6)), interpolation=cv2.INTER_AREA),
                    "resized",
                )
            elif n % 11 == 0:
                image, form = _reframe(image), "reframed"
            suffix = {"webp": ".webp", "resized": ".jpg", "jpeg": ".jpg"}.get(form, ".png")
            name = f"candidates/{case.case_id.replace(':', '_').replace('.', '_')}{suffix}"
            _write(folder / name, image, form)
            rows.append(_pair_row(n, source_file, name, race, gender, case, form))
    # one file in two rows: the second good edit again, for another condition of its source
    twice = [r for r in rows if r["label"] == GOOD][1]
    stem = Path(twice["source"]).stem
    race, gender = conditions[used[stem]]
    used[stem] += 1
    rows.append(
        {**twice, "id": f"pair{len(rows) + 1:03d}", "race": race, "gender": gender, "prompt": _prompt(race, gender),
         "form": "second_row"}
    )  # fmt: skip
    # one row whose candidate was never copied
    last = rows[-2]
    stem = Path(last["source"]).stem
    race, gender = conditions[used[stem]]
    used[stem] += 1
    rows.append(
        {
            **last,
            "id": f"pair{len(rows) + 1:03d}",
            "candidate": "candidates/not_copied.png",
            "race": race,
            "gender": gender,
            "prompt": _prompt(race, gender),
            "label": "missing",
            "case_id": "",
            "form": "missing",
        }
    )
    assert max(used.values()) <= len(conditions), used
    # each source's noise floor, as the set's editor would answer "return this photo unchanged"
    # (re-rendered, jittered): the table's floor column, which the run judges the cells above
    (folder / "floors").mkdir(exist_ok=True)
    for paths, _ in GROUPS:
        for case in build_floors(paths, seed=seed, max_side=MAX_SIDE):
            stem = Path(case.photo).stem
            if stem in used:
                Image.fromarray(case.output).save(folder / "floors" / f"{stem}.png", compress_level=PNG_LEVEL)
    for r in rows:
        r["floor"] = f"floors/{Path(r['source']).stem}.png"
    (photos / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}, sort_keys=False))
    table = folder / "pairs.csv"
    columns = ["id", "source", "candidate", "race", "gender", "prompt", "floor"]
    lines = [",".join(columns)] + [",".join(_csv(r[c]) for c in columns) for r in rows]
    table.write_text("\n".join(lines) + "\n")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(import_spec("pairs.csv"), sort_keys=False))
    return ImportSet(folder, spec, table, rows)


def _pair_row(number: int, source: str, candidate: str, race: str, gender: str, case, form: str) -> dict[str, str]:
    """One pair table row (and the labels the tests read: the corpus class, case id, file form)."""
    return {
        "id": f"pair{number:03d}",
        "source": source,
        "candidate": candidate,
        "race": race,
        "gender": gender,
        "prompt": _prompt(race, gender),
        "label": case.label,
        "case_id": case.case_id,
        "form": form,
    }


def _prompt(race: str, gender: str) -> str:
    return f"Change the person's race to {race}, gender {gender}; keep everything else."


def _csv(value: str) -> str:
    return f'"{value}"' if "," in value or '"' in value else value


def import_spec(table: str, *, version: str = "0.1.0", **editor) -> dict:
    """The spec that imports ``table`` (relative to the spec's folder) with the set's axes."""
    return {
        "name": "import-test",
        "sources": {"photos": "photos", "metadata": "photos/metadata.yaml"},
        # no templates_per_stratum: the grid is the table
        "design": {"kind": "face", "axes": AXES, "strata": []},
        "prompts": {"face": "face_only_v1"},
        "editor": {
            "backend": "import",
            "import": {"table": table, "editor_name": "failure-corpus", "editor_version": "1", **editor},
        },
        "release": {"name": "import-test", "version": version},
        "trials": {"protocols": ["2afc", "mcq"]},
    }


#: A FOCUS-shaped set (issue 34): eight people of four stated groups (Face Research Lab London
#: Set), ten conditions each, no floor column
FOCUS_PEOPLE = ("025", "042", "030", "045", "064", "070", "002", "004")
FOCUS_GENDERS = {"025": "female", "042": "male", "030": "female", "045": "male", "064": "female", "070": "male",
                 "002": "female", "004": "male"}  # fmt: skip
#: the failures added, each to the first of its sources where the corpus can make it (one row
#: each, an eleventh condition; an added object needs a donor patch a person would see there)
FOCUS_FAILURES = ("object_added", "global_colour", "identity_swap")


def write_focus_set(folder: Path, *, seed: int = 0) -> ImportSet:
    """A set shaped like FOCUS's, as an editor returns one and with no ``floor`` column: each of
    :data:`FOCUS_PEOPLE` (384 px) with ten good face-and-neck edits (skin lighter or darker by
    8-15 L*, half with a feature morph toward another group's proportions; every one re-rendered
    through TAEF2 and jittered, :mod:`counterfactory.validation.calibration.failures`), and three more rows,
    each a good edit with one failure on top (:data:`FOCUS_FAILURES`: an added object, a colour
    cast, an identity swap), each on another source. Rows carry ``label`` (the corpus class)."""
    from counterfactory.validation.calibration.failures import build_set_corpus
    from counterfactory.validation.calibration.photo_sets import PhotoSet

    photos, candidates = folder / "photos", folder / "candidates"
    photos.mkdir(parents=True, exist_ok=True)
    candidates.mkdir(exist_ok=True)
    paths = tuple(LONDON / "neutral" / f"{p}.jpg" for p in FOCUS_PEOPLE)
    conditions = [(race, gender) for race in AXES["race"] for gender in AXES["gender"]]
    people = PhotoSet("focus", paths, per_class=3, max_side=MAX_SIDE)
    metadata, rows, used = [], [], {}
    cases = list(build_set_corpus(people, seed=seed, classes=(GOOD,), variants=10))  # the ten each row uses
    failed: dict[str, object] = {}
    for c in build_set_corpus(
        PhotoSet("focus", paths, per_class=1, max_side=MAX_SIDE), seed=seed, classes=FOCUS_FAILURES
    ):
        if c.label not in failed and c.photo not in {f.photo for f in failed.values()}:
            failed[c.label] = c
        if len(failed) == len(FOCUS_FAILURES):
            break
    assert sorted(failed) == sorted(FOCUS_FAILURES), sorted(failed)
    cases += list(failed.values())
    for case in cases:
        stem = Path(case.photo).stem
        if stem not in used:
            used[stem] = 0
            Image.fromarray(case.source).save(photos / f"{stem}.png", compress_level=PNG_LEVEL)
            metadata.append(
                {
                    "id": f"src_{stem}",
                    "path": f"{stem}.png",
                    "licence": "CC BY 4.0 (Face Research Lab London Set)",
                    "occupation": "portrait",
                    "presented_gender": FOCUS_GENDERS[stem],
                }
            )
        if case.label == GOOD and used[stem] >= 10:
            continue
        race, gender = conditions[used[stem]]
        used[stem] += 1
        name = f"candidates/{case.case_id.replace(':', '_').replace('.', '_')}.png"
        Image.fromarray(case.output).save(folder / name, compress_level=PNG_LEVEL)
        rows.append(_pair_row(len(rows) + 1, f"photos/{stem}.png", name, race, gender, case, "png"))
    (photos / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}, sort_keys=False))
    table = folder / "pairs.csv"
    columns = ["id", "source", "candidate", "race", "gender", "prompt"]
    table.write_text("\n".join([",".join(columns)] + [",".join(_csv(r[c]) for c in columns) for r in rows]) + "\n")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(import_spec("pairs.csv"), sort_keys=False))
    return ImportSet(folder, spec, table, rows)
