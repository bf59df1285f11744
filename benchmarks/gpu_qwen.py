"""Seconds per edit through ``QwenEditor`` against a plain diffusers call, same run, same weights.

Both sides use the one pipeline the editor loaded (a second copy of Qwen-Image-Edit would not
fit beside the first), the same source, prompt, seeds and settings, and run interleaved so
that clock drift and thermal state hit both alike. What differs is only what the editor adds
around the call: array/PIL conversion, pre-resizing, per-item generators, NaN checks, result
building. Peak GPU memory (``torch.cuda.max_memory_allocated``) is measured per side.

On a GPU machine with the weights in the Hugging Face cache::

    python benchmarks/gpu_qwen.py --model-id Qwen/Qwen-Image-Edit-2509 --steps 40

Then a **batch job** (``--job-edits N``, default 16): N face edits of the bundled photos the
way the flow runs them, one thread per template that loads its photo, finds the face (the
CPU side's "image loading"), hands its requests to the editor (the pipeline's batch worker)
and aligns and judges every output with the real gates. It runs twice in the same process:
with ``--cpu-workers`` template threads (loading, alignment and gates overlap generation) and
with one (nothing overlaps: the reference). For each it prints seconds per edit (job wall /
N) and the share of the job the pipeline was busy: the worker's time inside pipeline calls
over wall time, and on CUDA the GPU stream's time between CUDA events around each call.

Smoke test on a CPU with the tiny random pipeline (``--tiny`` builds it in a temporary folder;
the numbers then say nothing about a GPU, and the script says so)::

    python benchmarks/gpu_qwen.py --tiny --steps 2 --repeats 1 --warmup 0 --job-edits 4
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import threading
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


def _job_sources() -> list[tuple[str, Path]]:
    """The bundled one-face photos: ``(id, path)``."""
    from counterfactory.assets import PHOTOS_DIR

    names = ["grace_hopper.jpg", "biden_portrait.jpg", "obama_portrait.jpg", "astronaut.png"]
    return [(Path(n).stem, PHOTOS_DIR / n) for n in names if (PHOTOS_DIR / n).is_file()]


def batch_job(editor: QwenEditor, n_edits: int, cpu_workers: int, size: int, cuda: bool) -> dict[str, Any]:
    """``n_edits`` face edits split over the bundled photos (one template each), run by
    ``cpu_workers`` template threads as the flow runs them: load and find the face, edit in
    chunks of ``batch_size`` through the pipeline's batch worker, align and judge each output.

    Returns wall seconds, seconds per edit, the pipeline's busy share (time inside pipeline
    calls / wall) and on CUDA the GPU-stream share (CUDA-event time / wall).
    """
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from counterfactory.generation.align import AlignConfig
    from counterfactory.validation.faces import face_mask, get_face_landmarker
    from counterfactory.validation.gate_stack import GatesConfig, GateStack
    from counterfactory.validation.judging import judge_output

    stack = GateStack.from_config(GatesConfig(), "face")
    landmarker = get_face_landmarker()
    landmarker_lock = threading.Lock()
    sources = _job_sources()
    per_template: dict[int, list[int]] = {}
    for i in range(n_edits):
        per_template.setdefault(i % len(sources), []).append(i)
    batch = editor.batch_size
    verdicts: list[str] = []

    def template(index: int, seeds: list[int]) -> None:
        _, path = sources[index]
        with Image.open(path) as im:  # loading: decode and scale, as the flow's sources step
            im = im.convert("RGB")
            scale = size / max(im.size)
            image = np.asarray(im.resize((round(im.width * scale), round(im.height * scale)), Image.LANCZOS)).copy()
        with landmarker_lock:
            faces = landmarker.detect(image)
        mask = face_mask(faces[0].landmarks, image.shape[:2]) if faces else None
        for start in range(0, len(seeds), batch):
            requests = [
                EditRequest(attempt_id=f"job-{s}", image=image, prompt=PROMPT, seed=s, kind="face", mask=mask)
                for s in seeds[start : start + batch]
            ]
            for result in editor.edit_many(requests):
                if result.status != "ok":
                    verdicts.append("failed")
                    continue
                judged = judge_output(
                    image,
                    result.image,
                    kind="face",
                    region=mask,
                    face_size_px=faces[0].size_px if faces else None,
                    align=AlignConfig(),
                    stack=stack,
                )
                verdicts.append(judged.verdict)

    worker = editor._loaded.batch_worker()
    worker.reset_stats()
    gpu_before = sum(_gpu_event_seconds(editor))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=cpu_workers) as pool:
        list(pool.map(lambda item: template(*item), per_template.items()))
    wall = time.perf_counter() - start
    stats = worker.stats
    gpu_s = None
    if cuda:
        gpu_s = sum(_gpu_event_seconds(editor)) - gpu_before
    return {
        "cpu_workers": cpu_workers,
        "edits": n_edits,
        "wall_s": round(wall, 3),
        "s_per_edit": round(wall / n_edits, 4),
        "busy_s": round(stats.busy_s, 3),
        "busy_share": round(stats.busy_share(wall), 4),
        "gpu_event_s": None if gpu_s is None else round(gpu_s, 3),
        "gpu_event_share": None if gpu_s is None else round(min(1.0, gpu_s / wall), 4),
        "batches": stats.batches,
        "largest_batch": stats.largest_batch,
        "queue_high_water": stats.queue_high_water,
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
    }


#: per editor: every result's ``gpu_seconds`` (CUDA-event time of its batch, its share)
_gpu_log: dict[int, list[float]] = {}


def _gpu_event_seconds(editor: QwenEditor) -> list[float]:
    """Every ``gpu_seconds`` the editor's results reported so far (see :func:`_record_gpu_seconds`)."""
    return _gpu_log.setdefault(id(editor), [])


def _record_gpu_seconds(editor: QwenEditor) -> None:
    """Wrap ``editor._run`` so that every result's CUDA-event time is logged for the job."""
    inner = editor._run
    log = _gpu_event_seconds(editor)

    def run(name, requests):
        results = inner(name, requests)
        log.extend(float(r.metadata.get("gpu_seconds") or 0.0) for r in results)
        return results

    editor._run = run  # type: ignore[method-assign]


def cap_pipeline_area(area: int) -> None:
    """Make every Qwen-Image-Edit pipeline module (and so the editor, which asks the pipeline's own
    module) size images for at most ``area`` pixels: diffusers hard-codes 1024 x 1024, which costs
    a tiny random pipeline on a CPU 20 s an edit in its VAE alone."""
    for name in ("pipeline_qwenimage_edit", "pipeline_qwenimage_edit_plus", "pipeline_qwenimage_edit_inpaint"):
        module = importlib.import_module(f"diffusers.pipelines.qwenimage.{name}")
        original = getattr(module, "_uncapped_calculate_dimensions", module.calculate_dimensions)

        def capped(target_area, ratio, _original=original):
            return _original(min(target_area, area), ratio)

        module._uncapped_calculate_dimensions = original
        module.calculate_dimensions = capped


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
    parser.add_argument("--batch-size", type=int, default=1, help="editor.qwen.batch_size for the batch job")
    parser.add_argument("--job-edits", type=int, default=16, help="edits in the batch job (0: skip it)")
    parser.add_argument("--cpu-workers", type=int, default=2, help="template threads in the overlapped job")
    parser.add_argument(
        "--tiny", action="store_true", help="build the tiny random test pipeline and run on the CPU (smoke test)"
    )
    parser.add_argument(
        "--area",
        type=int,
        default=None,
        help="CPU smoke tests only: condition on and generate at most this many pixels instead of "
        "diffusers' 1024x1024 (both sides of the comparison; the figures are then no editor's)",
    )
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.area is not None:
        if args.device.startswith("cuda") and not args.tiny:
            parser.error("--area is for CPU smoke tests with tiny pipelines: a GPU run measures diffusers' own size")
        cap_pipeline_area(args.area)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be at least 1 and --warmup at least 0")
    if args.job_edits < 0 or args.cpu_workers < 1 or args.batch_size < 1:
        parser.error("--job-edits must be at least 0, --cpu-workers and --batch-size at least 1")
    if args.tiny:
        import tempfile

        sys.path.insert(0, str(REPO))
        from tests.generation.conftest_qwen import build_tiny_qwen_pipeline

        folder = Path(tempfile.mkdtemp(prefix="tiny-qwen-")) / "pipeline"
        build_tiny_qwen_pipeline(folder)
        args.model_id, args.device, args.dtype, args.true_cfg_scale = str(folder), "cpu", "float32", 1.0

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
        batch_size=args.batch_size,
    )
    editor = QwenEditor(options)
    _record_gpu_seconds(editor)
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
    if args.job_edits:
        overlapped = batch_job(editor, args.job_edits, args.cpu_workers, args.size, cuda)
        serial = batch_job(editor, args.job_edits, 1, args.size, cuda)
        report["batch_job"] = {"overlapped": overlapped, "serial": serial}
        report["batch_job_speedup"] = round(serial["wall_s"] / overlapped["wall_s"], 3)
        print(f"batch job: {args.job_edits} face edits, batch_size {args.batch_size}, gates on the CPU")
        for label, job in (("overlapped", overlapped), ("serial (reference)", serial)):
            gpu = f", GPU-stream share {job['gpu_event_share']:.3f}" if job["gpu_event_share"] is not None else ""
            print(
                f"  {label:19s} {job['cpu_workers']} template thread(s): {job['s_per_edit']:8.3f} s/edit, "
                f"pipeline busy {job['busy_share']:.3f} of {job['wall_s']:.1f} s{gpu}, "
                f"{job['batches']} batches (largest {job['largest_batch']})"
            )
        print(f"  speed-up overlapped / serial: {report['batch_job_speedup']:.3f}")
    if not cuda:
        print(
            f"NOTE: this ran on the CPU with {args.model_id}"
            + (" (the tiny random test pipeline)" if args.tiny else "")
            + "; seconds, busy shares and speed-ups say nothing about a GPU: run it on one."
        )
    report["cpu_smoke_test"] = not cuda
    print(json.dumps(report))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
