"""The GPU machine's checks in one run (``benchmarks/device_check.sh`` calls this; see there).

Every step writes its figures into ``OUT/device_check.json`` (rewritten after each step) and a
line into ``OUT/device_check.txt``, so stopping at any point leaves what was measured; a step
that fails records its error and the next one runs. The steps:

1. ``environment``: Python, torch, CUDA device, CPU cores, which packages import.
2. ``carry``: the wheels carried (names and sizes) and the working tree's size, against the
   64 MiB that travels to the machine.
3. ``build``: the Qwen-Image-Edit pipeline at the published sizes (transformer 60 layers of
   24 x 128 heads, joint attention 3584, in 64 / out 16 channels, patch 2; text encoder
   Qwen2.5-VL-7B; VAE ``AutoencoderKLQwenImage`` z_dim 16) with random weights created on the
   GPU in bf16 (nothing is downloaded: the same arithmetic as the real weights). ``--dry-run``
   builds the tiny test pipeline on the CPU instead.
4. ``qwen_batch1`` / ``qwen_batch2``: ``benchmarks/gpu_qwen.py`` on that pipeline: the editor
   against plain diffusers ``__call__`` in the same run, peak GPU memory, and a batch job
   through the batch worker with its busy share, at batch size 1 and 2.
5. ``qwen_edit_plus``: the same for the Edit-Plus pipeline (same weights).
6. ``cpu_offload``: one edit with ``enable_model_cpu_offload``.
7. ``ray``: ``counterfactory run --ray local`` with the qwen backend and ``num_gpus`` 1 (0 in
   the dry run), on the tiny pipeline saved to disk (Ray's worker processes load from a folder;
   57 GB of random full-size weights would not fit the machine's disk), with one source photo.
8. ``workers``: ``benchmarks/workers_scaling.py``: the template work on 1, 2, 4 and 8 processes,
   and, where Prefect imports, ``counterfactory run --workers N``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

#: Qwen-Image-Edit's transformer (``transformer/config.json`` of Qwen/Qwen-Image-Edit).
TRANSFORMER = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}
#: Its VAE (``vae/config.json``): 8x spatial downsampling, 16 latent channels.
VAE = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "latents_mean": [0.0] * 16,
    "latents_std": [1.0] * 16,
}
#: Qwen2.5-VL-7B-Instruct (``text_encoder/config.json``): the language model and vision tower.
TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 128000,
    "vocab_size": 152064,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
}
VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "hidden_act": "silu",
}
PIPELINES = {"edit": "QwenImageEditPipeline", "edit_plus": "QwenImageEditPlusPipeline"}


class Report:
    """One JSON and one text summary under ``out``, rewritten after every step."""

    def __init__(self, out: Path, mode: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.json_path, self.text_path = out / "device_check.json", out / "device_check.txt"
        self.data: dict[str, Any] = {
            "mode": mode,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "steps": {},
        }
        self.text_path.write_text(f"device_check ({mode}) started {self.data['started_utc']}\n")
        self._write()

    def _write(self) -> None:
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.json_path)  # a reader never sees half a file

    def step(self, name: str, fn, *args, **kwargs) -> dict[str, Any] | None:
        started = time.perf_counter()
        print(f"[device_check] {name} ...", flush=True)
        try:
            result = fn(*args, **kwargs) or {}
            status = result.pop("status", "ok")
        except BaseException as exc:  # noqa: BLE001 - a failed step is recorded, the next one runs
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            status = "failed"
        entry = {"status": status, "seconds": round(time.perf_counter() - started, 2), **result}
        self.data["steps"][name] = entry
        self.data["finished_steps"] = list(self.data["steps"])
        self._write()
        line = f"{name}: {status} in {entry['seconds']} s; " + summary_of(name, entry)
        with self.text_path.open("a") as f:
            f.write(line + "\n")
        print(f"[device_check] {line}", flush=True)
        return entry if status == "ok" else None


def summary_of(name: str, entry: dict[str, Any]) -> str:
    if "error" in entry:
        return entry["error"]
    if "reason" in entry:
        return entry["reason"]
    keys = {
        "environment": ("python", "torch", "device", "cpu_cores"),
        "carry": ("wheels_mib", "tree_mib", "total_mib", "fits_64_mib"),
        "build": ("params_b", "gpu_gib_after_build"),
        "cpu_offload": ("editor_s_median", "peak_gpu_gib_editor"),
        "ray": ("wall_s", "num_gpus", "summary"),
        "workers": ("template_work", "cli"),
    }.get(name)
    if keys is None and name.startswith("qwen_"):
        keys = ("editor_s_median", "plain_s_median", "ratio_editor_over_plain", "peak_gpu_gib_editor", "batch_job")
    return ", ".join(f"{k}={json.dumps(entry.get(k), default=str)}" for k in keys or () if k in entry)


# ------------------------------------------------------------------------------ steps


def environment() -> dict[str, Any]:
    found = {}
    for module in ("torch", "diffusers", "transformers", "accelerate", "mediapipe", "prefect", "ray", "cv2"):
        try:
            found[module] = getattr(importlib.import_module(module), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            found[module] = f"missing ({type(exc).__name__})"
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "gpu_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
        "cpu_cores": os.cpu_count(),
        "packages": found,
    }


def carry(wheels: Path | None) -> dict[str, Any]:
    files = sorted(wheels.glob("*.whl")) if wheels and wheels.is_dir() else []
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False).stdout.split(b"\0")
    tree = sum((REPO / p.decode()).stat().st_size for p in tracked if p and (REPO / p.decode()).is_file())
    size = sum(f.stat().st_size for f in files)
    return {
        "wheels": {f.name: f.stat().st_size for f in files},
        "wheels_mib": round(size / 2**20, 2),
        "tree_mib": round(tree / 2**20, 2),
        "total_mib": round((size + tree) / 2**20, 2),
        "fits_64_mib": (size + tree) <= 64 * 2**20,
    }


def write_model_folder(folder: Path, class_name: str, *, full: bool) -> Path:
    """A pipeline folder with the configs and the processor but no weights: QwenEditor finds it,
    and :func:`random_loading` builds the modules instead of reading them."""
    from tests.generation.conftest_qwen import build_image_processor, build_tiny_tokenizer, write_processor

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    image_processor = build_image_processor()
    if full:  # the real processor's pixel budget (Qwen2-VL defaults)
        image_processor.min_pixels, image_processor.max_pixels = 56 * 56, 28 * 28 * 1280
        image_processor.size = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    write_processor(folder / "processor", tokenizer, image_processor)
    (folder / "model_index.json").write_text(
        json.dumps({"_class_name": class_name, "processor": ["transformers", "Qwen2VLProcessor"]}, indent=2)
    )
    (folder / "RANDOM_WEIGHTS").write_text("configs only: benchmarks/device_check.py builds random weights\n")
    return folder


def full_components(device: str, dtype: Any, seed: int = 0) -> dict[str, Any]:
    """The full-size modules with random weights, created on ``device`` in ``dtype``."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from tests.generation.conftest_qwen import SPECIAL_TOKENS, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()  # byte-level: prompts run ~3x more tokens than Qwen's BPE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2_5_VLConfig(
        text_config={**TEXT, "bos_token_id": eos, "eos_token_id": eos},
        vision_config=VISION,
        hidden_size=TEXT["hidden_size"],
        vocab_size=TEXT["vocab_size"],
        bos_token_id=eos,
        eos_token_id=eos,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            transformer = QwenImageTransformer2DModel(**TRANSFORMER)
            vae = AutoencoderKLQwenImage(**VAE)
            text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    for module in (transformer, vae, text_encoder):
        module.eval().requires_grad_(False)
    return {
        "transformer": transformer,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(
            base_shift=0.5,
            max_shift=0.9,
            base_image_seq_len=256,
            max_image_seq_len=8192,
            shift_terminal=0.02,
            use_dynamic_shifting=True,
            time_shift_type="exponential",
        ),  # fmt: skip
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }


_COMPONENTS: dict[str, Any] = {}


@contextlib.contextmanager
def random_loading(components: dict[str, Any]):
    """``from_pretrained`` of the Qwen edit pipelines returns a pipeline on ``components``."""
    import diffusers

    saved = {}
    for name in PIPELINES.values():
        cls = getattr(diffusers, name)
        saved[name] = cls.__dict__.get("from_pretrained")

        def from_pretrained(model_dir, *args, _cls=cls, processor=None, **kwargs):
            return _cls(**components, processor=processor)

        cls.from_pretrained = from_pretrained
    try:
        yield
    finally:
        for name, original in saved.items():
            cls = getattr(diffusers, name)
            if original is None:
                del cls.from_pretrained
            else:
                cls.from_pretrained = original


def build(full: bool, device: str, dtype_name: str) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, dtype_name)
    if full:
        _COMPONENTS.update(full_components(device, dtype))
    else:
        from tests.generation.conftest_qwen import build_tiny_components

        _COMPONENTS.update(build_tiny_components())
    params = {k: sum(p.numel() for p in v.parameters()) for k, v in _COMPONENTS.items() if hasattr(v, "parameters")}
    cuda = device.startswith("cuda")
    return {
        "full_size": full,
        "dtype": dtype_name,
        "params": params,
        "params_b": round(sum(params.values()) / 1e9, 3),
        "gpu_gib_after_build": round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None,
    }


def qwen(folder: Path, args: list[str]) -> dict[str, Any]:
    import gpu_qwen

    from counterfactory.generation.editors import qwen as qwen_editor

    qwen_editor._PIPELINES.clear()  # a fresh editor per step, on the same random modules
    with random_loading(_COMPONENTS):
        report = gpu_qwen.main(["--model-id", str(folder), *args])
    for loaded in list(qwen_editor._PIPELINES.values()):
        loaded.close_worker()
    return report


def ray_step(folder: Path, device: str, dtype: str, num_gpus: int, steps: int, work: Path) -> dict[str, Any]:
    try:
        import prefect_ray  # noqa: F401
        import ray  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return {"status": "skipped", "reason": f"ray / prefect-ray not importable here ({type(exc).__name__}: {exc})"}
    import yaml

    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    # one source photo: the step shows the Ray path (cluster, GPU request, worker, ledger), not throughput
    listed = yaml.safe_load((REPO / "assets/photos/metadata.yaml").read_text())
    listed["sources"] = [s for s in listed["sources"] if s["id"] == "grace_hopper"]
    (work / "ray-metadata.yaml").write_text(yaml.safe_dump(listed, sort_keys=False))
    spec["sources"] = {"photos": str(REPO / "assets/photos"), "metadata": str(work / "ray-metadata.yaml")}
    spec["design"]["axes"] = {"race": ["Black"], "gender": ["female"]}
    spec["design"]["strata"] = ["presented_gender"]
    spec["editor"] = {
        "backend": "qwen",
        "max_attempts": 1,
        "qwen": {"model_id": str(folder), "device": device, "dtype": dtype, "steps": steps, "true_cfg_scale": 1.0},
    }
    spec.setdefault("run", {})["ray"] = {"address": "local", "num_gpus": num_gpus}
    spec["release"]["name"] = "device-check-ray"
    path = work / "ray-spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(path), "--out", str(work / "ray-out"), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    wall = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    result = {"wall_s": round(wall, 2), "num_gpus": num_gpus, "returncode": done.returncode, "summary": lines[-4:]}
    if done.returncode != 0:
        result.update(status="failed", error=done.stderr.strip()[-2000:])
    return result


#: the dry run's workers spec: 2 conditions on 256-px photos instead of FOCUS's 10 on 512 px
DRY_WORKERS = {"side": 256, "axes": {"race": ["White", "Black"], "gender": ["female"]}}


def workers(counts: list[int], templates: int, cli: bool, *, dry: bool = False) -> dict[str, Any]:
    import multiprocessing

    import workers_scaling

    scale = DRY_WORKERS if dry else {}
    out: dict[str, Any] = {"counts": counts, "templates": templates, "side": scale.get("side", 512)}
    with tempfile.TemporaryDirectory(prefix="cf-device-workers-") as tmp:
        root = Path(tmp)
        spec = workers_scaling.focus_like_spec(root, templates, **scale)
        # the template work alone (models loaded, sources checked, no Prefect) on N processes,
        # each its own run folder: what the cores allow
        seconds = {}
        for n in counts:
            with multiprocessing.get_context("spawn").Pool(n) as pool:
                started = time.perf_counter()
                shares = pool.map(
                    workers_scaling._process_share,
                    [(str(spec), str(root / f"work-{n}" / str(i)), i, n) for i in range(n)],
                )
                seconds[n] = {
                    "wall_s": round(time.perf_counter() - started, 2),
                    "slowest_share_s": round(max(shares), 2),
                }
        base = seconds[counts[0]]["slowest_share_s"]
        for n in counts:
            seconds[n]["speedup"] = round(base / seconds[n]["slowest_share_s"], 3)
        out["template_work"] = seconds
        if not cli:
            out["cli"] = "skipped: prefect is not importable here"
            return out
        env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        if not dry:  # the first run after an install pays for Python's byte-compiling: not a worker's cost
            workers_scaling.timed_run(
                workers_scaling.focus_like_spec(root / "warm-up", 1), root / "warm-up" / "out", 1, env
            )
        runs = {}
        for n in counts:
            wall, _, cpu = workers_scaling.timed_run(spec, root / f"cli-{n}", n, env)
            runs[n] = {"wall_s": round(wall, 2), "cores_used": round(cpu / wall, 2)}
        for n in counts:
            runs[n]["speedup"] = round(runs[counts[0]]["wall_s"] / runs[n]["wall_s"], 3)
        out["cli"] = runs
    return out


#: the dry run's pipeline area (``gpu_qwen.py --area``)
DRY_AREA_PX = 256 * 256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny configs on the CPU (every step, same keys)")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "device-check")
    parser.add_argument("--wheels", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default 40; 2 with --dry-run)")
    parser.add_argument("--size", type=int, default=None, help="source side (default 1024; 128 with --dry-run)")
    parser.add_argument("--job-edits", type=int, default=None, help="batch-job edits (default 4; 1 with --dry-run)")
    parser.add_argument("--offload-steps", type=int, default=None, help="steps of the CPU-offload edit (default 8)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="default 1 2 4 8 (1 2 with --dry-run)")
    parser.add_argument("--templates", type=int, default=None, help="workers' templates (default 16; 2 dry)")
    args = parser.parse_args(argv)
    dry = args.dry_run
    steps = args.steps or (1 if dry else 40)
    size = args.size or (128 if dry else 1024)
    job = args.job_edits if args.job_edits is not None else (1 if dry else 4)
    offload_steps = args.offload_steps or (2 if dry else 8)
    counts = args.workers or ([1, 2] if dry else [1, 2, 4, 8])
    templates = args.templates or (2 if dry else 16)
    report = Report(args.out, "dry-run" if dry else "gpu")
    report.data["settings"] = {
        "steps": steps, "size": size, "job_edits": job, "offload_steps": offload_steps, "workers": counts,
        "templates": templates,
    }  # fmt: skip
    env = report.step("environment", environment)
    report.step("carry", carry, args.wheels)
    import torch

    cuda = torch.cuda.is_available() and not dry
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    if not dry and not cuda:
        report.step("build", lambda: {"status": "failed", "error": "no CUDA device: run with --dry-run on a CPU"})
        return 1
    work = Path(tempfile.mkdtemp(prefix="cf-device-check-"))
    folders = {k: write_model_folder(work / k, v, full=not dry) for k, v in PIPELINES.items()}
    common = ["--device", device, "--dtype", dtype, "--size", str(size), "--steps", str(steps)]
    if dry:
        # 256 x 256 instead of diffusers' 1024 x 1024: the tiny pipeline's CPU edits take about a
        # second instead of 20 (the steps and keys are the same; the figures are no editor's)
        common += ["--true-cfg-scale", "1.0", "--area", str(DRY_AREA_PX)]
    if report.step("build", build, not dry, device, dtype):
        for batch in (1, 2):
            report.step(
                f"qwen_batch{batch}",
                qwen,
                folders["edit"],
                [*common, "--repeats", "1", "--warmup", "0", "--batch-size", str(batch),
                 "--job-edits", str(max(job, batch)), "--cpu-workers", "2"],
            )  # fmt: skip
        report.step(
            "qwen_edit_plus",
            qwen,
            folders["edit_plus"],
            [*common, "--repeats", "1", "--warmup", "0", "--job-edits", "0"],
        )
        offload = [a if a != str(steps) else str(offload_steps) for a in common]
        if cuda:
            report.step(
                "cpu_offload",
                qwen,
                folders["edit"],
                [*offload, "--cpu-offload", "--repeats", "1", "--warmup", "0", "--job-edits", "0"],
            )
        else:  # enable_model_cpu_offload moves modules between the CPU and a GPU: nothing to run here
            report.step("cpu_offload", lambda: {"status": "skipped", "reason": "needs CUDA (dry run)"})
    _COMPONENTS.clear()
    if cuda:
        torch.cuda.empty_cache()
    from tests.generation.conftest_qwen import build_tiny_qwen_pipeline

    tiny = work / "tiny-saved"
    build_tiny_qwen_pipeline(tiny)
    report.step("ray", ray_step, tiny, device, "float32", 1 if cuda else 0, 1, work)
    prefect_ok = not str((env or {}).get("packages", {}).get("prefect", "missing")).startswith("missing")
    report.step("workers", workers, counts, templates, prefect_ok, dry=dry)
    report.data["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report._write()
    print(f"[device_check] wrote {report.json_path} and {report.text_path}")
    return 0 if all(s["status"] != "failed" for s in report.data["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
