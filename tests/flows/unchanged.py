"""Fingerprints of finished runs, recorded once from a known-good engine and compared after changes.

A fingerprint is what a run decided, read back from its ``--out`` folder:

- ``attempts``: every ledger attempt row (attempt id, cell, attempt number, seed, status, reason,
  and the output image's size and 8x8 thumbnail), sorted by attempt id;
- ``candidates``: every judged candidate (attempt id, verdict, reasons, judge key, the aligned
  image's size and thumbnail), sorted by attempt id;
- ``release``: every file of the sealed release (checked against ``checksums.sha256``): JSON,
  JSONL and Parquet as their rows with each content hash replaced by the image it names (or
  ``<sha256>``), images as thumbnails, text as its text without the numbers plus the numbers; the
  three files that also say *when* and *by which run* the release was sealed lose that one field
  (:data:`NORMALISED`).

Ids, cells, seeds, statuses, verdicts, reasons, judge keys and every string must be equal; measured
numbers and thumbnails agree within a tolerance (:data:`REL_TOLERANCE`, :data:`THUMB_TOLERANCE`).
Byte hashes of outputs are not compared: MediaPipe's, OpenCV's and onnxruntime's kernels differ in
the last bits between CPUs, so an AMD machine writes other PNG bytes than the Intel one that
recorded the first fingerprints (attempt ids, verdicts and reasons were the same on both).

Scenarios run the real command line as a user runs it (``python -m counterfactory run SPEC --out
DIR --publish --allow-incomplete``). ``python -m tests.flows.unchanged record`` re-runs every
scenario and writes ``tests/data/unchanged/<scenario>.json.gz``; do that only when a change of
behaviour is intended, and say so in the commit.
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import hashlib
import json
import os
import re
import shutil
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

import numpy as np

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
        return DATA / f"{self.name}.json.gz"


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
#: - ``release.json``'s ``created_at`` is the wall-clock time of sealing (its ``file_sha256`` is
#:   counted by file name, hashes taken out: each file is fingerprinted as itself).
#:
#: ``counterfactory.flows.engine.release.release_inputs_key`` leaves it out for the same reason. A run's own editor
#: calls are not in the release (its printed summary and the ledger's ``runs`` row hold them), so a
#: resumed run seals the same bytes (``tests/flows/test_resume_release.py``).
NORMALISED = {"release.json": "created_at removed"}


def cli_env() -> dict[str, str]:
    """The environment the scenarios run in: the user's, with Prefect kept local and quiet.

    Each call gets its own ``PREFECT_HOME`` so that runs never share Prefect's state.
    """
    env = dict(os.environ)
    env["PREFECT_HOME"] = home = tempfile.mkdtemp(prefix="cf-unchanged-prefect-")
    # removed when the test process ends (each left a 1.4 MB Prefect database in /tmp)
    atexit.register(shutil.rmtree, home, ignore_errors=True)
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


@dataclass(frozen=True)
class Killed:
    """What the ledger held when :func:`kill_half_way` killed the run.

    Attributes:
        finished: attempts finished (not ``running``) at the kill.
        ok_calls: ``attempt_id -> calls`` of the attempts finished ``ok`` at the kill.
        in_flight: the attempts ``running`` at the kill (each may run once more on resume).
    """

    finished: int
    ok_calls: dict[str, int]
    in_flight: frozenset[str]


def kill_half_way(scenario: Scenario, out: Path, *, minimum: int = 6, timeout: float = 600) -> Killed:
    """Start ``scenario``'s run, SIGKILL its process group once ``minimum`` attempts are finished and
    before it ends; return what its ledger held then.

    The run has one worker, so that it is still editing when the kill comes.

    Raises:
        AssertionError: the run ended (or timed out) before it could be killed, or sealed its release.
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
    if (out / scenario.release).exists():
        raise AssertionError("the run sealed its release before the kill: it was not interrupted")
    with _ledger(out) as db:
        ok_calls = dict(db.execute("select attempt_id, calls from attempts where status = 'ok'").fetchall())
        in_flight = frozenset(r[0] for r in db.execute("select attempt_id from attempts where status = 'running'"))
    return Killed(finished_attempts(out), ok_calls, in_flight)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: A content hash: the name of a stored image, of a release's image, source or input file.
_HEX = re.compile(r"[0-9a-f]{64}")
#: Numbers in a text file (the report, the spec copy): compared with :func:`_close`, the text around them exactly.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Thumbnail side (pixels a side, per channel) an image is fingerprinted by, and the grey levels
#: (of 255) a thumbnail value may differ by.
THUMB = 8
THUMB_TOLERANCE = 4
#: How far a measured number may move between two machines: the floats the gates record come from
#: MediaPipe, OpenCV and onnxruntime, whose SIMD kernels differ in the last bits between CPUs (an
#: Intel and an AMD machine give other landmarks' last digits, so other mask edges, other PNG bytes).
REL_TOLERANCE = 0.02
ABS_TOLERANCE = 1e-3


def _thumb(path: Path) -> dict[str, Any]:
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
        size = list(rgb.size)
        small = rgb.resize((THUMB, THUMB), Image.Resampling.BOX)
    return {"image": size, "thumb": np.asarray(small).reshape(-1).tolist()}


class _Resolver:
    """Content hashes in a fingerprint replaced by what they name: an image's size and thumbnail
    (found in the run's store or the release folder), else the marker ``<sha256>``."""

    def __init__(self, out: Path, release: Path) -> None:
        self.out, self.release = out, release

    def image(self, sha: str) -> dict[str, Any] | None:
        for path in (self.out / "store" / sha[:2] / f"{sha}.png", self.release / "images" / f"{sha}.png"):
            if path.is_file():
                return _thumb(path)
        return None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, bytes):
            return {"bytes": len(value)}
        if isinstance(value, str) and _HEX.search(value):
            if _HEX.fullmatch(value):
                return self.image(value) or "<sha256>"
            relative = self.release / value
            if relative.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp") and relative.is_file():
                return _thumb(relative)
            return _HEX.sub("<sha256>", value)
        return value


def _text_fingerprint(text: str) -> dict[str, Any]:
    text = _HEX.sub("<sha256>", text)
    return {"text_sha256": _sha(_NUMBER.sub("#", text).encode()), "numbers": _NUMBER.findall(text)}


def _file_fingerprint(name: str, data: bytes, path: Path, resolve: _Resolver) -> Any:
    if name == "release.json":
        info = json.loads(data)
        info.pop("created_at")
        # every file's sha256: each file is fingerprinted as itself, so only the names count here
        recorded: dict[str, int] = {}
        for relative in info.get("file_sha256") or {}:
            key = _HEX.sub("<sha256>", relative)
            recorded[key] = recorded.get(key, 0) + 1
        info["file_sha256"] = dict(sorted(recorded.items()))
        return resolve(info)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return resolve(json.loads(data))
    if suffix == ".jsonl":
        return [resolve(json.loads(line)) for line in data.decode("utf-8").splitlines() if line.strip()]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return resolve(pq.read_table(path).to_pylist())
    if suffix in (".png", ".jpg", ".jpeg", ".webp"):
        return _thumb(path)
    return _text_fingerprint(data.decode("utf-8", errors="replace"))


def release_fingerprint(folder: Path, out: Path | None = None) -> dict[str, Any]:
    """``{relative path: what the file says}`` of a sealed release, each file re-hashed against
    ``checksums.sha256`` first (a checksum file that does not match its folder fails here).

    Files named by a content hash (``images/``, ``sources/``, ``inputs/``) are counted per folder:
    the rows that name them carry their thumbnails. JSON, JSONL and Parquet files are their rows with
    every content hash replaced (:class:`_Resolver`); images are thumbnails; text files are their
    text with the numbers taken out, and the numbers. The files of :data:`NORMALISED` lose the one
    thing that records the sealing.
    """
    resolve = _Resolver(out or folder, folder)
    listed: dict[str, Any] = {}
    named_by_hash: dict[str, int] = {}
    for line in (folder / "checksums.sha256").read_text(encoding="utf-8").splitlines():
        digest, relative = line.split("  ", 1)
        path = folder / relative
        data = path.read_bytes()
        if _sha(data) != digest:
            raise AssertionError(f"{path}: sha256 differs from checksums.sha256")
        if _HEX.search(relative):
            key = _HEX.sub("<sha256>", relative)
            named_by_hash[key] = named_by_hash.get(key, 0) + 1
            continue
        listed[relative] = _file_fingerprint(relative, data, path, resolve)
    missing = set(NORMALISED) - set(listed)
    if missing:
        raise AssertionError(f"{folder}: checksums.sha256 lists none of {sorted(missing)}")
    listed["files named by content hash"] = named_by_hash
    return dict(sorted(listed.items()))


def fingerprint(out: Path, scenario: Scenario) -> dict[str, Any]:
    """What the run under ``out`` decided: its attempts, candidates and release (module docstring)."""
    resolve = _Resolver(out, out / scenario.release)
    with _ledger(out) as db:
        attempts = [
            {
                "attempt_id": a,
                "cell_id": c,
                "attempt_no": n,
                "seed": s,
                "status": st,
                "reason": r,
                "output": resolve.image(o) if o else None,
            }  # fmt: skip
            for a, c, n, s, st, o, r in db.execute(
                "select attempt_id, cell_id, attempt_no, seed, status, output_sha256, reason "
                "from attempts order by attempt_id"
            )
        ]
        candidates = [
            {
                "attempt_id": a,
                "verdict": v,
                "reasons": json.loads(r) if r else r,
                "judge_key": k,
                "image": resolve.image(i) if i else None,
            }  # fmt: skip
            for a, i, v, r, k in db.execute(
                "select attempt_id, image_sha256, verdict, reasons, judge_key from candidates order by attempt_id"
            )
        ]
    release = release_fingerprint(out / scenario.release, out)
    return {"attempts": attempts, "candidates": candidates, "release": release}


def editor_calls(out: Path, scenario: Scenario) -> int:
    """The editor calls the run that sealed the release made (the ledger's last ``runs`` row; the
    run prints the same count), which only an uninterrupted run on an empty folder pins."""
    with _ledger(out) as db:
        return db.execute("select editor_calls from runs order by started_at desc limit 1").fetchone()[0]


def _close(old: Any, new: Any) -> bool:
    """Numbers within :data:`ABS_TOLERANCE` + :data:`REL_TOLERANCE` of each other (a number printed
    in a text also by one unit of its last printed digit)."""
    if isinstance(old, str) and isinstance(new, str):
        last = len(old.split(".")[1].lower().split("e")[0]) if "." in old else 0
        unit = 10.0**-last if "e" not in old.lower() else 0.0
        old_v, new_v = float(old), float(new)
        return abs(old_v - new_v) <= ABS_TOLERANCE + REL_TOLERANCE * abs(old_v) + 1.01 * unit
    return abs(old - new) <= ABS_TOLERANCE + REL_TOLERANCE * abs(old)


def _compare(old: Any, new: Any, where: str, found: list[str]) -> None:
    """Append to ``found`` each place where ``new`` is not ``old``: keys, strings, booleans and
    None exactly; numbers within :func:`_close`; thumbnails within :data:`THUMB_TOLERANCE`."""
    if isinstance(old, dict) and isinstance(new, dict):
        if "thumb" in old and "thumb" in new:
            worst = max((abs(a - b) for a, b in zip(old["thumb"], new["thumb"], strict=True)), default=0)
            if old["image"] != new["image"] or worst > THUMB_TOLERANCE:
                found.append(f"{where}: image {old['image']} -> {new['image']}, thumbnail differs by up to {worst}")
            return
        if "numbers" in old and "numbers" in new and "text_sha256" in old:
            if old["text_sha256"] != new["text_sha256"] or len(old["numbers"]) != len(new["numbers"]):
                found.append(f"{where}: text differs (not only its numbers)")
                return
            for i, (a, b) in enumerate(zip(old["numbers"], new["numbers"], strict=True)):
                if not _close(a, b):
                    found.append(f"{where}: number {i}: recorded {a} now {b}")
            return
        for key in sorted(old.keys() | new.keys()):
            if key not in old or key not in new:
                found.append(
                    f"{where}.{key}: recorded {old.get(key, '<absent>')!r:.80} now {new.get(key, '<absent>')!r:.80}"
                )
            else:
                _compare(old[key], new[key], f"{where}.{key}", found)
        return
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            found.append(f"{where}: {len(old)} entries recorded, {len(new)} now")
            return
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _compare(a, b, f"{where}[{i}]", found)
        return
    numbers = (int, float)
    if (
        isinstance(old, numbers)
        and isinstance(new, numbers)
        and not isinstance(old, bool)
        and not isinstance(new, bool)
    ):
        if not _close(old, new):
            found.append(f"{where}: recorded {old} now {new}")
        return
    if old != new:
        found.append(f"{where}: recorded {old!r:.120} now {new!r:.120}")


def differences(live: dict[str, Any], recorded: dict[str, Any], limit: int = 8) -> list[str]:
    """The first differences of each part of two fingerprints, readable; empty when they agree.

    Ledger rows are matched by attempt id (ids, cells, seeds, statuses, verdicts, reasons and judge
    keys exactly); measured numbers and images within the tolerances above, so a fingerprint
    recorded on one CPU holds on another.
    """
    shown: list[str] = []
    for part in ("attempts", "candidates"):
        old = {r["attempt_id"]: r for r in recorded[part]}
        new = {r["attempt_id"]: r for r in live[part]}
        found: list[str] = []
        for key in sorted(old.keys() | new.keys()):
            if key not in old or key not in new:
                found.append(f"{part} {key[:16]}: {'only now' if key in new else 'recorded, missing now'}")
            else:
                _compare(old[key], new[key], f"{part} {key[:16]}", found)
        if found:
            shown.append(f"{part}: {len(found)} differences (first {min(limit, len(found))}):")
            shown.extend(f"  {line}" for line in found[:limit])
    found = []
    _compare(recorded["release"], live["release"], "release", found)
    if found:
        shown.append(f"release: {len(found)} differences (first {min(limit, len(found))}):")
        shown.extend(f"  {line}" for line in found[:limit])
    return shown


def load_record(scenario: Scenario) -> dict[str, Any]:
    """The recorded JSON of ``scenario`` (``commit``, ``recorded_at``, ``editor_calls``, ``fingerprint``)."""
    return json.loads(gzip.decompress(scenario.record_path.read_bytes()).decode("utf-8"))


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
        text = json.dumps(data, indent=0, sort_keys=False) + "\n"
        scenario.record_path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
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
