"""Releases: immutable, versioned folders of accepted items that a scoring harness reads as is.

``DIR/releases/<name>/<version>/`` holds ``manifest.jsonl`` and ``manifest.parquet`` (one row
per accepted item), ``items.jsonl`` (every cell with its final status, so nothing is dropped
silently), ``left_out.jsonl`` (what an incomplete grid left out, and why), ``trials.jsonl``,
``derived.jsonl`` (robustness variants), ``spec.yaml`` as the user wrote it, ``stats.json``,
``release.json``, ``report.html``, a JSON Schema for every JSON/JSONL file under ``schemas/``,
the images under ``images/`` and ``sources/`` by sha256, and ``checksums.sha256`` over every
file. ``release.json`` records the sha256 of every other file (``file_sha256``, all but itself
and ``checksums.sha256``), so its own sha256 is the release's digest (:func:`release_digest`),
which ``verify --expect`` checks against one recorded elsewhere.

This module seals; :mod:`counterfactory.manifests.release_verify` verifies (``verify`` trusts
no file the release could regenerate).

A release owns its bytes: every image is copied (or reflinked, where the filesystem shares
blocks copy-on-write) and its sha256 is checked while it is copied, never hard-linked, so an
edit of the store or of a user's photo cannot reach a sealed release. A release is staged in a
temporary folder and renamed into place, so it is whole or absent; a staging folder left by a
killed process is removed by the next stage. A version is never overwritten: writing a
version that exists with the same manifest is a no-op, and with a different manifest an error
that asks for a new version. Sealed files are ``0644`` in ``0755`` folders, readable by a
scoring harness running as another user.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.release_folder import (
    CHECKSUMS,
    MANIFEST,
    RELEASE_JSON,
    RELEASE_NAME,
    RELEASE_VERSION,
    NotAReleaseError,
)
from counterfactory.manifests.safefiles import sha256_file
from counterfactory.manifests.store import atomic_write

FILE_MODE = 0o644
DIR_MODE = 0o755
#: ``ioctl`` request that clones a file's blocks (Linux ``FICLONE``: btrfs, XFS, overlay on them)
_FICLONE = 0x40049409
_STAGING = re.compile(r"^\.(?P<version>.+)\.staging-(?P<pid>\d+)-[A-Za-z0-9_]+$")


class ReleaseExistsError(CounterfactoryError, RuntimeError):
    """The version exists with different content; releases are never overwritten."""


class ReleaseSourceMissingError(CounterfactoryError, FileNotFoundError):
    """A file a release is built from (a store image, a source photo) is gone since the run."""


class ReleaseIntegrityError(CounterfactoryError, RuntimeError):
    """A file that should go into a release does not have the sha256 it is addressed by."""


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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True, default=_default) + "\n").encode("utf-8"))


def copy_verified(source: Path, target: Path, expected_sha256: str | None = None) -> str:
    """Copy ``source`` to a new file ``target`` (a reflink where supported); returns its sha256.

    The copy's bytes are hashed as they are written (or, after a reflink, read back), so what
    lands in a release is exactly what was checked.

    Raises:
        ReleaseIntegrityError: the bytes' sha256 is not ``expected_sha256``; ``target`` is removed.
        ReleaseSourceMissingError: ``source`` is missing, with a message naming it.
    """
    source, target = Path(source), Path(target)
    if not source.is_file():
        raise ReleaseSourceMissingError(
            f"{source}: missing; it is needed for the release (re-run the spec to rebuild a store image, "
            "or restore the photo)"
        )
    digest = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
            cloned = False
            try:
                import fcntl

                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
                cloned = True
            except (ImportError, OSError):
                pass
            if cloned:
                with open(target, "rb") as back:
                    for block in iter(lambda: back.read(1 << 20), b""):
                        digest.update(block)
            else:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
        actual = digest.hexdigest()
        if expected_sha256 is not None and actual != expected_sha256:
            raise ReleaseIntegrityError(
                f"{source}: its bytes have sha256 {actual[:16]}..., but it is addressed as {expected_sha256[:16]}...; "
                "the file was changed after it was stored. Nothing was published: delete the damaged file "
                "and run the spec again to rebuild it (or restore the original photo)"
            )
        return actual
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_stages(folder: Path) -> list[Path]:
    """Remove staging folders in ``folder`` whose writing process is gone (killed mid-publish)."""
    removed = []
    if not Path(folder).is_dir():
        return removed
    for entry in Path(folder).iterdir():
        match = _STAGING.match(entry.name)
        if match and entry.is_dir() and not _pid_alive(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _make_readable(root: Path) -> None:
    """``0644`` files in ``0755`` folders: staging files are created private (mkstemp)."""
    os.chmod(root, DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), DIR_MODE)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), FILE_MODE)


@dataclass(frozen=True)
class SealedRelease:
    path: Path
    name: str
    version: str
    manifest_sha256: str
    created: bool  # False when an identical release already existed

    @property
    def digest(self) -> str:
        """The release's digest (:func:`release_digest`): what ``verify --expect`` checks."""
        return release_digest(self.path)


#: ``release.json``'s record of every other file's sha256
FILE_SHA256 = "file_sha256"
#: what ``release.json``'s ``file_sha256`` leaves out: itself, and the listing written after it
UNRECORDED = (RELEASE_JSON, CHECKSUMS)


def release_digest(path: str | Path) -> str:
    """A release's digest: the sha256 of its ``release.json``.

    ``release.json`` records every other file's sha256 (``file_sha256``, all but
    ``checksums.sha256``, which lists the same files and ``release.json``), so the digest
    changes when any byte of the release does. Publishing prints it; record it where the
    release is cited, and ``counterfactory verify RELEASE --expect DIGEST`` proves a copy is
    that release. Two releases sealed from the same inputs differ only in ``created_at`` (the
    time of sealing), so their digests differ.
    """
    return sha256_file(Path(path) / RELEASE_JSON)


def record_files(folder: Path, name: str, version: str) -> None:
    """Write into ``folder``'s ``release.json`` (made with ``name`` and ``version`` when the
    release has none) the sha256 of every other file (:data:`FILE_SHA256`)."""
    folder = Path(folder)
    info_file = folder / RELEASE_JSON
    info = json.loads(info_file.read_text(encoding="utf-8")) if info_file.is_file() else {}
    if not info:
        info = {"name": name, "version": version}
    info[FILE_SHA256] = {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in UNRECORDED
    }
    write_json(info_file, info)


def existing_release_conflict(releases_dir: Path, name: str, version: str, spec_sha256: str) -> str | None:
    """Why ``name`` ``version`` cannot be published from the spec file hashing to ``spec_sha256``, or None.

    Checked before any work: an existing version made from another spec file can never be
    re-made, so a run that would end in it is refused before the first editor call. A release
    that does not record its spec file's hash (older releases) is left to :meth:`ReleaseStage.seal`,
    which compares manifests.
    """
    final = Path(releases_dir) / name / version
    if not final.exists():
        return None
    try:
        existing = json.loads((final / RELEASE_JSON).read_text(encoding="utf-8")).get("spec_sha256")
    except (OSError, ValueError, AttributeError):
        existing = None
    if existing is None or existing == spec_sha256:
        return None
    return (
        f"release {name} {version} already exists at {final}, made from a different spec file; releases are "
        "never overwritten: raise release.version in the spec (or pass another --version) and run again"
    )


def sealed_from(releases_dir: Path, name: str, version: str, inputs_sha256: str) -> SealedRelease | None:
    """The sealed ``name`` ``version`` when its ``release.json`` says it was built from inputs
    hashing to ``inputs_sha256`` (``created`` False); None when it is absent, older than that
    record, or built from other inputs (the caller then stages it and :meth:`ReleaseStage.seal`
    compares manifests)."""
    final = Path(releases_dir) / name / version
    try:
        info = json.loads((final / RELEASE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("inputs_sha256") != inputs_sha256 or not (final / MANIFEST).is_file():
        return None
    return SealedRelease(final, name, version, sha256_file(final / MANIFEST), created=False)


class ReleaseStage:
    """A release being written: files go into a temporary folder beside the final one."""

    def __init__(self, releases_dir: Path, name: str, version: str) -> None:
        if not RELEASE_NAME.fullmatch(name) or not RELEASE_VERSION.fullmatch(version):
            raise ReleaseIntegrityError(
                f"release {name!r} {version!r}: a release name is letters, digits, '_', '-', '.' and a version "
                "X.Y.Z, each matched whole (nothing after it, not even a newline)"
            )
        self.name, self.version = name, version
        self.final = Path(releases_dir) / name / version
        self.final.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_stages(self.final.parent)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{version}.staging-{os.getpid()}-", dir=self.final.parent))

    def add_file(self, relative: str, source: Path, *, sha256: str | None = None) -> str:
        """Copy ``source`` into the release, checking its ``sha256``; returns the relative path.

        Raises:
            ReleaseIntegrityError: the file's bytes do not match ``sha256``.
        """
        target = self.dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            copy_verified(Path(source), target, sha256)
        return relative

    def add_input(self, source: Path) -> str:
        """Copy an input file (a prompt bank, biographies) into ``inputs/<sha256><suffix>``;
        returns the relative path."""
        digest = sha256_file(source)
        return self.add_file(f"inputs/{digest}{Path(source).suffix.lower()}", Path(source), sha256=digest)

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def seal(self) -> SealedRelease:
        """Write checksums, make everything world-readable and move the folder into place."""
        manifest = self.dir / MANIFEST
        if not manifest.exists():
            raise NotAReleaseError(f"{manifest}: a release needs a manifest before it is sealed")
        manifest_sha = sha256_file(manifest)
        record_files(self.dir, self.name, self.version)
        lines = [
            f"{sha256_file(p)}  {p.relative_to(self.dir).as_posix()}\n"
            for p in sorted(self.dir.rglob("*"))
            if p.is_file() and p.name != CHECKSUMS
        ]
        atomic_write(self.dir / CHECKSUMS, "".join(lines).encode())
        _make_readable(self.dir)
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
        try:
            os.rename(self.dir, self.final)
        except OSError as exc:
            # another process sealed the same version between the check and the rename
            self.discard()
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise ReleaseExistsError(f"release {self.name} {self.version} was written by another process") from None
            raise
        return SealedRelease(self.final, self.name, self.version, manifest_sha, created=True)
