"""``counterfactory ask`` against an OpenAI-compatible stand-in with a fixed latency per request.

For each concurrency K: answers per second against the ideal K / L (L the stand-in's latency),
the most requests the stand-in saw in flight (never above K), and the client's own CPU seconds
per answer (the ``ask`` process's user + system time, less that of a re-run that asks nothing,
so start-up is not counted). The release is synthetic (one small PNG, N single-image trials);
the stand-in is :mod:`tests.validation.standin_vlm` on 127.0.0.1.

    python benchmarks/ask_throughput.py --trials 400 --latency 0.2 --concurrency 1 4 16
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.validation.standin_vlm import StandIn, synthetic_release  # noqa: E402


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_ask(release: Path, base_url: str, ledger: Path, concurrency: int) -> tuple[str, float]:
    env = dict(os.environ, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "counterfactory", "ask", str(release), "--model", "null", "--base-url", base_url]
    cmd += ["--ledger", str(ledger), "--concurrency", str(concurrency)]
    before = _child_cpu()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return done.stdout, _child_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request at the stand-in")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ask-bench-") as tmp:
        release = synthetic_release(Path(tmp), args.trials)
        # no injected 503s here: each would cost a retry and its backoff
        server = StandIn({}, latency_s=args.latency, flaky=0.0).start()
        try:
            for k in args.concurrency:
                server.reset_counts()
                ledger = Path(tmp) / f"answers-{k}.sqlite"
                out, cpu = run_ask(release, server.base_url, ledger, k)
                m = re.search(r"(\d+) asked, .* ([\d.]+) s ->", out)
                asked, seconds = int(m.group(1)), float(m.group(2))
                _, cpu_noop = run_ask(release, server.base_url, ledger, k)
                rate, ideal = asked / seconds, k / args.latency
                print(
                    f"concurrency {k:3d}: {asked} answers in {seconds:.1f} s = {rate:.1f}/s, ideal {ideal:.1f}/s, "
                    f"ratio {rate / ideal:.3f}; max in flight {server.max_in_flight}; "
                    f"client CPU {1000 * max(cpu - cpu_noop, 0.0) / asked:.2f} ms/answer"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
