"""One run per output folder: the second is refused at once, and a killed holder frees the folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from counterfactory.manifests.runlock import RunFolderError, RunFolderLock

HOLD = """
import sys, time
from counterfactory.manifests.runlock import RunFolderLock
RunFolderLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def _holder(out) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_and_a_killed_holder_frees_the_folder(tmp_path):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        started = time.monotonic()
        with pytest.raises(RunFolderError, match="another counterfactory run") as caught:
            RunFolderLock(out).acquire()
        assert f"pid {proc.pid}" in str(caught.value) and "another --out" in str(caught.value)
        assert time.monotonic() - started < 2  # refused at once, never waits
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # the kernel dropped the lock with the killed process: no stale lock to delete by hand
    with RunFolderLock(out):
        assert (out / ".run.lock").read_text().startswith('{"pid": ' + str(os.getpid()))


def test_the_lock_is_reusable_after_release_in_the_same_process(tmp_path):
    lock = RunFolderLock(tmp_path)
    with lock:
        with pytest.raises(RunFolderError):
            RunFolderLock(tmp_path).acquire()
    with RunFolderLock(tmp_path):
        pass


def test_an_impossible_or_unwritable_out_is_one_message(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(RunFolderError, match="not a folder"):
        RunFolderLock(a_file).acquire()
    with pytest.raises(RunFolderError, match="cannot create the output folder"):
        RunFolderLock(a_file / "sub").acquire()
    if os.geteuid() != 0:
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        with pytest.raises(RunFolderError, match="cannot write"):
            RunFolderLock(locked).acquire()
