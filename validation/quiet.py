"""Native libraries' own logging (MediaPipe, TFLite, absl, glog, OpenCV) kept off the terminal.

MediaPipe's C++ graph, TFLite and absl write straight to file descriptor 2 (``W0000 ...
inference_feedback_manager.cc``, ``INFO: Created TensorFlow Lite XNNPACK delegate``,
``DestroyAccelerator``): twelve of the demo's 21 lines of output were theirs, one of them inside
the progress bar. Two layers keep them off:

- :func:`silence_native_logs` sets the libraries' own switches (``GLOG_minloglevel``,
  ``TF_CPP_MIN_LOG_LEVEL``, ``OPENCV_LOG_LEVEL``, ...) in the environment, which they read
  when they load; the command line calls it first thing, before any of them is imported, and
  worker processes inherit it.
- :func:`native_quiet` redirects descriptor 2 around the calls that load or close a model
  (what absl and TFLite print there ignores those switches). What other threads write to
  stderr meanwhile is not lost: it is written out afterwards, less the native libraries' lines.

``counterfactory --verbose`` (or ``COUNTERFACTORY_VERBOSE=1``) turns both off. Standard library
only: this module is imported before anything heavy.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

#: Set to 1 (``counterfactory --verbose`` does) to let native libraries log as they please.
VERBOSE_ENV = "COUNTERFACTORY_VERBOSE"

#: Each library's own switch, set only where the environment does not already choose.
SWITCHES = {
    "GLOG_minloglevel": "2",  # glog (MediaPipe's C++): errors and above
    "TF_CPP_MIN_LOG_LEVEL": "2",  # TensorFlow / TFLite C++ logging: errors and above
    "OPENCV_LOG_LEVEL": "ERROR",
    "OPENCV_VIDEOIO_DEBUG": "0",
    "GRPC_VERBOSITY": "ERROR",  # grpc (Ray) C core
}

#: A line written by a native library: glog/absl's ``W0000 00:00:...`` prefix, TFLite's
#: ``INFO:``/``WARNING:`` lines, and OpenCV's ``[ WARN:0@...]``.
NATIVE_LINE = re.compile(
    rb"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d|(?:INFO|WARNING|VERBOSE): |\[ ?(?:INFO|WARN|DEBUG):)"
    rb"|TensorFlow Lite|XNNPACK|inference_feedback_manager|DestroyAccelerator|absl::"
)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def silence_native_logs(*, verbose_: bool = False) -> None:
    """Set the native libraries' log switches (before they load), or with ``verbose_`` mark the
    process verbose, so that neither the switches nor :func:`native_quiet` hide anything."""
    if verbose_:
        os.environ[VERBOSE_ENV] = "1"
    quiet = not verbose()
    if quiet:
        for key, value in SWITCHES.items():
            os.environ.setdefault(key, value)
    cv2 = sys.modules.get("cv2")  # already loaded (it reads OPENCV_LOG_LEVEL only then): told directly
    logging = getattr(getattr(cv2, "utils", None), "logging", None)
    if logging is not None and hasattr(logging, "setLogLevel"):
        with contextlib.suppress(Exception):
            logging.setLogLevel(logging.LOG_LEVEL_ERROR if quiet else logging.LOG_LEVEL_WARNING)


_lock = threading.Lock()
_depth = 0
_saved_fd: int | None = None
_capture = None


def _restore() -> None:
    global _saved_fd, _capture
    saved, capture = _saved_fd, _capture
    _saved_fd = _capture = None
    if saved is None:
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    capture.seek(0)
    kept = [line for line in capture.read().splitlines(keepends=True) if not NATIVE_LINE.search(line)]
    capture.close()
    if kept:
        with contextlib.suppress(OSError):
            os.write(2, b"".join(kept))


@contextlib.contextmanager
def native_quiet() -> Iterator[None]:
    """Descriptor 2 into a buffer while the block runs (a model loads or closes); afterwards
    everything in it but native libraries' log lines is written to stderr. Nested and
    concurrent blocks share one redirection. A no-op when :func:`verbose`."""
    global _depth, _saved_fd, _capture
    if verbose():
        yield
        return
    with _lock:
        if _depth == 0:
            try:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                capture = tempfile.TemporaryFile()
                saved = os.dup(2)
                os.dup2(capture.fileno(), 2)
            except OSError:  # no descriptor 2 to redirect: nothing to hide
                capture = saved = None
            _saved_fd, _capture = saved, capture
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()
