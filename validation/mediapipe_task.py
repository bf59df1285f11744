"""One MediaPipe Tasks model's lifecycle, written once for every task the factory runs (the
face landmarker, the BlazeFace detector, the selfie segmenter).

A :class:`MediaPipeTask` checks its model file (a :class:`~counterfactory.manifests.errors.SetupError`
naming it when missing), builds the task with its native set-up logs kept off the terminal,
runs one call at a time (MediaPipe's graph is not re-entrant), keeps the first call quiet too
(LiteRT logs its input alignment then), and is closed before the interpreter tears MediaPipe's
worker threads down. What a task is asked and how its result is read stay with its owner.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.manifests.errors import SetupError
from counterfactory.validation.quiet import native_quiet


def register_close_at_exit(close: Callable[[], None]) -> None:
    """Close a MediaPipe task before the interpreter tears its worker threads down.

    MediaPipe >= 0.10.33 runs every C call through a ``ThreadPoolExecutor``; those executors
    are shut down by ``threading``'s exit hooks, which run *before* ``atexit`` handlers, so a
    close registered with ``atexit`` fails with "cannot schedule new futures after shutdown".
    ``threading._register_atexit`` hooks run in reverse order of registration, so one
    registered after MediaPipe's executor exists runs before that executor is shut down.
    """
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(close)
            return
    except RuntimeError:  # already shutting down
        return
    atexit.register(close)


class MediaPipeTask:
    """A MediaPipe Tasks model, loaded once and closed at exit.

    Args:
        model_path: the model file (``.task`` bundle or ``.tflite``).
        create: ``create(vision, base_options) -> task``: the task built from
            ``mediapipe.tasks.python.vision`` and the :class:`BaseOptions` naming ``model_path``
            (e.g. ``vision.FaceDetector.create_from_options(vision.FaceDetectorOptions(base_options=...))``).
        missing: the :class:`SetupError` message when ``model_path`` is not a file.
        name: the owner's name, for the error a call on a closed task raises.
    """

    def __init__(self, model_path: str | Path, *, create: Callable[[Any, Any], Any], missing: str, name: str) -> None:
        from mediapipe.tasks.python import BaseOptions, vision

        self.path = Path(model_path)
        self.name = name
        if not self.path.is_file():
            raise SetupError(missing)
        with native_quiet():  # MediaPipe / TFLite / absl / LiteRT log their set-up to stderr
            self._task = create(vision, BaseOptions(model_asset_path=str(self.path)))
        # MediaPipe's graph is not re-entrant; one call at a time per instance.
        self._lock = threading.Lock()
        self._cold = True  # the first call logs too (LiteRT's input alignment)
        register_close_at_exit(self.close)

    def close(self) -> None:
        """Closes the task (again is a no-op); a later call raises ``RuntimeError``."""
        task, self._task = getattr(self, "_task", None), None
        if task is not None:
            with native_quiet():
                task.close()

    def run(self, method: str, image: np.ndarray) -> Any:
        """The task's ``method`` (``detect``, ``segment``) on ``image``, ``(H, W, 3)`` uint8 RGB.

        Raises:
            RuntimeError: the task was closed.
        """
        import mediapipe as mp

        frame = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(image))
        with self._lock:
            if self._task is None:
                raise RuntimeError(f"{self.name} is closed")
            with native_quiet() if self._cold else contextlib.nullcontext():
                result = getattr(self._task, method)(frame)
            self._cold = False
        return result
