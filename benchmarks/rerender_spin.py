"""TAEF2 re-rendering with onnxruntime's intra-op threads spinning (its default) against sleeping
(what :class:`counterfactory.generation.rerender.Rerenderer` sets): CPU time and wall time per
image, the same bytes both ways.

    python benchmarks/rerender_spin.py [--images 8] [--rounds 2] [--max-side 512] [--json]

Prints each setting's CPU and wall seconds per image and the ratio sleeping / spinning (lower is
better), measured in the same process, interleaved round by round so that a busy machine weighs
on both alike. A spinning thread keeps its core busy while it waits for work, which costs most
where the cores are shared (the gates' thread pool, two runs, a test suite in two processes).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np


def _session_pair(spin: bool):
    import onnxruntime as ort

    from counterfactory.generation import rerender

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return tuple(
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for path in (rerender.TAEF2_ENCODER, rerender.TAEF2_DECODER)
    )


def main() -> None:
    from counterfactory.assets import PHOTOS_DIR
    from counterfactory.generation.images import load_image
    from counterfactory.generation.rerender import Rerenderer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8, help="re-renders per setting and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-side", type=int, default=512)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args()

    image = load_image(PHOTOS_DIR / "grace_hopper.jpg").pixels
    renderers = {}
    for spin in (True, False):
        r = Rerenderer(max_side=args.max_side)
        r._encoder, r._decoder = _session_pair(spin)
        r(image)  # warm-up: the first call allocates
        renderers[spin] = r
    cpu = {True: 0.0, False: 0.0}
    wall = {True: 0.0, False: 0.0}
    outputs = {}
    for _ in range(args.rounds):
        for spin, r in renderers.items():
            u0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.perf_counter()
            for _ in range(args.images):
                outputs[spin] = r(image)
            wall[spin] += time.perf_counter() - t0
            cpu[spin] += resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
    n = args.images * args.rounds
    result = {
        "images": n,
        "max_side": args.max_side,
        "spinning": {"cpu_s_per_image": round(cpu[True] / n, 3), "wall_s_per_image": round(wall[True] / n, 3)},
        "sleeping": {"cpu_s_per_image": round(cpu[False] / n, 3), "wall_s_per_image": round(wall[False] / n, 3)},
        "cpu_ratio": round(cpu[False] / cpu[True], 3),
        "wall_ratio": round(wall[False] / wall[True], 3),
        "same_bytes": bool(np.array_equal(outputs[True], outputs[False])),
    }
    if args.json:
        print(json.dumps(result))
        return
    for name in ("spinning", "sleeping"):
        print(
            f"{name}: {result[name]['cpu_s_per_image']:.3f} s CPU, {result[name]['wall_s_per_image']:.3f} s wall per image"
        )
    print(f"sleeping / spinning: CPU {result['cpu_ratio']:.2f}, wall {result['wall_ratio']:.2f}")
    print(f"same bytes: {result['same_bytes']}")


if __name__ == "__main__":
    main()
