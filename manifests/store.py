"""Content-addressed image store: every image lives under the sha256 of its PNG bytes.

Writes go to a temporary name in the same folder and are renamed into place, so a killed
process leaves either the whole file or nothing; a file's name is its checksum, so a partly
written file can never be mistaken for a finished one.

Every read re-hashes the file before it is used or published: a blob edited in place, truncated
or bit-rotted is a :class:`DamagedBlobError` naming the file, never silently used; an entry that
is a symlink (to ``/etc/passwd``, say) or a FIFO, or whose fan-out folder is a symlink (out of
the store), is an :class:`UnsafeBlobError` and is never followed or read (the review site's ``/img`` serves only what :meth:`ImageStore.read_bytes`
verified); a deleted
blob is a :class:`MissingBlobError`, which the pipeline answers by re-running only the attempt
that made it (the ledger knows which).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import sha256_file


def png_bytes(image: np.ndarray) -> bytes:
    """Lossless PNG encoding of ``(H, W, 3)`` or ``(H, W)`` uint8 pixels (deterministic)."""
    if image.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {image.dtype}")
    buffer = io.BytesIO()
    # level 1: a 2 MP image encodes ~5x faster than at the default level, for ~15 % more bytes
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class MissingBlobError(CounterfactoryError, FileNotFoundError):
    """A blob the ledger points at is not in the store (deleted, or the store was moved)."""

    def __init__(self, path: Path, sha256: str, root: Path) -> None:
        super().__init__(
            f"{path}: image {sha256[:12]} is not in the store at {root}; re-run the same spec and "
            "only the attempts whose images are missing are run again"
        )
        self.path, self.sha256 = path, sha256


class DamagedBlobError(CounterfactoryError, OSError):
    """A stored file whose bytes no longer hash to its name (edited in place, truncated, bit rot)."""

    def __init__(self, path: Path, sha256: str, actual: str) -> None:
        super().__init__(
            f"{path}: damaged image in the store: its bytes hash to {actual[:12]}, not to "
            f"{sha256[:12]} as its name says (edited in place or corrupted on disk); delete the "
            "file and re-run the same spec to rebuild it"
        )
        self.path, self.sha256, self.actual = path, sha256, actual


class UnsafeBlobError(CounterfactoryError, OSError):
    """A store entry that is not a regular file (a symlink, a FIFO, a device): never read,
    never served; the store writes only regular files."""

    def __init__(self, path: Path, sha256: str, what: str) -> None:
        super().__init__(
            f"{path}: {what}, not an image the store wrote (it writes only regular files); it is not read. "
            "Delete it and re-run the same spec to rebuild the image"
        )
        self.path, self.sha256 = path, sha256


class ImageStore:
    """PNG images under ``root/ab/abcdef....png``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.png"

    def put(self, image: np.ndarray) -> str:
        """Store pixels as PNG; returns the sha256 of the file (idempotent).

        An existing file under that name is kept only if its bytes still hash to it; a damaged
        one is replaced, so storing the same pixels again repairs the store.
        """
        data = png_bytes(image)
        sha = hashlib.sha256(data).hexdigest()
        target = self.path(sha)
        if not (target.exists() and sha256_file(target) == sha):
            atomic_write(target, data)
        return sha

    def has(self, sha256: str) -> bool:
        """Whether the blob exists (not whether it is intact: :meth:`verified_path` checks that)."""
        return self.path(sha256).exists()

    def _open_entry(self, sha256: str) -> int:
        """A read-only descriptor of the blob's own entry inside the store, following no
        symlink on the way: neither the fan-out folder (``root/ab``, which a symlink could point
        out of the store) nor the file itself (a symlink to ``/etc/passwd`` is refused). A FIFO
        is opened without waiting for a writer (and refused by the caller).

        Raises:
            MissingBlobError: no such file.
            UnsafeBlobError: the folder or the entry is a symlink, or the folder is not a folder.
        """
        path = self.path(sha256)
        nofollow = os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            folder = os.open(self.root / sha256[:2], os.O_RDONLY | os.O_DIRECTORY | nofollow)
        except FileNotFoundError:
            raise MissingBlobError(path, sha256, self.root) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeBlobError(
                    path, sha256, f"behind {self.root / sha256[:2]}, which is a symlink (or not a folder)"
                ) from None
            raise
        try:
            return os.open(path.name, os.O_RDONLY | nofollow, dir_fd=folder)
        except FileNotFoundError:
            raise MissingBlobError(path, sha256, self.root) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeBlobError(path, sha256, "a symlink") from None
            raise
        finally:
            os.close(folder)

    def read_bytes(self, sha256: str) -> bytes:
        """The blob's bytes, re-hashed against its name.

        Raises:
            MissingBlobError: no such file.
            UnsafeBlobError: the entry is a symlink, a FIFO or another non-regular file, or its
                fan-out folder is a symlink (it may point out of the store).
            DamagedBlobError: the bytes do not hash to ``sha256``.
        """
        path = self.path(sha256)
        fd = self._open_entry(sha256)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise UnsafeBlobError(path, sha256, "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")
            data = f.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise DamagedBlobError(path, sha256, actual)
        return data

    def verified_path(self, sha256: str) -> Path:
        """The blob's path after re-hashing its bytes (call it right before publishing the file).

        Raises:
            MissingBlobError, UnsafeBlobError, DamagedBlobError: as :meth:`read_bytes`.
        """
        path = self.path(sha256)
        digest = hashlib.sha256()
        with os.fdopen(self._open_entry(sha256), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UnsafeBlobError(path, sha256, "not a regular file")
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        actual = digest.hexdigest()
        if actual != sha256:
            raise DamagedBlobError(path, sha256, actual)
        return path

    def get(self, sha256: str) -> np.ndarray:
        """The stored pixels, ``(H, W, 3)`` uint8 RGB (or ``(H, W)`` for masks), hash-checked first.

        Raises:
            MissingBlobError, DamagedBlobError: as :meth:`read_bytes`.
        """
        with Image.open(io.BytesIO(self.read_bytes(sha256))) as im:
            return np.asarray(im).copy()
