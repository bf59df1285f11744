"""Releases: immutable, versioned folders of accepted items that a scoring harness reads as is.

``DIR/releases/<name>/<version>/`` holds ``manifest.jsonl`` (one row per accepted item),
``items.jsonl`` (every cell with its final status, so nothing is dropped silently),
``spec.yaml`` as run, ``stats.json``, ``report.html``, the images under ``images/`` and
``sources/`` by sha256, and ``checksums.sha256`` over every file.

A release is staged in a temporary folder and renamed into place, so it is whole or absent.
A version is never overwritten: writing a version that exists with the same manifest is a
no-op, and with a different manifest an error that asks for a new version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactory.manifests.store import atomic_write, sha256_file

MANIFEST = "manifest.jsonl"
ITEMS = "items.jsonl"
CHECKSUMS = "checksums.sha256"


class ReleaseExistsError(RuntimeError):
    """The version exists with different content; releases are never overwritten."""


def dumps_line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default)


def _default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> str:
    """Write rows as JSON lines (sorted keys); returns the file's sha256."""
    data = "".join(dumps_line(r) + "\n" for r in rows).encode("utf-8")
    atomic_write(path, data)
    return hashlib.sha256(data).hexdigest()


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True, default=_default) + "\n").encode("utf-8"))


@dataclass(frozen=True)
class SealedRelease:
    path: Path
    name: str
    version: str
    manifest_sha256: str
    created: bool  # False when an identical release already existed


class ReleaseStage:
    """A release being written: files go into a temporary folder beside the final one."""

    def __init__(self, releases_dir: Path, name: str, version: str) -> None:
        self.name, self.version = name, version
        self.final = Path(releases_dir) / name / version
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{version}.staging-", dir=self.final.parent))

    def add_file(self, relative: str, source: Path) -> str:
        """Copy (hard-link where possible) ``source`` into the release; returns the relative path."""
        target = self.dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        return relative

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def seal(self) -> SealedRelease:
        """Write checksums and move the folder into place (atomic rename)."""
        manifest = self.dir / MANIFEST
        if not manifest.exists():
            raise FileNotFoundError(f"{manifest}: a release needs a manifest before it is sealed")
        manifest_sha = sha256_file(manifest)
        lines = [
            f"{sha256_file(p)}  {p.relative_to(self.dir).as_posix()}\n"
            for p in sorted(self.dir.rglob("*"))
            if p.is_file() and p.name != CHECKSUMS
        ]
        atomic_write(self.dir / CHECKSUMS, "".join(lines).encode())
        if self.final.exists():
            existing = self.final / MANIFEST
            same = existing.exists() and sha256_file(existing) == manifest_sha
            self.discard()
            if same:
                return SealedRelease(self.final, self.name, self.version, manifest_sha, created=False)
            raise ReleaseExistsError(
                f"release {self.name} {self.version} already exists at {self.final} with a different "
                "manifest; releases are never overwritten: raise release.version in the spec "
                "(e.g. to the next patch version) and run again"
            )
        os.replace(self.dir, self.final)
        return SealedRelease(self.final, self.name, self.version, manifest_sha, created=True)


def verify_release(path: str | Path) -> list[str]:
    """Re-hash every file listed in ``checksums.sha256``; returns the problems (empty = valid)."""
    path = Path(path)
    listing = path / CHECKSUMS
    if not listing.exists():
        return [f"{listing}: missing"]
    problems = []
    listed = set()
    for line in listing.read_text().splitlines():
        digest, _, relative = line.partition("  ")
        listed.add(relative)
        file = path / relative
        if not file.exists():
            problems.append(f"{relative}: listed but missing")
        elif sha256_file(file) != digest:
            problems.append(f"{relative}: checksum mismatch")
    for p in path.rglob("*"):
        if p.is_file() and p.name != CHECKSUMS and p.relative_to(path).as_posix() not in listed:
            problems.append(f"{p.relative_to(path).as_posix()}: not listed in {CHECKSUMS}")
    return problems
