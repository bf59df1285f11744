"""A throwaway PostgreSQL server for tests: initdb into a temporary folder, start on a free port.

Uses the PostgreSQL binaries on the machine (Debian's postgresql-15 puts them under
/usr/lib/postgresql/<version>/bin). The server refuses to run as root, so as root it runs as
the ``postgres`` user. It listens on 127.0.0.1 only and is stopped when the fixture ends.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yield an SQLAlchemy URL of a fresh database on a private server."""
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError(
            "PostgreSQL server binaries not found; install postgresql (Debian: apt-get install postgresql)"
        )
    root = Path(tempfile.mkdtemp(prefix="cf-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run(
        as_user + [initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        as_user
        + [
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c fsync=off",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
