"""One run per output folder: an exclusive, crash-safe lock on ``out/.run.lock``.

Two ``counterfactory run`` processes on the same folder would both pay for the same attempts
and race on the same release. The lock is an ``flock`` on a file inside the folder: the kernel
drops it when the holding process exits, however it exits (SIGKILL included), so a crashed run
never leaves a stale lock to delete by hand.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from counterfactory.manifests.errors import CounterfactoryError

LOCK_NAME = ".run.lock"


class RunFolderError(CounterfactoryError, RuntimeError):
    """The output folder cannot be used: unwritable, not a folder, or busy with another run."""


class RunFolderLock:
    """Hold ``out/.run.lock`` exclusively for the life of a run.

    Use as a context manager; :meth:`acquire` creates ``out`` if needed and raises
    :class:`RunFolderError` at once (it never waits) when another process holds the lock.
    """

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self._fd: int | None = None

    def acquire(self) -> RunFolderLock:
        out = self.out
        if out.exists() and not out.is_dir():
            raise RunFolderError(f"--out {out}: exists and is not a folder; choose a folder path")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunFolderError(
                f"--out {out}: cannot create the output folder ({exc.strerror or exc}); choose a path you can write to"
            ) from None
        path = out / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunFolderError(
                f"--out {out}: cannot write in the output folder ({exc.strerror or exc}); choose a "
                "folder you can write to or fix its permissions"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunFolderError(
                    f"--out {out}: another counterfactory run is using this folder ({holder}); "
                    "wait for it to finish, or give this run another --out"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "started_at": datetime.now(UTC).isoformat()}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']}, started {info['started_at']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
