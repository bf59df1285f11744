"""Fingerprints of finished runs, recorded once from a known-good engine and compared after changes.

A fingerprint is what a run decided, read back from its ``--out`` folder:

- ``attempts``: every ledger attempt row (attempt id, cell, attempt number, seed, status, output
  sha256, reason), sorted by attempt id;
- ``candidates``: every judged candidate (attempt id, aligned image sha256, verdict, reasons,
  judge key), sorted by attempt id;
- ``release``: every file of the sealed release with its sha256 from ``checksums.sha256``, where
  the three files that also say *when* and *by which run* the release was sealed are hashed with
  that one field taken out (:data:`NORMALISED`).

Scenarios run the real command line as a user runs it (``python -m counterfactory run SPEC --out
DIR --publish --allow-incomplete``). ``python -m tests.flows.unchanged record`` re-runs every
scenario and writes ``tests/data/unchanged/<scenario>.json``; do that only when a change of
behaviour is intended, and say so in the commit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "unchanged"
RE_RECORD = "python -m tests.flows.unchanged record"


@dataclass(frozen=True)
class Scenario:
    """One recorded run: its spec, and its release's folder under ``--out``."""

    name: str
    spec: Path
    release: str  # releases/<name>/<version>

    @property
    def record_path(self) -> Path:
        return DATA / f"{self.name}.json"


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("demo-face", REPO / "assets" / "specs" / "demo-face.yaml", "releases/demo-face/0.1.0"),
        Scenario("demo-limb", REPO / "assets" / "specs" / "demo-limb.yaml", "releases/demo-limb/0.1.0"),
        Scenario("focus-classical", DATA / "focus-classical.yaml", "releases/focus-classical/0.1.0"),
    )
}
#: the SIGKILL-and-resume scenario runs this one and must end with its recorded fingerprint
KILLED = "demo-face"

#: Release files whose bytes record the sealing itself, not what the release says about its items,
#: and the one thing each is hashed without (everything else of them stays in the fingerprint):
#:
#: - ``release.json``'s ``created_at`` is the wall-clock time of sealing;
#: - ``stats.json``'s ``editor_calls_this_run`` counts the calls of the run that sealed it, so a run
#:   resumed after a kill (or a re-run over a settled ledger) writes a smaller number for the same
#:   items; the attempts table and ``editor_calls`` below keep the uninterrupted count;
#: - ``report.html`` prints that same count in one sentence.
#:
#: ``flows.publish.release_inputs_key`` leaves out exactly these two for the same reason. Found by
#: running each scenario twice into two folders and diffing: no other file differed.
NORMALISED = {
    "release.json": "created_at removed",
    "stats.json": "editor_calls_this_run removed",
    "report.html": "the editor-calls sentence's number replaced by N",
}
_REPORT_CALLS = re.compile(rb"(Editor calls in the run that wrote this release: )\d+(\.)")


def cli_env() -> dict[str, str]:
    """The environment the scenarios run in: the user's, with Prefect kept local and quiet.

    Each call gets its own ``PREFECT_HOME`` so that runs never share Prefect's state.
    """
    env = dict(os.environ)
    env["PREFECT_HOME"] = tempfile.mkdtemp(prefix="cf-unchanged-prefect-")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_LOGGING_LEVEL"] = "WARNING"
    return env


def command(spec: Path, out: Path, *extra: str) -> list[str]:
    """The README's demo command for ``spec`` into ``out``."""
    return [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(out), "--no-progress",
            "--publish", "--allow-incomplete", *extra]  # fmt: skip


def run_cli(spec: Path, out: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the command to completion; raises with the end of its output if it fails."""
    done = subprocess.run(
        command(spec, out, *extra), cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(done.args)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    return done


def _ledger(out: Path) -> sqlite3.Connection:
    # read-only: a plain connect would create an empty ledger, and the project's Ledger class
    # upgrades the schema on open, which a fingerprint must never do
    return sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode=ro", uri=True)


def finished_attempts(out: Path) -> int:
    """How many attempts the ledger under ``out`` holds as finished (0 while it does not exist)."""
    if not (out / "ledger.sqlite").exists():
        return 0
    try:
        with _ledger(out) as db:
            return db.execute("select count(*) from attempts where status != 'running'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet, or its schema is being written
        return 0


def kill_and_resume(scenario: Scenario, out: Path, *, minimum: int = 6, timeout: float = 600) -> int:
    """Start ``scenario``'s run, SIGKILL its process group once ``minimum`` attempts are finished and
    before it ends, then run the same command again to completion.

    The first run has one worker, so that it is still editing when the kill comes. Returns how
    many attempts were finished at the kill.

    Raises:
        AssertionError: the first run ended (or timed out) before it could be killed.
    """
    proc = subprocess.Popen(
        command(scenario.spec, out, "--workers", "1"),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the kill takes Prefect's temporary server with it
    )
    try:
        deadline = time.monotonic() + timeout
        while finished_attempts(out) < minimum:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the run ended or stalled before {minimum} attempts finished: nothing to kill")
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    at_kill = finished_attempts(out)
    if (out / scenario.release).exists():
        raise AssertionError("the run sealed its release before the kill: it was not interrupted")
    run_cli(scenario.spec, out)
    return at_kill


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normalised(name: str, data: bytes) -> bytes:
    if name == "release.json":
        info = json.loads(data)
        info.pop("created_at")
        return json.dumps(info, sort_keys=True).encode()
    if name == "stats.json":
        stats = json.loads(data)
        stats.pop("editor_calls_this_run")
        return json.dumps(stats, sort_keys=True).encode()
    if name == "report.html":
        changed, n = _REPORT_CALLS.subn(rb"\1N\2", data)
        if n != 1:
            raise AssertionError(f"report.html: expected one editor-calls sentence, found {n}")
        return changed
    raise KeyError(name)


def release_fingerprint(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of a sealed release, from its ``checksums.sha256``.

    The files of :data:`NORMALISED` are hashed as normalised (their key gets ``#normalised``);
    every listed file is re-hashed, so a checksum file that does not match its folder fails here.
    """
    listed: dict[str, str] = {}
    for line in (folder / "checksums.sha256").read_text(encoding="utf-8").splitlines():
        digest, relative = line.split("  ", 1)
        data = (folder / relative).read_bytes()
        if _sha(data) != digest:
            raise AssertionError(f"{folder / relative}: sha256 differs from checksums.sha256")
        if relative in NORMALISED:
            listed[f"{relative}#normalised"] = _sha(_normalised(relative, data))
        else:
            listed[relative] = digest
    missing = set(NORMALISED) - {k.split("#")[0] for k in listed}
    if missing:
        raise AssertionError(f"{folder}: checksums.sha256 lists none of {sorted(missing)}")
    return dict(sorted(listed.items()))


def fingerprint(out: Path, scenario: Scenario) -> dict[str, Any]:
    """What the run under ``out`` decided: its attempts, candidates and release (module docstring)."""
    with _ledger(out) as db:
        attempts = [
            {"attempt_id": a, "cell_id": c, "attempt_no": n, "seed": s, "status": st, "output_sha256": o, "reason": r}
            for a, c, n, s, st, o, r in db.execute(
                "select attempt_id, cell_id, attempt_no, seed, status, output_sha256, reason "
                "from attempts order by attempt_id"
            )
        ]
        candidates = [
            {"attempt_id": a, "image_sha256": i, "verdict": v, "reasons": json.loads(r) if r else r, "judge_key": k}
            for a, i, v, r, k in db.execute(
                "select attempt_id, image_sha256, verdict, reasons, judge_key from candidates order by attempt_id"
            )
        ]
    return {"attempts": attempts, "candidates": candidates, "release": release_fingerprint(out / scenario.release)}


def editor_calls(out: Path, scenario: Scenario) -> int:
    """The editor calls the run that sealed the release made (``stats.json``), which only an
    uninterrupted run on an empty folder pins."""
    return json.loads((out / scenario.release / "stats.json").read_text())["editor_calls_this_run"]


def differences(live: dict[str, Any], recorded: dict[str, Any], limit: int = 5) -> list[str]:
    """The first differing rows of each part of two fingerprints, readable; empty when equal."""
    shown: list[str] = []
    for part in ("attempts", "candidates"):
        old = {r["attempt_id"]: r for r in recorded[part]}
        new = {r["attempt_id"]: r for r in live[part]}
        rows = []
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                rows.append(f"  {part} {key[:16]}:\n    recorded {old.get(key)}\n    now      {new.get(key)}")
        if rows:
            shown.append(f"{part}: {len(rows)} of {len(old)} recorded rows differ (first {min(limit, len(rows))}):")
            shown.extend(rows[:limit])
    old, new = recorded["release"], live["release"]
    files = [f"  {k}: recorded {old.get(k)} now {new.get(k)}" for k in sorted(old.keys() | new.keys())
             if old.get(k) != new.get(k)]  # fmt: skip
    if files:
        shown.append(f"release: {len(files)} of {len(old)} recorded files differ (first {min(limit, len(files))}):")
        shown.extend(files[:limit])
    return shown


def load_record(scenario: Scenario) -> dict[str, Any]:
    """The recorded JSON of ``scenario`` (``commit``, ``recorded_at``, ``editor_calls``, ``fingerprint``)."""
    return json.loads(scenario.record_path.read_text(encoding="utf-8"))


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "counterfactory", "flows", "generation", "validation", "manifests",
         "assets"], cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return head.stdout.strip() + ("+uncommitted engine changes" if dirty else "")


def record(names: list[str]) -> None:
    """Re-run each scenario into a fresh folder and write its fingerprint JSON under ``DATA``."""
    commit = _commit()
    for name in names:
        scenario = SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"cf-unchanged-{name}-") as tmp:
            out = Path(tmp) / "out"
            started = time.monotonic()
            run_cli(scenario.spec, out)
            seconds = time.monotonic() - started
            data = {
                "scenario": name,
                "spec": scenario.spec.relative_to(REPO).as_posix(),
                "commit": commit,
                "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "normalised": NORMALISED,
                "editor_calls": editor_calls(out, scenario),
                "fingerprint": fingerprint(out, scenario),
            }
        scenario.record_path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"{name}: {len(data['fingerprint']['attempts'])} attempts, {seconds:.0f} s -> {scenario.record_path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.flows.unchanged", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="re-run every scenario (or those named) and write its fingerprint JSON")
    rec.add_argument("names", nargs="*", help=f"scenarios of {sorted(SCENARIOS)} (default: all)")
    show = sub.add_parser("fingerprint", help="print the fingerprint of a finished run folder")
    show.add_argument("scenario", choices=list(SCENARIOS))
    show.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        unknown = sorted(set(args.names) - set(SCENARIOS))
        if unknown:
            parser.error(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}")
        record(args.names or list(SCENARIOS))
    else:
        print(json.dumps(fingerprint(args.out, SCENARIOS[args.scenario]), indent=1))


if __name__ == "__main__":
    main()
