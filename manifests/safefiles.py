"""Files that others made, read without trusting them: inside their folder, regular, bounded.

An imported set (a pair table, a folder of images, a Hugging Face dataset folder) and a
metadata file name files by path. Whoever made them may name ``../../etc/passwd``, an absolute
path, a symbolic link to a file elsewhere, ``/dev/zero``, a FIFO or a 6 GiB sparse file. Each
name goes through :func:`inside` (resolved, symbolic links included, and kept inside the
folder it is relative to, or one of the roots the spec allows), and each file through
:func:`open_regular` (a regular file of bounded size, checked on the open descriptor, so a
FIFO never blocks and a device is never read) before a byte of it is read; hashes are taken as
a stream (:func:`sha256_file`). Messages name the path as given, never the file's bytes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from counterfactory.manifests.errors import CounterfactoryError

#: the largest image file an import reads (bytes); ``editor.import.max_file_bytes`` changes it
DEFAULT_MAX_FILE_BYTES = 256 << 20
#: the largest table file (CSV, JSONL, one Parquet shard) an import reads (bytes);
#: ``editor.import.max_table_bytes`` changes it
DEFAULT_MAX_TABLE_BYTES = 2 << 30
_CHUNK = 1 << 20
#: the setting a too-large file's message names, unless the caller names another
LIMIT_FIELD = "editor.import.max_file_bytes"


class InputFileError(CounterfactoryError, ValueError):
    """A file a table, folder or metadata file names that is not read: outside its folder, an
    absolute path no allowed root holds, a NUL byte in its name, not a regular file, or over
    the size limit. The message names the path as given (the caller adds the row)."""


def inside(
    base: str | Path,
    name: str,
    *,
    roots: Sequence[str | Path] = (),
    what: str = "folder",
    roots_field: str | None = "editor.import.allowed_roots",
) -> Path:
    """The file ``name`` (relative to ``base``) names, resolved, when it stays inside ``base``.

    Symbolic links are followed to their target, which must be inside too. An absolute
    ``name``, or one that leads outside ``base`` (``..``, a link), is allowed only when it
    resolves inside one of ``roots`` (the spec's ``allowed_roots``).

    Args:
        base: the folder ``name`` is relative to.
        name: the path as a table or metadata file gives it.
        roots: further folders a path may lead into.
        what: how messages call ``base`` ("the table's folder", ...).
        roots_field: the setting that lists further roots, which messages suggest (None: none).

    Raises:
        InputFileError: a NUL byte, or a path that leads outside; the message names ``name``
            and ``base`` only (never where a link points).
    """
    if "\x00" in name:
        raise InputFileError("the path holds a NUL byte; write the file's name without it")
    folder = Path(base).resolve()
    given = Path(name)
    target = (folder / given).resolve()
    allowed = [Path(r).resolve() for r in roots]
    if target == folder or any(target == r for r in allowed):
        raise InputFileError(f"{name!r} names a folder, not a file")
    if not given.is_absolute() and target.is_relative_to(folder):
        return target
    if any(target.is_relative_to(r) for r in allowed):
        return target
    fix = "copy the file into it"
    if roots_field is not None:
        fix += f", or name the folder holding it in {roots_field}" + (
            f" (now: {', '.join(map(str, allowed))})" if allowed else ""
        )
    if given.is_absolute():
        raise InputFileError(f"{name!r} is an absolute path; paths are relative to {what} {folder}: {fix}")
    raise InputFileError(f"{name!r} leads outside {what} {folder} (through '..' or a symbolic link): {fix}")


@contextmanager
def open_regular(
    path: str | Path, max_bytes: int, *, limit_field: str = LIMIT_FIELD, single_link: bool = False
) -> Iterator[tuple[BinaryIO, int]]:
    """``(file, size)`` of ``path`` opened for reading, when it is a regular file of at most
    ``max_bytes`` bytes (checked on the open descriptor: a FIFO is opened without blocking and
    never read, a device never read, a link swapped in after :func:`inside` refused).
    ``limit_field`` is the setting a message names for raising the limit. With ``single_link``
    a file with more than one hard link is refused too: :func:`inside` cannot see where a hard
    link's other names lie, so a file inside a folder may be the same bytes as one outside it.

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: a folder.
        InputFileError: a FIFO, device or socket, a symbolic link, larger than ``max_bytes``, or
            (``single_link``) hard-linked.
        OSError: any other failure to open (permissions, ...).
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputFileError(f"{path.name!r} is a symbolic link; name the file itself") from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", str(path))
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a socket"
                if stat.S_ISSOCK(info.st_mode)
                else "a special file"
            )
            raise InputFileError(f"{path.name!r} is {kind}, not a regular file; name an image file")
        if single_link and info.st_nlink > 1:
            raise InputFileError(
                f"{path.name!r} is hard-linked ({info.st_nlink} links), so its bytes may be a file outside the "
                "folder; copy the file in (cp, not cp -l or ln)"
            )
        if info.st_size > max_bytes:
            raise InputFileError(
                f"{path.name!r} is {info.st_size:,} bytes, over the limit of {max_bytes:,}; it is not a file "
                f"of a usable size ({limit_field} raises the limit)"
            )
        # reads block again (a regular file never waits; the flag only kept the open from it)
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file, info.st_size


def read_regular(
    path: str | Path, max_bytes: int, *, limit_field: str = LIMIT_FIELD, single_link: bool = False
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (:func:`open_regular`); never more
    than ``max_bytes`` are read, even from a file that grows while it is read.

    Raises:
        see :func:`open_regular`.
    """
    with open_regular(path, max_bytes, limit_field=limit_field, single_link=single_link) as (file, size):
        data = file.read(size)  # at most max_bytes: a read sized by the limit would allocate it
        grew = file.read(1)
    if grew:
        raise InputFileError(f"{Path(path).name!r} grew while it was read; read it again once it is written")
    return data


def sha256_file(path: str | Path, max_bytes: int | None = None, *, single_link: bool = False) -> str:
    """The hex sha256 of a file's bytes, read as a stream: the one file hash of the package.

    With ``max_bytes`` (a file an untrusted table or metadata names) only a regular file of at
    most that many bytes is read (:func:`open_regular`); without it (the package's own files: a
    store image, a release file, a model's weights) any file that opens. ``single_link`` (with
    ``max_bytes``) refuses a hard-linked file (:func:`open_regular`).

    Raises:
        FileNotFoundError: no such file; with ``max_bytes``, see :func:`open_regular`.
    """
    digest = hashlib.sha256()
    if max_bytes is None:
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()
    read = 0
    with open_regular(path, max_bytes, single_link=single_link) as (file, _):
        while chunk := file.read(_CHUNK):
            read += len(chunk)
            if read > max_bytes:
                raise InputFileError(
                    f"{Path(path).name!r} grew past the limit of {max_bytes:,} bytes while it was read"
                )
            digest.update(chunk)
    return digest.hexdigest()


#: how much of a file :func:`decoder_problem` compares a message with (a decoder that quotes a
#: file quotes what it was parsing: a header, near the start)
_QUOTE_SCAN_BYTES = 1 << 20
#: a run of this many characters of a message found in the file is a quote of it
_QUOTE_WINDOW = 8


def decoder_problem(exc: BaseException, data: bytes | None = None) -> str:
    """``"<type>: <message>"`` of a decoder's exception about a file, for a message that names
    the file: the message is left out when it may quote the file's bytes (Pillow's PPM and XBM
    readers put the header they choked on into the exception: ``b'Token too long in file
    header: root:x:0:0:...'``), i.e. when it holds a quote mark or a backslash, or a run of
    :data:`_QUOTE_WINDOW` characters found in the first MiB of ``data`` (the file's bytes, when
    the caller has them)."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    quoted = any(mark in text for mark in "'\"\\`")
    if not quoted and data:
        start = data[:_QUOTE_SCAN_BYTES]
        raw = text.encode("utf-8", "replace")
        quoted = any(raw[i : i + _QUOTE_WINDOW] in start for i in range(max(0, len(raw) - _QUOTE_WINDOW + 1)))
    if quoted or not text:
        return f"{name}; its message is left out, as it may quote the file"
    return f"{name}: {text[:200]}"


def private_dir(path: str | Path) -> Path:
    """``path`` as a folder only this user can enter (mode 0700), made if missing.

    Raises:
        InputFileError: it exists and is not a folder, is a symbolic link, or belongs to
            another user (someone could have put files there first).
    """
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise InputFileError(f"{path} is not a folder of its own (a link or a file); remove it")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise InputFileError(
            f"{path} belongs to another user, who could have put files there; remove it or set "
            "$COUNTERFACTORY_EMBEDDED_DIR to a folder of yours"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path
