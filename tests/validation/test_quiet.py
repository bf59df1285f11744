"""native_quiet: descriptor 2 is held back around a model's set-up; what is not a native
library's log line is written out afterwards; COUNTERFACTORY_VERBOSE lets all of it through."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from counterfactory.validation import quiet

# lines as MediaPipe / TFLite / LiteRT / OpenCV print them (copied from a run of the demo)
NATIVE_LINES = [
    b"W0000 00:00:1796206013.485034   14657 inference_feedback_manager.cc:121] Feedback manager requires a model\n",
    b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n",
    b"INFO: [accelerator_registry.cc:43] DestroyAccelerator: ptr=0x7f4b58004560, name=CpuAccelerator\n",
    b"[ WARN:0@3.437] global net_impl_backend.cpp:388 setPreferableTarget Targets are not supported\n",
]
OWN = b"cells:  33%|###       | 6/18\n"


def test_native_lines_are_dropped_and_others_kept(capfd, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    with quiet.native_quiet():
        for line in NATIVE_LINES:
            os.write(2, line)
        os.write(2, OWN)
        with quiet.native_quiet():  # nested: one redirection
            os.write(2, NATIVE_LINES[0])
        assert capfd.readouterr().err == ""  # held back while the block runs
    err = capfd.readouterr().err
    assert err == OWN.decode()
    os.write(2, b"after\n")  # descriptor 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"


def test_a_concurrent_block_shares_the_redirection(capfd, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    inside, release = threading.Event(), threading.Event()

    def other():
        with quiet.native_quiet():
            inside.set()
            release.wait(5)
            os.write(2, NATIVE_LINES[1])

    t = threading.Thread(target=other)
    with quiet.native_quiet():
        t.start()
        inside.wait(5)
    os.write(2, NATIVE_LINES[2])  # the other block is still open: still held back
    release.set()
    t.join(5)
    os.write(2, b"done\n")
    assert capfd.readouterr().err == "done\n"


def test_verbose_lets_everything_through(capfd, monkeypatch):
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    with quiet.native_quiet():
        os.write(2, NATIVE_LINES[0])
    assert capfd.readouterr().err == NATIVE_LINES[0].decode()


def test_switches_are_set_only_where_unset(monkeypatch):
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV})
    os.environ["GLOG_minloglevel"] = "0"  # the user's choice stands
    os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    quiet.silence_native_logs()
    assert os.environ["GLOG_minloglevel"] == "0"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    del os.environ["TF_CPP_MIN_LOG_LEVEL"]
    quiet.silence_native_logs(verbose_=True)
    assert os.environ[quiet.VERBOSE_ENV] == "1" and "TF_CPP_MIN_LOG_LEVEL" not in os.environ


# A process as the command line leaves it: the filter installed by silence_native_logs, then
# writes to descriptor 2 from a native-like writer (os.write, another thread, a child process)
# and from Python's own stderr (the progress bar's kind of partial line, then a summary line).
# The partial line from C is forwarded once it has waited for its end (here: at exit).
_FILTERED_PROCESS = r"""
import os, subprocess, sys, threading
from counterfactory.validation.quiet import silence_native_logs
silence_native_logs()
sys.stderr.write("cells:  50%|#####     | 9/18\r")
sys.stderr.flush()
native = b"W0000 00:00:1764700000.123456 4242 inference_runner_litert.cc:178] Input tensor not aligned\n"
t = threading.Thread(target=os.write, args=(2, native))
t.start(); t.join()
os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
os.write(2, b"a plain line from C\n")
subprocess.run([sys.executable, "-c", "import os; os.write(2, b'I0000 00:00:1764700001.000001    7 gl_context.cc:369] child\\n'); os.write(2, b'child says hi\\n')"])
os.write(2, b"a partial line from C")
print("summary: done", file=sys.stderr)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_the_command_lines_filter_drops_native_lines_written_at_any_time(tmp_path, verbose):
    env = {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV}
    if verbose:
        env[quiet.VERBOSE_ENV] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _FILTERED_PROCESS], capture_output=True, env=env, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    for kept in ("cells:  50%|#####     | 9/18\r", "a plain line from C\n", "a partial line from C", "child says hi"):
        assert kept in err, err
    assert "summary: done\n" in err, err
    native = ("inference_runner_litert.cc", "XNNPACK", "gl_context.cc")
    if verbose:
        assert all(n in err for n in native), err
    else:
        assert not [n for n in native if n in err], err


def test_last_words_before_os_exit_reach_the_terminal_past_the_filter():
    """A signal handler writes its message and ends with os._exit, which never waits for the
    filter's reader thread: it writes to terminal_fd() (the original stderr), not to 2."""
    script = (
        "import os\n"
        "from counterfactory.validation.quiet import silence_native_logs, terminal_fd\n"
        "silence_native_logs()\n"
        "assert terminal_fd() != 2\n"
        "os.write(terminal_fd(), b'SIGTERM: stopped; run the same command to resume\\n')\n"
        "os._exit(143)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=60)
    assert result.returncode == 143, result.stderr
    assert b"SIGTERM: stopped" in result.stderr
