"""A sealed release folder, opened one way by every reader: its file names, spelled once, and
bounded, confined reads of its files.

A release is a folder someone else may have edited (``verify`` proves it was not, but ``ask``,
``score``, ``release export`` and ``release push`` may be given an unverified copy). So a reader
trusts nothing it reads: ``release.json`` and the tables are read only as regular files of
bounded size (:func:`~counterfactory.manifests.safefiles.read_regular`), each row must be a
JSON object of the shape the reader uses, and every image path a row names is kept inside the
release folder (:func:`~counterfactory.manifests.safefiles.inside`) and opened only as a
regular file with one link and of bounded size: one edited line of ``trials.jsonl`` naming
``/etc/passwd``, ``../../secret``, a symbolic link out, a FIFO (which would block the reader), a
device or a hard link to a file elsewhere is refused with one message naming the file and the
row, before a byte of it is read.

The same module says what a release is (:func:`is_release`: a folder holding ``release.json``
and ``checksums.sha256``, as sealing leaves it) and finds the sealed release a path lies in
(:func:`enclosing_release`), so that nothing writes inside one.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import DEFAULT_MAX_FILE_BYTES, InputFileError, inside, read_regular

# ------------------------------------------------------------------ the release's file names

RELEASE_JSON = "release.json"
MANIFEST = "manifest.jsonl"
MANIFEST_PARQUET = "manifest.parquet"
ITEMS = "items.jsonl"
LEFT_OUT = "left_out.jsonl"
TRIALS = "trials.jsonl"
DERIVED = "derived.jsonl"
SPEC_YAML = "spec.yaml"
STATS = "stats.json"
REPORT = "report.html"
CHECKSUMS = "checksums.sha256"
DIFF_JSON = "diff.json"
ATTRITION_PNG = "attrition.png"
SKIN_TONE_PNG = "skin_tone.png"
SCHEMAS_DIR = "schemas"
CONTACT_SHEETS_DIR = "contact_sheets"
#: the JSON-lines tables a release holds
TABLES = (MANIFEST, ITEMS, LEFT_OUT, TRIALS, DERIVED)

#: a release name (``release.name``): letters, digits, ``_``, ``-``, ``.``, matched whole
RELEASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: a release version (``release.version``): a semantic version, matched whole
RELEASE_VERSION = re.compile(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?")

#: the largest ``release.json``, ``stats.json`` or ``spec.yaml`` a reader reads (bytes)
MAX_JSON_BYTES = 64 << 20
#: the largest table (``trials.jsonl``, ...) a reader reads (bytes)
MAX_TABLE_BYTES = 1 << 30
#: the largest image a table may name (bytes)
MAX_IMAGE_BYTES = DEFAULT_MAX_FILE_BYTES
_LIMIT = "a release file of a usable size"


class NotAReleaseError(CounterfactoryError, FileNotFoundError):
    """A folder given as a release is not one (no ``items.jsonl``), or a stage has no manifest yet."""


class ReleaseFileError(CounterfactoryError, ValueError):
    """A release file a reader refuses: not a regular file, too large, not JSON of the shape the
    reader needs, or a row naming an image outside the release, not regular, hard-linked or too
    large. The message names the file and the row (line number and trial id)."""


def is_release(path: str | Path) -> bool:
    """Whether ``path`` is a sealed release folder: ``release.json`` and ``checksums.sha256``
    in it as regular files (not links), as :meth:`~counterfactory.manifests.release.ReleaseStage.seal`
    leaves one."""
    path = Path(path)
    try:
        return all(stat.S_ISREG((path / name).lstat().st_mode) for name in (RELEASE_JSON, CHECKSUMS))
    except OSError:
        return False


def enclosing_release(path: str | Path) -> Path | None:
    """The sealed release folder ``path`` is or lies in (an output path that may not exist
    yet), or None."""
    target = Path(path).expanduser().resolve()
    for folder in (target, *target.parents):
        if is_release(folder):
            return folder
    return None


def refuse_inside_release(path: str | Path, what: str) -> None:
    """Refuse to write ``path`` (``what``: the option naming it) inside a sealed release.

    Raises:
        ReleaseFileError: ``path`` is or lies inside a sealed release folder.
    """
    found = enclosing_release(path)
    if found is not None:
        raise ReleaseFileError(
            f"{what} {path}: inside the sealed release {found}; a release is never written to (it would then fail "
            "verify): choose a folder outside it"
        )


def releases_under(folder: str | Path, limit: int = 50) -> list[Path]:
    """The sealed releases under ``folder`` (a run folder's ``releases/NAME/VERSION``, or any
    depth up to three), sorted, at most ``limit``."""
    folder = Path(folder)
    found: list[Path] = []
    for pattern in ("*", "*/*", "*/*/*"):
        for p in sorted(folder.glob(pattern)):
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and is_release(p):
                found.append(p)
                if len(found) >= limit:
                    return found
    return found


def not_a_release(folder: str | Path) -> str | None:
    """Why ``folder`` is not a release (neither ``release.json`` nor ``checksums.sha256`` in
    it), naming the releases under it (a run folder) and how to verify one; None when it holds
    either (``verify`` then says what is wrong with it)."""
    folder = Path(folder)
    if (folder / RELEASE_JSON).exists() or (folder / CHECKSUMS).exists():
        return None
    found = releases_under(folder, limit=6)
    if found:
        shown = ", ".join(str(p) for p in found[:5]) + (" and more" if len(found) > 5 else "")
        return f"{folder}: not a release but a folder holding release(s): {shown}; verify one: counterfactory verify {found[-1]}"
    return f"{folder}: not a release folder (no {RELEASE_JSON}, no {CHECKSUMS}); pass DIR/releases/NAME/VERSION"


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReleaseFileError(
            f"{where}: not JSON ({str(exc)[:120]}); run `counterfactory verify` on the release"
        ) from None
    if not isinstance(value, dict):
        raise ReleaseFileError(f"{where}: not a JSON object; run `counterfactory verify` on the release")
    return value


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class ReleaseFolder:
    """One release folder, read as untrusted: every file name spelled once (the module's
    constants, also attributes here), ``release.json`` and tables read bounded and regular, and
    every image a row names resolved inside the folder and read as a regular, single-link,
    bounded file.

    Args:
        path: the release folder (``DIR/releases/NAME/VERSION``).
        need: the files it must hold; a folder without them is not a release
            (:class:`NotAReleaseError` naming what is missing).
    """

    RELEASE_JSON, MANIFEST, ITEMS, LEFT_OUT, TRIALS, DERIVED = RELEASE_JSON, MANIFEST, ITEMS, LEFT_OUT, TRIALS, DERIVED
    SPEC_YAML, STATS, REPORT, CHECKSUMS = SPEC_YAML, STATS, REPORT, CHECKSUMS

    def __init__(self, path: str | Path, *, need: Sequence[str] = (RELEASE_JSON,)) -> None:
        self.path = Path(path)
        missing = [name for name in need if not self.has(name)]
        if missing:
            runs = releases_under(self.path, limit=4) if self.path.is_dir() else []
            hint = (
                f"; releases in it: {', '.join(str(r) for r in runs)}"
                if runs
                else "; pass a release folder, DIR/releases/NAME/VERSION"
            )
            raise NotAReleaseError(f"{self.path}: not a release folder (no {' and no '.join(missing)}){hint}")
        self._info: dict[str, Any] | None = None

    def file(self, name: str) -> Path:
        """The path of the release's file ``name`` (one of the module's names)."""
        return self.path / name

    def has(self, name: str) -> bool:
        """Whether the release holds ``name`` as a regular file (not a link, FIFO or folder)."""
        try:
            return stat.S_ISREG((self.path / name).lstat().st_mode)
        except OSError:
            return False

    def read_bytes(self, name: str, max_bytes: int = MAX_TABLE_BYTES) -> bytes:
        """The bytes of the release's own file ``name``: a regular file with one link, bounded.

        Raises:
            ReleaseFileError: missing, not a regular file, hard-linked or too large.
        """
        try:
            return read_regular(self.path / name, max_bytes, limit_field=_LIMIT, single_link=True)
        except FileNotFoundError:
            raise ReleaseFileError(f"{self.path / name}: missing; run `counterfactory verify {self.path}`") from None
        except (InputFileError, OSError) as exc:
            raise ReleaseFileError(f"{self.path / name}: {exc}") from None

    @property
    def info(self) -> dict[str, Any]:
        """``release.json``, a JSON object (read once)."""
        if self._info is None:
            self._info = _json_object(self.read_bytes(RELEASE_JSON, MAX_JSON_BYTES), str(self.path / RELEASE_JSON))
        return self._info

    def json(self, name: str) -> dict[str, Any]:
        """A JSON object file of the release (``stats.json``), bounded."""
        return _json_object(self.read_bytes(name, MAX_JSON_BYTES), str(self.path / name))

    def numbered_rows(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(line number, row)`` of a JSON-lines table; a line that is not a JSON object is an error.

        Raises:
            ReleaseFileError: naming the file and line.
        """
        data = self.read_bytes(name)
        for n, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise ReleaseFileError(f"{self.path / name} line {n}: not JSON ({str(exc)[:120]})") from None
            if not isinstance(row, dict):
                raise ReleaseFileError(f"{self.path / name} line {n}: not a JSON object")
            yield n, row

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The rows of a JSON-lines table (:meth:`numbered_rows` without the numbers)."""
        return [row for _, row in self.numbered_rows(name)]

    def trials(self, *, images: bool = True) -> list[dict[str, Any]]:
        """``trials.jsonl``'s rows, each checked for the fields readers use (``trial_id``,
        ``prompt``, ``prompt_sha256``, ``protocol`` strings, ``group`` an object, ``images`` and
        ``image_paths`` lists of strings of one length) and, with ``images``, every image path
        resolved and checked (:meth:`image`) before anything is sent or copied.

        Raises:
            ReleaseFileError: the first row that breaks a rule, naming its line and trial id.
        """
        out = []
        for n, row in self.numbered_rows(TRIALS):
            where = f"{self.path / TRIALS} line {n}"
            tid = row.get("trial_id")
            if not isinstance(tid, str) or not tid:
                raise ReleaseFileError(f"{where}: no trial_id string")
            where += f" (trial {tid[:64]})"
            for field in ("prompt", "prompt_sha256", "protocol"):
                if not isinstance(row.get(field), str):
                    raise ReleaseFileError(f"{where}: {field} is not a string")
            if not isinstance(row.get("group", {}), dict):
                raise ReleaseFileError(f"{where}: group is not an object")
            if not isinstance(row.get("decoding") or {}, dict):
                raise ReleaseFileError(f"{where}: decoding is not an object")
            named, paths = row.get("images"), row.get("image_paths")
            if not _is_str_list(named):
                raise ReleaseFileError(f"{where}: images is not a list of item ids")
            if paths is not None and not _is_str_list(paths):
                raise ReleaseFileError(f"{where}: image_paths is not a list of paths")
            if named and not paths:
                raise ReleaseFileError(
                    f"{where}: names images but not their paths in the release; publish the release again with "
                    "this version of counterfactory"
                )
            if paths is not None and len(paths) != len(named):
                raise ReleaseFileError(f"{where}: {len(paths)} image_paths for {len(named)} images")
            if images:
                for rel in paths or []:
                    self.image(rel, where)
            out.append(row)
        return out

    def image(self, relative: Any, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> Path:
        """The file ``relative`` (an image path a row names), when it lies inside the release and
        is a regular file with one link of at most ``max_bytes`` (checked without opening it;
        :meth:`read_image` checks again on the open file).

        Raises:
            ReleaseFileError: ``where`` (the file and row), the path as given and why.
        """
        if not isinstance(relative, str) or not relative:
            raise ReleaseFileError(f"{where}: an image path that is not a path ({str(relative)[:80]!r})")
        try:
            target = inside(self.path, relative, what="the release folder", roots_field=None)
            info = (self.path / relative).lstat()
        except InputFileError as exc:
            raise ReleaseFileError(f"{where}: image {relative!r}: {exc}") from None
        except OSError:
            raise ReleaseFileError(f"{where}: image {relative!r} is missing from the release") from None
        problem = None
        if stat.S_ISLNK(info.st_mode):
            problem = "a symbolic link; a release holds its files themselves"
        elif not stat.S_ISREG(info.st_mode):
            problem = "not a regular file (a FIFO, device, socket or folder)"
        elif info.st_nlink > 1:
            problem = f"hard-linked ({info.st_nlink} links); a release owns its bytes"
        elif info.st_size > max_bytes:
            problem = f"{info.st_size:,} bytes, over the limit of {max_bytes:,}"
        if problem is not None:
            raise ReleaseFileError(f"{where}: image {relative!r} is {problem}; run `counterfactory verify {self.path}`")
        return target

    def read_image(self, relative: Any, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
        """The bytes of the image ``relative`` a row names (:meth:`image`), read from a regular,
        single-link file of at most ``max_bytes`` (checked again on the open descriptor).

        Raises:
            ReleaseFileError: as :meth:`image`, naming ``where``.
        """
        target = self.image(relative, where, max_bytes)
        try:
            return read_regular(target, max_bytes, limit_field=_LIMIT, single_link=True)
        except (InputFileError, OSError) as exc:
            raise ReleaseFileError(f"{where}: image {relative!r}: {exc}") from None
