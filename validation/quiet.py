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
- :func:`filter_native_stderr` (the command line, through :func:`silence_native_logs`) catches
  what the first two cannot: lines a library writes on a warm call at a moment of its own
  choosing (LiteRT's ``inference_runner_litert.cc ... not aligned``, seen in a fresh clone's
  demo inside the progress bar, depends on where an input buffer happened to be allocated).
  Descriptor 2 becomes a pipe whose reader forwards every line but the native libraries', and
  Python's own ``sys.stderr`` (the progress bar, the summary, tracebacks) writes to the
  terminal directly, unfiltered and undelayed.

``counterfactory --verbose`` (or ``COUNTERFACTORY_VERBOSE=1``) turns both off. Standard library
only: this module is imported before anything heavy.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import re
import select
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
    # glog/absl's prefix anywhere in a line: written into another writer's unfinished line
    rb"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\]"
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
        filter_native_stderr()
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


#: How long a partial line written to descriptor 2 waits for its end before it is forwarded.
PARTIAL_LINE_WAIT_S = 0.2

_filter_lock = threading.Lock()
_filter_state: dict[str, object] | None = None


def filter_native_stderr() -> bool:
    """From now on drop the native libraries' lines (:data:`NATIVE_LINE`) written to descriptor 2
    by anything in the process, and forward everything else; ``sys.stderr`` is rebound to the
    original descriptor, so Python's output never goes through the filter.

    Installed once, only when ``sys.stderr`` is the process's own descriptor 2 (not under a test
    runner's capture, not when :func:`verbose`); undone at exit, after the pipe is drained.
    Returns whether the filter is (now) installed.
    """
    global _filter_state
    with _filter_lock:
        if _filter_state is not None:
            return True
        if verbose() or sys.stderr is not sys.__stderr__ or sys.stderr is None:
            return False
        try:
            if sys.stderr.fileno() != 2:
                return False
            sys.stderr.flush()
            original = os.dup(2)
            read_end, write_end = os.pipe()
        except (OSError, ValueError, io.UnsupportedOperation):
            return False
        os.dup2(write_end, 2)
        os.close(write_end)
        os.set_inheritable(original, False)
        # line-buffered, not write-through: print()'s text and its end reach the terminal in one
        # write, so a line the reader forwards meanwhile cannot land inside it
        stream = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(original, "w", closefd=False)),
            encoding=getattr(sys.__stderr__, "encoding", None) or "utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        reader = threading.Thread(target=_forward, args=(read_end, original), name="stderr-filter", daemon=True)
        _filter_state = {"original": original, "read_end": read_end, "reader": reader, "stream": stream}
        sys.stderr = stream
        reader.start()
        atexit.register(_unfilter)
        return True


def terminal_fd() -> int:
    """The descriptor that reaches the terminal now: the original stderr while
    :func:`filter_native_stderr` is installed (what is written to descriptor 2 then passes
    through the filter's reader thread, which a process ending with ``os._exit`` never waits
    for), else 2. A signal handler's last words go here."""
    state = _filter_state
    return int(state["original"]) if state is not None else 2


def _forward(read_end: int, original: int) -> None:
    """The filter's reader: whole lines, each dropped or written to ``original``; a partial line
    is forwarded after :data:`PARTIAL_LINE_WAIT_S` without its end (a prompt, a C progress bar)."""
    pending = b""
    while True:
        if pending:
            ready, _, _ = select.select([read_end], [], [], PARTIAL_LINE_WAIT_S)
            if not ready:
                if not NATIVE_LINE.search(pending):
                    _write_all(original, pending)
                pending = b""
                continue
        try:
            chunk = os.read(read_end, 65536)
        except OSError:
            chunk = b""
        if not chunk:  # every write end closed: the process is ending
            if pending and not NATIVE_LINE.search(pending):
                _write_all(original, pending)
            os.close(read_end)
            return
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        kept = [line + b"\n" for line in lines if not NATIVE_LINE.search(line)]
        if kept:
            _write_all(original, b"".join(kept))


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def _unfilter() -> None:
    """Descriptor 2 back to the terminal, and what is left in the pipe forwarded (at exit)."""
    global _filter_state
    with _filter_lock:
        state, _filter_state = _filter_state, None
    if state is None:
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(state["original"], 2)  # closes the pipe's write end that descriptor 2 held
    state["reader"].join(timeout=1.0)  # a child still holding the pipe keeps it open: do not wait for it
    sys.stderr = sys.__stderr__
