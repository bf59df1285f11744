"""Cost of publishing a release on the Hub: export, push and pull, against re-hashing it.

Every step has to read each byte of the release at least once, and ``verify`` (sha256 of every
file) is exactly that; so the reference is one ``verify`` pass over the same release, timed in
the same run. Printed ratios:

- export / verify: writing the Parquet shards (images embedded) and the card;
- push / verify and pull / verify: the whole ``release push`` and ``release pull`` through the
  real ``huggingface_hub`` client against the local Hub of ``tests/manifests/hub_server.py``
  (loopback, so this is the client's and the format's cost, not the network's);
- the bytes a push sends per release byte (the release itself plus its images again, embedded
  in Parquet) and the process's peak resident memory.

Usage (from the repository root)::

    .venv/bin/python benchmarks/hub_export.py [--release DIR/releases/NAME/VERSION] [--repeat 3]

Without ``--release`` it builds the small test release from the bundled photos.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, help="a sealed release folder (default: the test release)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    hf_constants = importlib.import_module("huggingface_hub.constants")
    hf_utils = importlib.import_module("huggingface_hub.utils")
    hf_constants.HF_HUB_DISABLE_XET = True  # the local Hub speaks LFS, not Xet
    hf_utils.disable_progress_bars()
    from counterfactory.flows.engine.verify import verify_release
    from counterfactory.manifests.hub import export_release, pull_release, push_release
    from tests.manifests.hub_release import make_release
    from tests.manifests.hub_server import HubServer

    scratch = Path(tempfile.mkdtemp(prefix="cf-hub-bench-"))
    try:
        release = args.release or make_release(scratch / "built")
        size = sum(p.stat().st_size for p in release.rglob("*") if p.is_file())
        verify_s = best_of(args.repeat, lambda: verify_release(release))

        def export() -> None:
            out = scratch / "export"
            shutil.rmtree(out, ignore_errors=True)
            export_release(release, out, repo_id="bench/set", copy_release=False)

        export_s = best_of(args.repeat, export)
        with HubServer() as hub:
            runs = iter(range(10**6))

            def push() -> None:
                hub.lfs.clear()  # content-addressed store: without this later pushes would upload nothing
                push_release(release, f"bench/set{next(runs)}", token=hub.token, endpoint=hub.endpoint)

            push_s = best_of(args.repeat, push)
            sent = sum(len(b) for b in hub.lfs.values())

            def pull() -> None:
                out = scratch / "pulled"
                shutil.rmtree(out, ignore_errors=True)
                pull_release("bench/set0@" + release.name, out, endpoint=hub.endpoint)

            pull_s = best_of(args.repeat, pull)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"release: {release} ({size / 1e6:.1f} MB)")
        print(f"verify (reference): {verify_s:.2f} s")
        print(f"export: {export_s:.2f} s  ratio export/verify {export_s / verify_s:.1f}")
        print(f"push:   {push_s:.2f} s  ratio push/verify {push_s / verify_s:.1f}")
        print(f"pull:   {pull_s:.2f} s  ratio pull/verify {pull_s / verify_s:.1f}")
        print(f"LFS bytes sent per release byte: {sent / size:.2f}; peak RSS {peak_mb:.0f} MB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
