"""native_quiet: descriptor 2 is held back around a model's set-up; what is not a native
library's log line is written out afterwards; COUNTERFACTORY_VERBOSE lets all of it through."""

from __future__ import annotations

import os
import threading

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
