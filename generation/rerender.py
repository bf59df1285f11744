"""Re-rendering through a real latent autoencoder: what a diffusion editor does to every pixel.

Qwen-Image-Edit, Nano Banana and every other diffusion or autoregressive editor decode their
output through a learned latent autoencoder, so even the pixels they were told to keep come
back re-synthesised: fine texture, noise and JPEG grain are made up anew. :class:`Rerenderer`
runs one such round trip on the CPU with TAEF2, the Tiny AutoEncoder distilled from the
FLUX.2 VAE (Ollin Boer Bohan, MIT; ``assets/models/taef2_{encoder,decoder}.onnx``), through
onnxruntime (no torch).

The ONNX graphs: encoder input ``image`` ``(N, 3, H, W)`` float32 RGB in [0, 1], H and W
multiples of 8, output ``latent`` ``(N, 32, H / 8, W / 8)``; decoder input ``latent``, output
``image`` ``(N, 3, H, W)``, about [0, 1] (clipped here). Batch, height and width are dynamic.
One round trip of the bundled photos changes the untouched pixels by a mean absolute
0.014-0.019 (PSNR 31-32 dB); ``grace_hopper.jpg`` 0.0187 over the whole frame.

A round trip costs about 2 s of CPU per 512 px image, most of a synthetic corpus's making and
a third of the demo's run. What decides its output is the two graphs, onnxruntime's version and
the pixels at the working size, so a round trip can be kept on disk under a hash of exactly those
(:class:`RerenderCache`): set ``COUNTERFACTORY_RERENDER_CACHE=DIR`` and a second ``calibrate``, a
corpus rebuilt for another fit, or the same edits re-rendered by another run read the bytes the
first computed. The test suite shares one such folder between its processes.

Reference: Boer Bohan, "TAESD: Tiny AutoEncoder for Stable Diffusion" (github.com/madebyollin/taesd).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import cv2
import numpy as np

from counterfactory.assets import MODELS_DIR
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.safefiles import sha256_file

TAEF2_ENCODER = MODELS_DIR / "taef2_encoder.onnx"
TAEF2_DECODER = MODELS_DIR / "taef2_decoder.onnx"
#: the autoencoder's spatial factor: image sides must be multiples of it
LATENT_SCALE = 8
#: the environment variable naming a folder to keep round trips in (:class:`RerenderCache`)
CACHE_ENV = "COUNTERFACTORY_RERENDER_CACHE"


class RerenderCache:
    """Round trips kept in ``folder``, one ``.npy`` file per output, named by the SHA-256 of what
    decides it: both graphs' bytes, onnxruntime's version, and the working-size pixels with their
    shape (:meth:`key`). Nothing else enters the key: ``max_side`` and the thread count only
    decide the working size (already in the pixels) and the speed.

    Writes go to a temporary name and are renamed into place, so processes sharing the folder
    never read half a file; an unreadable or malformed entry is computed again and replaced.
    """

    def __init__(self, folder: str | Path, model: str) -> None:
        self.folder = Path(folder)
        self.model = model
        self.hits = self.misses = 0

    def key(self, image: np.ndarray) -> str:
        digest = hashlib.sha256(self.model.encode())
        digest.update(repr(image.shape).encode())
        digest.update(np.ascontiguousarray(image).data)
        return digest.hexdigest()

    def path(self, key: str) -> Path:
        """Where the round trip of ``key`` is kept (a sub-folder per first two hex digits)."""
        return self.folder / key[:2] / f"{key}.npy"

    def get(self, key: str, shape: tuple[int, ...]) -> np.ndarray | None:
        try:
            out = np.load(self.path(key), allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if out.dtype != np.uint8 or out.shape != shape:
            return None
        self.hits += 1
        return out

    def put(self, key: str, image: np.ndarray) -> None:
        self.misses += 1
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f"{key}.{os.getpid()}.{threading.get_ident()}.part")
            with open(part, "wb") as fh:
                np.save(fh, image, allow_pickle=False)
            os.replace(part, path)
        except OSError:  # a full or read-only disk costs the cache, never the round trip
            pass


class Rerenderer:
    """One TAEF2 encode-decode round trip.

    Args:
        encoder, decoder: the ONNX files (the bundled copies by default).
        max_side: the image is re-rendered at a long side of at most this many pixels (area
            downscale first; the output stays at that size, as an editor returns its own
            resolution); None: at its own size. Cost grows with the pixel count.
        threads: onnxruntime intra-op threads (0: its default).
        cache: a folder to keep round trips in (:class:`RerenderCache`); None: none.
    """

    name = "taef2"

    def __init__(
        self,
        encoder: str | Path = TAEF2_ENCODER,
        decoder: str | Path = TAEF2_DECODER,
        *,
        max_side: int | None = None,
        threads: int = 0,
        cache: str | Path | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise SetupError("re-rendering needs onnxruntime: pip install onnxruntime") from exc
        for path in (encoder, decoder):
            if not Path(path).is_file():
                raise SetupError(f"TAEF2 model not found at {path}; the package ships both in assets/models/")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        # idle intra-op threads sleep rather than spin: the re-render shares its cores with the
        # gates' threads and with other runs, and spinning threads burned ~10 % more CPU for the
        # same bytes (benchmarks/rerender_spin.py)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        self._encoder = ort.InferenceSession(str(encoder), options, providers=providers)
        self._decoder = ort.InferenceSession(str(decoder), options, providers=providers)
        self.max_side = max_side
        self.cache = None
        if cache is not None:
            model = f"taef2:{sha256_file(encoder)}:{sha256_file(decoder)}:onnxruntime {ort.__version__}"
            self.cache = RerenderCache(cache, model)
        # one call at a time per session pair: onnxruntime sessions are thread-safe, but two
        # concurrent full-size calls only compete for the same cores
        self._lock = threading.Lock()

    def working_size(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(h, w)`` the image of ``shape`` is re-rendered at: scaled to ``max_side`` and
        rounded to multiples of :data:`LATENT_SCALE` (at least one latent pixel)."""
        h, w = shape[:2]
        scale = 1.0 if self.max_side is None else min(1.0, self.max_side / max(h, w))

        def snap(v: float) -> int:
            return max(LATENT_SCALE, int(round(v / LATENT_SCALE)) * LATENT_SCALE)

        return snap(h * scale), snap(w * scale)

    def encode(self, image: np.ndarray) -> np.ndarray:
        """``(1, 32, h / 8, w / 8)`` float32 latent of ``(h, w, 3)`` uint8 RGB (sides multiples of 8)."""
        x = np.ascontiguousarray((image.astype(np.float32) / 255.0).transpose(2, 0, 1)[None])
        with self._lock:
            return self._encoder.run(None, {"image": x})[0]

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """``(h, w, 3)`` uint8 RGB of a latent (values clipped to [0, 1] and rounded)."""
        with self._lock:
            y = self._decoder.run(None, {"latent": np.ascontiguousarray(latent, dtype=np.float32)})[0]
        return np.clip(np.rint(y[0].transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """``image`` (``(H, W, 3)`` uint8 RGB) re-rendered: resized to :meth:`working_size`
        (area averaging down, bicubic for the few pixels of rounding up), encoded, decoded.

        Returns ``(h, w, 3)`` uint8 RGB at the working size.
        """
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        h, w = self.working_size(image.shape)
        if (h, w) != image.shape[:2]:
            shrinking = h * w < image.shape[0] * image.shape[1]
            image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)
        if self.cache is None:
            return self.decode(self.encode(image))
        key = self.cache.key(image)
        out = self.cache.get(key, (h, w, 3))
        if out is None:
            out = self.decode(self.encode(image))
            self.cache.put(key, out)
        return out


_shared: dict[tuple, Rerenderer] = {}
_shared_lock = threading.Lock()


def get_rerenderer(max_side: int | None = None) -> Rerenderer:
    """The process-wide :class:`Rerenderer` for ``max_side`` (the sessions load once), keeping
    its round trips in ``$COUNTERFACTORY_RERENDER_CACHE`` when that is set."""
    cache = os.environ.get(CACHE_ENV) or None
    key = (max_side, cache)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = Rerenderer(max_side=max_side, cache=cache)
        return _shared[key]


def rerender_like(image: np.ndarray, shape: tuple[int, ...], max_side: int | None = None) -> np.ndarray:
    """``image`` re-rendered (:func:`get_rerenderer`) and brought back to ``shape`` ``(H, W)``
    (bicubic up, area down): what a test or the failure corpus stands in for an editor's
    output with, at the source's size."""
    out = get_rerenderer(max_side)(image)
    h, w = shape[:2]
    if out.shape[:2] == (h, w):
        return out
    up = h * w > out.shape[0] * out.shape[1]
    return cv2.resize(out, (w, h), interpolation=cv2.INTER_CUBIC if up else cv2.INTER_AREA)
