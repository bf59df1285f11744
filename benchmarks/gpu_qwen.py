"""Seconds per edit through ``QwenEditor`` against a plain diffusers call, same run, same weights.

Both sides use the one pipeline the editor loaded (a second copy of Qwen-Image-Edit would not
fit beside the first), the same source, prompt, seeds and settings, and run interleaved so
that clock drift and thermal state hit both alike. What differs is only what the editor adds
around the call: array/PIL conversion, pre-resizing, per-item generators, NaN checks, result
building. Peak GPU memory (``torch.cuda.max_memory_allocated``) is measured per side.

On a GPU machine with the weights in the Hugging Face cache::

    python benchmarks/gpu_qwen.py --model-id Qwen/Qwen-Image-Edit-2509 --steps 40

Smoke test on a CPU with a tiny random pipeline::

    python tests/generation/conftest_qwen.py /tmp/tiny-qwen
    python benchmarks/gpu_qwen.py --model-id /tmp/tiny-qwen --device cpu --dtype float32 --steps 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from counterfactory.generation.editors.base import EditRequest  # noqa: E402
from counterfactory.generation.editors.qwen import QwenEditor, QwenOptions  # noqa: E402

PROMPT = "Change the person's apparent race to East Asian; keep everything else identical."


def source_image(size: int) -> np.ndarray:
    """A real portrait, centre-cropped to a square and resized to ``size`` x ``size`` uint8 RGB."""
    from PIL import Image

    from counterfactory.assets import PHOTOS_DIR

    with Image.open(PHOTOS_DIR / "grace_hopper.jpg") as im:
        im = im.convert("RGB")
        side = min(im.size)
        left, top = (im.width - side) // 2, (im.height - side) // 2
        im = im.crop((left, top, left + side, top + side)).resize((size, size), Image.LANCZOS)
        return np.asarray(im).copy()


def centre_mask(size: int) -> np.ndarray:
    """``(size, size)`` uint8 {0, 255}: a centred rectangle a third of each side."""
    mask = np.zeros((size, size), np.uint8)
    mask[size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 255
    return mask


def plain_call(editor: QwenEditor, name: str, image: np.ndarray, mask: np.ndarray | None, seed: int) -> Any:
    """The diffusers pipeline called as its documentation shows, on the editor's loaded weights."""
    import torch
    from PIL import Image

    o = editor.options
    pipe = editor._pipeline(name)
    kwargs: dict[str, Any] = {
        "image": [Image.fromarray(image)] if name == "edit_plus" else Image.fromarray(image),
        "prompt": PROMPT,
        "negative_prompt": o.negative_prompt if o.true_cfg_scale > 1 else None,
        "true_cfg_scale": o.true_cfg_scale,
        "num_inference_steps": o.steps,
        "generator": torch.Generator(o.device).manual_seed(seed),
    }
    if name == "inpaint":
        kwargs.update(mask_image=Image.fromarray(mask), strength=o.strength)
    return pipe(**kwargs).images[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-id", default="Qwen/Qwen-Image-Edit-2509")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--kind", choices=["face", "limb"], default="face", help="face: edit pipeline; limb: inpaint")
    parser.add_argument("--size", type=int, default=1024, help="source side in pixels (square)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--true-cfg-scale", type=float, default=4.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--lightning-lora", default=None)
    parser.add_argument("--lightning-lora-weight-name", default=None)
    parser.add_argument("--cpu-offload", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--download", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="timed edits per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed edits per side first")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be at least 1 and --warmup at least 0")

    import torch

    options = QwenOptions(
        model_id=args.model_id,
        revision=args.revision,
        steps=args.steps,
        true_cfg_scale=args.true_cfg_scale,
        device=args.device,
        dtype=args.dtype,
        lightning_lora=args.lightning_lora,
        lightning_lora_weight_name=args.lightning_lora_weight_name,
        cpu_offload=args.cpu_offload,
        compile=args.compile,
        download=args.download,
    )
    editor = QwenEditor(options)
    cuda = args.device.startswith("cuda")
    start = time.perf_counter()
    editor.prepare()
    load_s = time.perf_counter() - start

    image = source_image(args.size)
    mask = centre_mask(args.size) if args.kind == "limb" else None

    def request(seed: int) -> EditRequest:
        return EditRequest(attempt_id=f"bench-{seed}", image=image, prompt=PROMPT, seed=seed, kind=args.kind, mask=mask)

    name = editor.pipeline_for(request(0))

    def timed(fn) -> tuple[float, Any]:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    for seed in range(args.warmup):
        editor.edit(request(seed))
        plain_call(editor, name, image, mask, seed)

    seconds: dict[str, list[float]] = {"editor": [], "plain": []}
    peak: dict[str, int] = {"editor": 0, "plain": 0}
    max_diff = 0
    for seed in range(args.warmup, args.warmup + args.repeats):
        for side in ("editor", "plain"):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if side == "editor":
                s, result = timed(lambda seed=seed: editor.edit(request(seed)))
                if result.status != "ok":
                    raise SystemExit(f"editor failed: {result.reason}")
                ours = result.image
            else:
                s, theirs = timed(lambda seed=seed: plain_call(editor, name, image, mask, seed))
                max_diff = max(max_diff, int(np.abs(ours.astype(int) - np.asarray(theirs).astype(int)).max()))
            seconds[side].append(s)
            if cuda:
                peak[side] = max(peak[side], torch.cuda.max_memory_allocated())

    editor_s, plain_s = statistics.median(seconds["editor"]), statistics.median(seconds["plain"])
    report = {
        "model_id": args.model_id,
        "pipeline": name,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": args.dtype,
        "steps": args.steps,
        "true_cfg_scale": args.true_cfg_scale,
        "source_px": [args.size, args.size],
        "output_px": list(ours.shape[1::-1]),
        "load_s": round(load_s, 2),
        "editor_s_median": round(editor_s, 4),
        "plain_s_median": round(plain_s, 4),
        "ratio_editor_over_plain": round(editor_s / plain_s, 4),
        "editor_s": [round(v, 4) for v in seconds["editor"]],
        "plain_s": [round(v, 4) for v in seconds["plain"]],
        "peak_gpu_gib_editor": round(peak["editor"] / 2**30, 3) if cuda else None,
        "peak_gpu_gib_plain": round(peak["plain"] / 2**30, 3) if cuda else None,
        "max_pixel_diff_editor_vs_plain": max_diff,
    }
    print(f"pipeline {name} on {report['device']}, {args.steps} steps, {args.size}x{args.size} source")
    print(f"  QwenEditor.edit   {editor_s:9.3f} s/edit (median of {args.repeats})")
    print(f"  plain diffusers   {plain_s:9.3f} s/edit")
    print(f"  ratio             {editor_s / plain_s:9.4f}")
    if cuda:
        gib = (report["peak_gpu_gib_editor"], report["peak_gpu_gib_plain"])
        print(f"  peak GPU memory   editor {gib[0]} GiB, plain {gib[1]} GiB")
    print(f"  max pixel difference editor vs plain (same seed): {max_diff}")
    print(json.dumps(report))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
