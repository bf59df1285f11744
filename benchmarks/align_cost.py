"""Seconds per alignment with band-passed ECC against raw-intensity ECC, in the same run.

Each case is a real photo (the bundled ones at 512 px and London Set portraits at 384 px when
``../shared/photos/london`` is there) re-rendered through TAEF2, zoomed 1.5 %, shifted 2 px,
resized to 1024 px and JPEG-encoded, as an editor returns it; both variants align the same
outputs, alternating, ``--repeat`` times. Prints seconds per alignment for each, their ratio,
and each variant's largest error at the face against the warp the script applied.

    python benchmarks/align_cost.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import numpy as np

from counterfactory.generation import align
from counterfactory.generation.rerender import rerender_like
from counterfactory.validation.calibration.base import bundled_photo_paths, load_rgb
from counterfactory.validation.faces import face_mask, get_face_landmarker

LONDON = Path(__file__).resolve().parents[1].parent / "shared" / "photos" / "london" / "neutral"


def _cases() -> list[tuple[str, np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]]:
    paths = [(p, 512) for p in bundled_photo_paths()]
    if LONDON.is_dir():
        paths += [(LONDON / f"{n}.jpg", 384) for n in ("003", "027", "102", "105", "142", "172")]
    landmarker = get_face_landmarker()
    out = []
    for path, side in paths:
        image = load_rgb(path)
        f = min(1.0, side / max(image.shape[:2]))
        image = cv2.resize(image, (round(image.shape[1] * f), round(image.shape[0] * f)), interpolation=cv2.INTER_AREA)
        faces = landmarker.detect(image)
        if len(faces) != 1:
            continue
        h, w = image.shape[:2]
        m = cv2.getRotationMatrix2D((w / 2, h / 2), 0.0, 1.015)
        m[:, 2] += (2.0, -1.2)
        moved = cv2.warpAffine(rerender_like(image, image.shape), m, (w, h), borderMode=cv2.BORDER_REFLECT)
        s = 1024 / max(h, w)
        size = (round(w * s / 16) * 16, round(h * s / 16) * 16)
        output = cv2.resize(moved, size, interpolation=cv2.INTER_CUBIC)
        sx, sy = size[0] / w, size[1] / h
        resize = np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1]])
        truth = (resize @ np.vstack([m, [0, 0, 1]]))[:2]
        mask = face_mask(faces[0].landmarks, (h, w), mode="oval")
        out.append((path.name, image, output, faces[0].size_px, mask, truth))
    return out


def _error(mask: np.ndarray, estimate: np.ndarray, truth: np.ndarray) -> float:
    ys, xs = np.nonzero(mask)
    p = np.stack([xs, ys], axis=1).astype(np.float64)
    d = (p @ estimate[:, :2].T + estimate[:, 2]) - (p @ truth[:, :2].T + truth[:, 2])
    return float(np.sqrt((d**2).sum(axis=1)).max() / truth[0, 0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = _cases()
    variants = {"band-passed": align.BANDPASS_SIGMA_FRAC, "raw intensity": 0.0}
    seconds = {k: 0.0 for k in variants}
    worst = {k: 0.0 for k in variants}
    failed = {k: 0 for k in variants}
    for _ in range(args.repeat):
        for name, frac in variants.items():
            align.BANDPASS_SIGMA_FRAC = frac
            for _photo, source, output, size, mask, truth in cases:
                align._SOURCE_FEATURES.clear()  # each variant pays its own source keypoints and band
                align._SOURCE_BANDS.clear()
                t0 = time.perf_counter()
                result = align.align_candidate(source, output, mask=mask, kind="face", face_size_px=size)
                seconds[name] += time.perf_counter() - t0
                failed[name] += not result.ok
                worst[name] = max(worst[name], _error(mask, result.raw_transform, truth))
    n = args.repeat * len(cases)
    for name in variants:
        print(
            f"{name:14s} {seconds[name] / n:.3f} s/alignment  not ok {failed[name]}/{n}  "
            f"worst error at the face {worst[name]:.2f} px"
        )
    print(
        f"ratio band-passed / raw intensity: {seconds['band-passed'] / seconds['raw intensity']:.2f} ({len(cases)} photos)"
    )


if __name__ == "__main__":
    main()
