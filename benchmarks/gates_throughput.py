"""Throughput of the whole gate stack, its overhead over the models alone, and its scaling.

Runs ``GateStack.evaluate`` over a folder of pairs and reports, in one run:

1. overhead: the models the stack calls are timed alone, interleaved with the full stack on
   the same pairs; the ratio is total stack time / total model time (target: <= 1.3). As in a
   run, where every cell of a template is judged against one source, consecutive pairs of the
   same source share its analysis: the source's models (landmarker, face detector, identity
   embedder, AU model, the selfie segmenter of the skin-tone and body-skin measures) run
   once per source, the candidate's (landmarker, detector, embedder, AU model) once per pair,
   on both sides of the ratio;
2. throughput of one worker process (pairs/s, images/s), stack only;
3. throughput of ``--workers`` processes over the same pairs (target with 2: >= 1.7 x one);
4. the cohort floor's cost per candidate, on its own line: the leave-one-out medians of a
   source's candidates and the judgement against them, beside the same candidates judged
   against a request floor (the reference);
5. the re-render step's cost per edit, on its own: the ``classical`` editor's TAEF2 round
   trip (:mod:`counterfactory.generation.rerender`) over each source photo at the editor's
   ``rerender_max_side`` (``--rerender-side``; ``--rerender-repeat 0`` skips it). It is the
   editor's cost, not the gates': it is not in the ratio above.

Face pairs are judged as a run judges a template's cells: against the editor's noise-floor
output of their source (here the source re-encoded as JPEG at quality 85, standing in for an
editor's "return this photo unchanged"; the locality gate compares each candidate with it
pixel by pixel, whatever its pixels, so the cost is a run's).

Each worker uses one intra-op thread per library and loads its models once before the
clock starts. Image decoding is not timed (the stack receives arrays); as a run does, the
stack finds a source's cached analysis by the sha256 of the source file.

A pairs folder holds ``<id>_source.<ext>`` and ``<id>_candidate.<ext>`` (and, for limb
pairs, ``<id>_mask.png``); pairs whose source files are byte-identical share one source.
Without ``--pairs`` a demo folder is built from the bundled photos: ``--per-source`` candidates
of each photo (default 8, the cells of a template), cycling through face-only edits (another
person's features blended into the face mask, a skin-tone shift), a JPEG re-encode and an
exact copy.

    .venv/bin/python benchmarks/gates_throughput.py --workers 2 --repeat 3
    .venv/bin/python benchmarks/gates_throughput.py --pairs PAIRS_DIR --kind limb --json out.json
    .venv/bin/python benchmarks/gates_throughput.py --profile --repeat 1   # where the stack's time goes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")


def find_pairs(folder: Path) -> list[tuple[str, Path, Path, Path | None]]:
    """``(id, source, candidate, mask or None)`` for every ``<id>_source.*`` in ``folder``."""
    pairs = []
    for src in sorted(folder.iterdir()):
        if src.suffix.lower() not in IMAGE_EXTS or not src.stem.endswith("_source"):
            continue
        pid = src.stem[: -len("_source")]
        cands = [p for p in folder.glob(f"{pid}_candidate.*") if p.suffix.lower() in IMAGE_EXTS]
        if not cands:
            continue
        mask = folder / f"{pid}_mask.png"
        pairs.append((pid, src, cands[0], mask if mask.is_file() else None))
    return pairs


def build_demo_pairs(folder: Path, per_source: int = 8) -> Path:
    """Face-edit demo pairs from the bundled single-face photos (see the module docstring)."""
    import cv2

    from counterfactory.generation.masks import feather
    from counterfactory.validation.backends.base import similarity_transform
    from counterfactory.validation.calibration.base import bundled_photo_paths, load_rgb
    from counterfactory.validation.faces import face_mask, get_face_landmarker

    folder.mkdir(parents=True, exist_ok=True)
    landmarker = get_face_landmarker()
    photos = {}
    for path in bundled_photo_paths():
        image = load_rgb(path)
        faces = landmarker.detect(image)
        if len(faces) == 1:
            photos[path.stem] = (image, faces[0])
    names = sorted(photos)

    def save(name: str, image: np.ndarray) -> None:
        cv2.imwrite(str(folder / name), np.ascontiguousarray(image[:, :, ::-1]))

    for i, name in enumerate(names):
        image, face = photos[name]
        alpha = feather(face_mask(face.landmarks, image.shape[:2], mode="skin"), 8)[..., None]
        save(f"{name}_source.png", image)
        for j in range(per_source):
            kind = ("paste", "tone", "jpeg", "copy")[j % 4]
            variant = j // 4
            if kind == "paste":
                donor_image, donor_face = photos[names[(i + 1 + variant) % len(names)]]
                m = similarity_transform(donor_face.keypoints5(), face.keypoints5())
                pasted = cv2.warpAffine(donor_image, m, image.shape[1::-1], flags=cv2.INTER_LINEAR)
                cand = alpha * pasted + (1 - alpha) * image
            elif kind == "tone":
                hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV).astype(np.int16)
                hsv[..., 2] = np.clip(hsv[..., 2] - 40 + 25 * variant, 0, 255)
                toned = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)
                cand = alpha * toned + (1 - alpha) * image
            elif kind == "jpeg":
                ok, buf = cv2.imencode(".jpg", image[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 75 + 10 * variant])
                cand = cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1]
            else:
                cand = image
            pid = f"{name}-{j:02d}{kind}"
            # the source is written once and linked: pairs of one source share its file
            os.link(folder / f"{name}_source.png", folder / f"{pid}_source.png")
            save(f"{pid}_candidate.png", np.round(cand).astype(np.uint8))
        (folder / f"{name}_source.png").unlink()
    return folder


# --- worker side ------------------------------------------------------------------------

_stack = None
_pairs: list = []


def _init_worker(pair_files, kind: str, face_mask_mode: str) -> None:
    """Load the models and the images once, one intra-op thread per library; pairs whose
    source files hold the same bytes share one source array, as a template's cells do."""
    global _stack, _pairs
    import hashlib

    from counterfactory.validation.backends import set_worker_threads

    set_worker_threads(1)
    import cv2

    from counterfactory.validation.calibration.base import load_rgb
    from counterfactory.validation.gate_stack import GatesConfig, GateStack
    from counterfactory.validation.gates.locality import FLOOR_CONTEXT, FLOOR_IMAGE, FloorContext

    _stack = GateStack.from_config(GatesConfig(face_mask=face_mask_mode), kind)
    _pairs = []
    sources: dict[str, np.ndarray] = {}
    floors: dict[str, dict] = {}
    for _, src, cand, mask in pair_files:
        edit = None
        if mask is not None:
            edit = cv2.imread(str(mask), cv2.IMREAD_GRAYSCALE)
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        if digest not in sources:
            sources[digest] = load_rgb(src)
            floors[digest] = {}
            if kind == "face":
                ok, buf = cv2.imencode(".jpg", sources[digest][:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85])
                floor = np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1])
                # one context per source's floor, as a run's TemplateJudge holds one per template
                floors[digest] = {FLOOR_IMAGE: floor, FLOOR_CONTEXT: FloorContext(floor)}
        _pairs.append((sources[digest], load_rgb(cand), edit, digest, floors[digest]))
    for source, candidate, edit, _, extras in _pairs[:2]:  # warm up every model
        _stack.evaluate(source, candidate, edit_mask=edit, extras=extras)
        _source_models(source)
        _candidate_models(candidate, _source_face(source))
    _stack.sources.clear()


def _source_face(source: np.ndarray):
    faces = _stack.landmarker.detect(source)
    return faces[0] if faces else None


def _source_models(source: np.ndarray):
    """The model calls :meth:`GateStack.analyse_source` makes, once per source; returns its face."""
    from counterfactory.validation.gates.expression import ExpressionGate
    from counterfactory.validation.gates.face import FaceGate
    from counterfactory.validation.gates.identity import IdentityGate
    from counterfactory.validation.segment import work_stride

    face = _source_face(source)
    if face is not None and _stack.wants_person_mask():
        k = work_stride(source.shape)  # the segmenter sees the strided working copy
        _stack.segmenter.segment(np.ascontiguousarray(source[::k, ::k]))
    for gate in _stack.gates:
        if isinstance(gate, FaceGate):
            gate.detector.detect(source)
        elif isinstance(gate, IdentityGate) and face is not None:
            gate.embedder.embed(source, face.keypoints5())
        elif isinstance(gate, ExpressionGate) and face is not None:
            gate.au_model.estimate(source, face)
    return face


def _candidate_models(candidate: np.ndarray, src_face) -> None:
    """The model calls ``GateStack.evaluate`` makes on one candidate, and nothing else."""
    from counterfactory.validation.faces import nearest_face
    from counterfactory.validation.gates.expression import ExpressionGate
    from counterfactory.validation.gates.face import FaceGate
    from counterfactory.validation.gates.identity import IdentityGate

    cand_faces = _stack.landmarker.detect(candidate)
    cand_face = nearest_face(src_face, cand_faces) if src_face is not None else None
    for gate in _stack.gates:
        if isinstance(gate, FaceGate):
            gate.detector.detect(candidate)
        elif isinstance(gate, IdentityGate) and src_face is not None and cand_face is not None:
            gate.embedder.embed(candidate, cand_face.keypoints5())
        elif isinstance(gate, ExpressionGate) and src_face is not None and cand_face is not None:
            gate.au_model.estimate(candidate, cand_face)


def _overhead(repeat: int) -> dict:
    """Interleave models-alone and whole-stack timings over every pair, ``repeat`` times.

    A source's models run (and its analysis is made) when a pair's source differs from the
    previous pair's, on both sides: the stack's cache is emptied at the same moment.
    """
    models = stack = 0.0
    verdicts: dict[str, int] = {}
    sources = 0
    for r in range(repeat):
        previous = None
        src_face = None
        for i, (source, candidate, edit, digest, extras) in enumerate(_pairs):
            new_source = digest != previous
            previous = digest
            if new_source:
                sources += 1
                _stack.sources.clear()
            order = (r + i) % 2  # alternate which goes first, so neither gets a warmer cache
            for step in (0, 1) if order == 0 else (1, 0):
                t = time.perf_counter()
                if step == 0:
                    if new_source:
                        src_face = _source_models(source)
                    _candidate_models(candidate, src_face)
                    models += time.perf_counter() - t
                else:
                    judgement = _stack.evaluate(source, candidate, edit_mask=edit, source_key=digest, extras=extras)
                    stack += time.perf_counter() - t
                    if r == 0:
                        verdicts[judgement.verdict] = verdicts.get(judgement.verdict, 0) + 1
    return {
        "models_s": models,
        "stack_s": stack,
        "pairs": repeat * len(_pairs),
        "sources": sources,
        "verdicts": verdicts,
    }


def _profile(repeat: int, top: int) -> dict:
    """Where the stack's time goes, per pair: explicit timers around each step of
    :meth:`GateStack.evaluate` (the source's analysis, once per source; the candidate's landmarks;
    each gate), then the same passes under cProfile for each function of the package's
    ``validation`` layer (measures, gates, models), by cumulative time. The timed pass runs
    without the profiler, so its figures are the stack's own; the profiled pass's are inflated
    alike for every function and only rank them."""
    import cProfile
    import pstats

    def passes(timers: dict[str, float] | None) -> int:
        pairs = 0
        for _ in range(repeat):
            previous = None
            for source, candidate, edit, digest, extras in _pairs:
                if digest != previous:
                    _stack.sources.clear()
                    previous = digest
                t = time.perf_counter()
                analysis = _stack.analysis_for(source, key=digest)
                t1 = time.perf_counter()
                pair = _stack.context(source, candidate, edit_mask=edit, extras=extras, analysis=analysis)
                t2 = time.perf_counter()
                if timers is not None:
                    timers["source analysis (once per source)"] += t1 - t
                    timers["candidate landmarks"] += t2 - t1
                for gate in _stack.gates:
                    t = time.perf_counter()
                    gate(pair)
                    if timers is not None:
                        timers[f"gate {gate.name}"] += time.perf_counter() - t
                pairs += 1
        return pairs

    steps = ["source analysis (once per source)", "candidate landmarks"] + [f"gate {g.name}" for g in _stack.gates]
    timers = dict.fromkeys(steps, 0.0)
    pairs = passes(timers)
    profiler = cProfile.Profile()
    profiler.enable()
    passes(None)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    root = str(REPO / "validation")
    functions = []
    for (path, _line, name), (_, calls, _, cumulative, _) in stats.items():
        if path.startswith(root):
            where = Path(path).relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
            functions.append(
                {
                    "function": f"{where}.{name}",
                    "calls_per_pair": calls / pairs,
                    "ms_per_pair": 1000 * cumulative / pairs,
                }
            )
    functions.sort(key=lambda f: -f["ms_per_pair"])
    return {
        "pairs": pairs,
        "steps_ms_per_pair": {k: 1000 * v / pairs for k, v in timers.items()},
        "functions": functions[:top],
    }


def _run_profile(pair_files, kind: str, mode: str, repeat: int, top: int) -> dict:
    with mp.get_context("spawn").Pool(1, initializer=_init_worker, initargs=(pair_files, kind, mode)) as pool:
        return pool.apply(_profile, (repeat, top))


def _cohort_cost(repeat: int) -> dict:
    """The cohort floor's cost per candidate, on its own: for each source, the leave-one-out
    medians of its candidates on the working grid (:func:`~counterfactory.validation.cohort.cohort_floors`),
    then every candidate judged with its cohort floor, interleaved with the same candidate judged
    against the request floor (the reference, as above). The candidates are the demo's (already
    in the source's frame), so registration is not in either figure."""
    from counterfactory.validation.cohort import cohort_floors
    from counterfactory.validation.gates.locality import FLOOR_WORK_IMAGE
    from counterfactory.validation.segment import work_stride

    by_source: dict[str, list] = {}
    for source, candidate, edit, digest, extras in _pairs:
        by_source.setdefault(digest, []).append((source, candidate, edit, extras))
    floors_s = cohort_s = request_s = 0.0
    n = 0
    for r in range(repeat):
        for digest, members in by_source.items():
            k = work_stride(members[0][0].shape)
            t = time.perf_counter()
            floors = cohort_floors([c[::k, ::k] for _, c, _, _ in members])
            floors_s += time.perf_counter() - t
            _stack.sources.clear()
            for i, ((source, candidate, edit, extras), floor) in enumerate(zip(members, floors)):
                cohort = (
                    {"noise_floor": {"path": "cohort", "members": floor.members}, FLOOR_WORK_IMAGE: floor.image}
                    if floor is not None
                    else None
                )
                for step in (0, 1) if (r + i) % 2 == 0 else (1, 0):
                    t = time.perf_counter()
                    if step == 0:
                        _stack.evaluate(source, candidate, edit_mask=edit, source_key=digest, extras=cohort)
                        cohort_s += time.perf_counter() - t
                    else:
                        _stack.evaluate(source, candidate, edit_mask=edit, source_key=digest, extras=extras)
                        request_s += time.perf_counter() - t
                n += 1
    return {
        "candidates": n,
        "floors_ms_per_candidate": 1000 * floors_s / max(n, 1),
        "cohort_judge_ms_per_candidate": 1000 * cohort_s / max(n, 1),
        "request_judge_ms_per_candidate": 1000 * request_s / max(n, 1),
    }


def _run_cohort(pair_files, kind: str, mode: str, repeat: int) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=_init_worker, initargs=(pair_files, kind, mode)) as pool:
        return pool.apply(_cohort_cost, (repeat,))


def _throughput(args) -> dict:
    """Stack only over this worker's share; start when every worker is ready."""
    indices, barrier = args
    barrier.wait()
    start = time.perf_counter()
    cpu = time.process_time()
    wall_start = time.time()
    for i in indices:
        source, candidate, edit, digest, extras = _pairs[i]
        _stack.evaluate(source, candidate, edit_mask=edit, source_key=digest, extras=extras)
    return {
        "start": wall_start,
        "end": wall_start + (time.perf_counter() - start),
        "cpu_s": time.process_time() - cpu,
        "pairs": len(indices),
    }


def _run_pool(workers: int, pair_files, kind: str, mode: str, total: int) -> dict:
    ctx = mp.get_context("spawn")  # MediaPipe's threads do not survive fork
    manager = ctx.Manager()
    barrier = manager.Barrier(workers)
    # contiguous shares: each worker judges whole templates, as a run's tasks do
    per = -(-total // workers)
    shares = [list(range(total))[w * per : (w + 1) * per] for w in range(workers)]
    shares = [[i % len(pair_files) for i in share] for share in shares]
    with ctx.Pool(workers, initializer=_init_worker, initargs=(pair_files, kind, mode)) as pool:
        results = pool.map(_throughput, [(share, barrier) for share in shares], chunksize=1)
    manager.shutdown()
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    pairs = sum(r["pairs"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    return {
        "workers": workers,
        "pairs": pairs,
        "wall_s": wall,
        "pairs_per_s": pairs / wall,
        "images_per_s": 2 * pairs / wall,
        # cores the workers actually got: below `workers` means other processes took CPU
        "cores_used": cpu / wall,
        "pairs_per_cpu_s": pairs / cpu,
        "load_average_1min": os.getloadavg()[0],
    }


def _run_overhead(pair_files, kind: str, mode: str, repeat: int) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=_init_worker, initargs=(pair_files, kind, mode)) as pool:
        return pool.apply(_overhead, (repeat,))


def rerender_cost(pair_files, max_side: int | None, repeat: int) -> dict:
    """Seconds per TAEF2 round trip of each distinct source in ``pair_files`` at ``max_side``
    (one warm-up call first, not timed), one intra-op thread as the workers above use."""
    from counterfactory.generation.rerender import Rerenderer
    from counterfactory.validation.calibration.base import load_rgb

    sources = {p[1].stat().st_ino: p[1] for p in pair_files}
    images = [load_rgb(path) for path in sources.values()]
    rr = Rerenderer(max_side=max_side, threads=1)
    rr(images[0])
    times, pixels = [], []
    for _ in range(repeat):
        for image in images:
            t0 = time.perf_counter()
            out = rr(image)
            times.append(time.perf_counter() - t0)
            pixels.append(out.shape[0] * out.shape[1])
    return {
        "max_side": max_side,
        "edits": len(times),
        "s_per_edit_mean": float(np.mean(times)),
        "s_per_edit_max": float(np.max(times)),
        "s_per_megapixel": float(np.sum(times) / (np.sum(pixels) / 1e6)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, help="folder of <id>_source / <id>_candidate images")
    parser.add_argument("--kind", choices=["face", "limb"], default="face")
    parser.add_argument("--face-mask", choices=["oval", "skin"], default="oval")
    parser.add_argument("--workers", type=int, default=2, help="processes for the scaling run")
    parser.add_argument("--repeat", type=int, default=3, help="passes over the pairs per measurement")
    parser.add_argument("--per-source", type=int, default=8, help="demo candidates per source photo")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--rerender-side", type=int, default=512, help="the re-render's long side (classical default)")
    parser.add_argument("--rerender-repeat", type=int, default=1, help="passes of the re-render timing (0: skip)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print where the stack's time goes (each step and gate, then the validation layer's functions) and stop",
    )
    parser.add_argument("--profile-top", type=int, default=30, help="functions listed by --profile")
    args = parser.parse_args(argv)

    if args.profile:
        with tempfile.TemporaryDirectory(prefix="cf-bench-") as tmp:
            folder = args.pairs or build_demo_pairs(Path(tmp) / "pairs", args.per_source)
            pair_files = find_pairs(folder)
            if not pair_files:
                parser.error(f"no <id>_source / <id>_candidate pairs in {folder}")
            profile = _run_profile(pair_files, args.kind, args.face_mask, args.repeat, args.profile_top)
        print(f"{profile['pairs']} pairs ({args.repeat} passes), kind={args.kind}; ms per pair, one thread:")
        for step, ms in profile["steps_ms_per_pair"].items():
            print(f"  {ms:8.2f}  {step}")
        print(f"  {sum(profile['steps_ms_per_pair'].values()):8.2f}  total")
        print("validation functions by cumulative time (profiled pass: ranks, inflated by the profiler):")
        for f in profile["functions"]:
            print(f"  {f['ms_per_pair']:8.2f}  {f['calls_per_pair']:6.2f} calls  {f['function']}")
        if args.json:
            args.json.write_text(json.dumps({"profile": profile}, indent=1) + "\n")
        return 0

    with tempfile.TemporaryDirectory(prefix="cf-bench-") as tmp:
        folder = args.pairs or build_demo_pairs(Path(tmp) / "pairs", args.per_source)
        pair_files = find_pairs(folder)
        if not pair_files:
            parser.error(f"no <id>_source / <id>_candidate pairs in {folder}")
        total = len(pair_files) * args.repeat
        print(
            f"{len(pair_files)} pairs ({len({p[1].stat().st_ino for p in pair_files})} source files) from {'bundled-photo demo' if args.pairs is None else folder}, "
            f"kind={args.kind}, {args.repeat} passes"
        )
        over = _run_overhead(pair_files, args.kind, args.face_mask, args.repeat)
        one = _run_pool(1, pair_files, args.kind, args.face_mask, total)
        many = _run_pool(args.workers, pair_files, args.kind, args.face_mask, total) if args.workers > 1 else one
        rerender = rerender_cost(pair_files, args.rerender_side, args.rerender_repeat) if args.rerender_repeat else None
        cohort = _run_cohort(pair_files, args.kind, args.face_mask, args.repeat) if args.kind == "face" else None

    ratio = over["stack_s"] / over["models_s"]
    speedup = many["pairs_per_s"] / one["pairs_per_s"]
    report = {
        "pairs": len(pair_files),
        "repeat": args.repeat,
        "sources_per_pass": over["sources"] // args.repeat,
        "kind": args.kind,
        "verdicts": over["verdicts"],
        "models_alone_ms_per_pair": 1000 * over["models_s"] / over["pairs"],
        "stack_ms_per_pair": 1000 * over["stack_s"] / over["pairs"],
        "stack_over_models": ratio,
        "one_worker": one,
        "workers": many,
        "speedup": speedup,
        "cpu_efficiency": many["pairs_per_cpu_s"] / one["pairs_per_cpu_s"],
        "cores_available": os.cpu_count(),
        "targets": {"stack_over_models_max": 1.3, "speedup_2_workers_min": 1.7},
        "rerender": rerender,
        "cohort_floor": cohort,
    }
    print(f"verdicts (first pass): {over['verdicts']}")
    print(
        f"models alone: {report['models_alone_ms_per_pair']:.1f} ms/pair; "
        f"whole stack: {report['stack_ms_per_pair']:.1f} ms/pair; "
        f"stack / models = {ratio:.3f} (target <= 1.3: {'ok' if ratio <= 1.3 else 'MISSED'})"
    )
    print(
        f"1 worker: {one['pairs_per_s']:.2f} pairs/s = {one['images_per_s']:.2f} images/s "
        f"(cores used {one['cores_used']:.2f}, load average {one['load_average_1min']:.1f})"
    )
    if args.workers > 1:
        print(
            f"{args.workers} workers: {many['pairs_per_s']:.2f} pairs/s = {many['images_per_s']:.2f} images/s "
            f"(cores used {many['cores_used']:.2f} of {os.cpu_count()}, load average {many['load_average_1min']:.1f}); "
            f"speedup {speedup:.2f} x (target with 2 >= 1.7: "
            f"{'ok' if speedup >= 1.7 or args.workers != 2 else 'MISSED'})"
        )
        efficiency = many["pairs_per_cpu_s"] / one["pairs_per_cpu_s"]
        print(
            f"  work per CPU-second, {args.workers} workers vs 1: {efficiency:.2f} "
            f"(1.00: the workers do not slow each other; speedup with free cores ~ {args.workers} x this)"
        )
        if many["cores_used"] < 0.9 * min(args.workers, os.cpu_count() or 1):
            print(
                f"  note: the {args.workers} workers got {many['cores_used']:.2f} cores between them; "
                "other processes were using the CPU, so this speedup understates the stack's scaling"
            )
    if rerender is not None:
        print(
            f"re-render (TAEF2 round trip, the editor's step, not the gates'): "
            f"{rerender['s_per_edit_mean']:.2f} s per edit (max {rerender['s_per_edit_max']:.2f}) at a long side of "
            f"{rerender['max_side']}, {rerender['s_per_megapixel']:.2f} s per megapixel, one thread"
        )
    if cohort is not None:
        total = cohort["floors_ms_per_candidate"] + cohort["cohort_judge_ms_per_candidate"]
        print(
            f"cohort floor (no floor request; each candidate against the median of its source's others): "
            f"{cohort['floors_ms_per_candidate']:.1f} ms per candidate for the medians, judged "
            f"{cohort['cohort_judge_ms_per_candidate']:.1f} ms vs {cohort['request_judge_ms_per_candidate']:.1f} ms "
            f"against a request floor: cohort / request = {total / cohort['request_judge_ms_per_candidate']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
