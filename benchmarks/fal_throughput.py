"""Throughput of FalEditor against the local fake fal queue, with concurrency = batch size.

A batch of N requests against a server that takes L seconds per request should, with all N
in flight at once, finish in about L seconds: the ideal throughput is N / L requests per
second. The ratio of measured to ideal throughput is what the editor's own work costs
(polling granularity, TLS, PNG encode/decode, JSON, journal writes); the target is >= 0.9.

The fake server runs in its own process (``python -m tests.generation.fal_server``), on
127.0.0.1 over HTTPS, so its CPU is not charged to the editor; the editor's own CPU seconds
per request are printed beside the ratio. Inputs are smooth synthetic images, which
compress like photographs (noise would make PNG encoding the benchmark).

Usage (from the repository root)::

    .venv/bin/python benchmarks/fal_throughput.py [--latency 5 2] [--sizes 1 8 32 64]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]


def synthetic_image(index: int, side: int) -> np.ndarray:
    """A ``(side, side, 3)`` ``uint8`` image of shifted gradients, distinct per ``index``."""
    yy, xx = np.mgrid[0:side, 0:side]
    channels = [(xx + index) % 256, (2 * yy + index) % 256, ((xx + yy) // 2 + 3 * index) % 256]
    return np.stack(channels, axis=-1).astype(np.uint8)


def run_batch(n: int, latency_s: float, side: int, poll_s: float, control: httpx.Client) -> dict[str, float]:
    """One batch of ``n`` distinct requests at concurrency ``n`` against latency ``latency_s``.

    Returns wall seconds, throughput (requests/s), the ideal ``n / latency_s``, their ratio,
    the editor process's CPU seconds per request and the server's max requests in flight.
    """
    from counterfactory.generation.editors.base import EditRequest, MemoryJournal
    from counterfactory.generation.editors.fal import FalEditor, FalOptions

    control.post("/_fake/reset", json={"latency_s": latency_s}).raise_for_status()
    requests = [EditRequest(f"bench-{n}-{i}", synthetic_image(i, side), f"benchmark edit {n}/{i}", i) for i in range(n)]
    editor = FalEditor(FalOptions(concurrency=n, poll_interval_s=poll_s, timeout_s=max(60.0, 10 * latency_s)))
    editor.prepare()  # the key probe is set-up, not throughput
    cpu0, started = os.times(), time.perf_counter()
    results = editor.edit_many(requests, journal=MemoryJournal())
    wall, cpu1 = time.perf_counter() - started, os.times()
    failed = [r.reason for r in results if r.status != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} of {n} requests failed, first: {failed[0]}")
    stats = control.get("/_fake/stats").json()
    if stats["paid_submits"] != n or stats["max_paid_per_payload"] != 1:
        raise SystemExit(f"expected {n} submissions, one per payload: {stats}")
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "n": n,
        "wall_s": wall,
        "throughput": n / wall,
        "ideal": n / latency_s,
        "ratio": latency_s / wall,
        "cpu_ms_per_request": 1000 * cpu / n,
        "max_in_flight": stats["max_in_flight"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--latency",
        type=float,
        nargs="+",
        default=[5.0, 2.0],
        help="server seconds per request (L), one table per value",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 64], help="batch sizes N")
    parser.add_argument("--image", type=int, default=256, help="side of the square inputs, px")
    parser.add_argument("--poll", type=float, default=None, help="poll_interval_s (default: FalOptions')")
    args = parser.parse_args()
    from counterfactory.generation.editors.fal import FalOptions

    poll = args.poll if args.poll is not None else FalOptions().poll_interval_s

    server = subprocess.Popen(
        [sys.executable, "-m", "tests.generation.fal_server"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        env = json.loads(server.stdout.readline())
        os.environ.update(env)  # before fal-client is first imported: it reads hosts then
        sys.path.insert(0, str(REPO))
        trust = ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
        with httpx.Client(base_url=f"https://{env['FAL_QUEUE_RUN_HOST']}", verify=trust) as control:
            print(
                f"{os.cpu_count()} CPUs; inputs {args.image}x{args.image} PNG; "
                f"poll_interval_s = {poll:g}; concurrency = N"
            )
            for latency in args.latency:
                print(f"\nL = {latency:g} s")
                print(
                    f"{'N':>4} {'wall s':>7} {'req/s':>7} {'ideal':>7} {'ratio':>6} "
                    f"{'cpu ms/req':>10} {'max in flight':>13}"
                )
                for n in args.sizes:
                    row = run_batch(n, latency, args.image, poll, control)
                    print(
                        f"{n:>4} {row['wall_s']:>7.3f} {row['throughput']:>7.2f} "
                        f"{row['ideal']:>7.2f} {row['ratio']:>6.3f} "
                        f"{row['cpu_ms_per_request']:>10.1f} {row['max_in_flight']:>13}"
                    )
    finally:
        server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
