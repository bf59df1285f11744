"""Nano Banana (Pro) through fal's queue API, with bounded concurrency and paid-call safety.

One edit is one call of the shared fal queue transport
(:mod:`counterfactory.manifests.paid.fal`: submit, poll, fetch, cancel, the
concurrency bound, the spend cap and the request journal; its docstring says how money is
kept safe). This module says only what an edit sends and how its answer is read: the source
as a PNG data URI (lossless; fal accepts data URIs wherever it takes an image URL), the prompt,
the seed and one PNG output; then a download of the output image from the URL the result
names, with its price per image.

Answers. Safety flags, an empty image list and Gemini's refusal wording beside an image (the
image is then the unedited input) are ``refused``; an output that cannot be decoded is
``failed`` and stays fetchable. fal bills per output image, so a flagged image costs its price.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from counterfactory.generation.editors.base import (
    EditJournal,
    EditorOptions,
    EditRequest,
    EditResult,
)
from counterfactory.generation.editors.registry import EDITORS, EditorCapabilities
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import PaidAnswer, PaidCall, PaidCallFailed, PaidReading, run_sync
from counterfactory.manifests.paid.fal import (
    REFUSAL_TEXT,
    FalQueue,
    FalQueueOptions,
    FalTransfer,
    check_rgb,
    png_data_uri,
)
from counterfactory.manifests.paid.fal_cancel import cancel_open_requests
from counterfactory.manifests.vocabulary import OK

#: USD per output image, as listed on fal's model pages when this was written (Nano Banana
#: Pro bills 4K outputs at twice this). Override per endpoint with ``prices_usd``.
DEFAULT_PRICES_USD: dict[str, float] = {
    "fal-ai/nano-banana/edit": 0.039,
    "fal-ai/nano-banana-pro/edit": 0.15,
}
KNOWN_ENDPOINTS: tuple[str, ...] = tuple(DEFAULT_PRICES_USD)
#: The ``aspect_ratio`` values (width:height) an endpoint accepts, from fal's model pages.
#: Nano Banana snaps its output to a fixed size per ratio and crops to fill, so asking for
#: the ratio nearest the source's keeps most of the source's frame in the output.
ASPECT_RATIOS: dict[str, tuple[str, ...]] = {
    endpoint: ("21:9", "16:9", "3:2", "4:3", "5:4", "1:1", "4:5", "3:4", "2:3", "9:16") for endpoint in KNOWN_ENDPOINTS
}


def nearest_aspect_ratio(width: int, height: int, choices: tuple[str, ...]) -> str:
    """The ``"w:h"`` in ``choices`` nearest ``width / height`` on a log scale (so 2:1 and 1:2
    are equally far from 1:1)."""

    def distance(choice: str) -> float:
        w, h = (float(v) for v in choice.split(":"))
        return abs(math.log((w / h) / (width / height)))

    return min(choices, key=distance)


# Inputs the backend sets itself; letting ``arguments`` override them would break lossless
# transport (output_format, sync_mode), seeding or the one-image-per-attempt accounting.
_RESERVED_ARGUMENTS = frozenset({"prompt", "image_urls", "seed", "num_images", "output_format", "sync_mode"})


class FalOptions(FalQueueOptions, EditorOptions):
    """Options of the ``fal`` backend (``editor.fal`` in the spec): the transport's
    (:class:`~counterfactory.manifests.paid.fal.FalQueueOptions`: ``concurrency``,
    ``spend_cap_usd``, ``timeout_s``, ``max_retries``, ``poll_interval_s``, ``backoff_s``) and:

    Attributes:
        endpoint: fal endpoint id, ``<owner>/<app>[/<path>]``; see ``KNOWN_ENDPOINTS``.
        arguments: extra model inputs, e.g. ``{"aspect_ratio": "auto", "resolution": "1K"}``;
            part of the lineage.
        prices_usd: USD per output image by endpoint, over ``DEFAULT_PRICES_USD``.
        match_aspect_ratio: send the ``aspect_ratio`` nearest the source's (``ASPECT_RATIOS``)
            to endpoints that take one, unless ``arguments`` sets it.
    """

    endpoint: str = "fal-ai/nano-banana/edit"
    arguments: dict[str, Any] = Field(default_factory=dict)
    prices_usd: dict[str, float] = Field(default_factory=dict)
    match_aspect_ratio: bool = True

    @field_validator("arguments")
    @classmethod
    def _no_reserved_arguments(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(_RESERVED_ARGUMENTS & set(value))
        if clash:
            raise ValueError(
                f"arguments may not set {clash}; the fal backend sets {sorted(_RESERVED_ARGUMENTS)} itself"
            )
        return value

    @field_validator("prices_usd")
    @classmethod
    def _prices_not_negative(cls, value: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in value.items() if v < 0}
        if negative:
            raise ValueError(f"prices_usd must be >= 0, received {negative}")
        return value


class FalEditor:
    """Edits through a fal-hosted model (Nano Banana, Nano Banana Pro) over the queue API.

    ``edit_many`` returns one :class:`EditResult` per request, in order: ``image`` is the
    model's output decoded to ``(h, w, 3)`` ``uint8`` RGB at whatever size it came, exactly
    as served (PNG both ways). ``cost_usd`` is the price of the images fal returned
    (0 when it returned none). ``metadata`` holds ``request_id``, ``endpoint``, ``seconds``
    (wall time with its slot), ``cost_usd``, ``resumed`` (fetched by a journaled id),
    ``submit_tries`` (submissions made; fal-client's internal retries not counted), ``seed``,
    ``lost_request_ids`` when fal had forgotten (or cancelled) a journaled id,
    ``cancelled`` when an abandoned request was cancelled at fal, ``pending_request_id`` for a
    billed request still to fetch, and for outputs ``width``, ``height``, ``output_format``
    and ``description`` (the model's text).
    """

    name = "fal"

    def __init__(self, options: FalOptions | None = None) -> None:
        self.options = options if options is not None else FalOptions()
        self.queue = FalQueue(
            self.options.endpoint,
            self.options,
            estimate_usd=self._price(self.options.endpoint) or 0.0,
            known_endpoints=KNOWN_ENDPOINTS,
            client_name="editor.fal",
        )

    @property
    def batch_size(self) -> int:
        """Requests the factory hands over at once: ``concurrency``, enough to keep every slot busy."""
        return self.options.concurrency

    def lineage(self) -> dict[str, Any]:
        """Everything that decides the output; fal does not version its endpoints, so the
        endpoint id stands for the model."""
        return {
            "backend": self.name,
            "endpoint": self.options.endpoint,
            "arguments": dict(sorted(self.options.arguments.items())),
            "aspect_ratio": "nearest_to_source" if self._matches_aspect_ratio() else None,
            "num_images": 1,
            "output_format": "png",
            "input_encoding": "png_data_uri",
        }

    def _matches_aspect_ratio(self) -> bool:
        o = self.options
        return o.match_aspect_ratio and "aspect_ratio" not in o.arguments and o.endpoint in ASPECT_RATIOS

    def consumes(self, kind: str) -> frozenset[str]:
        """The image, prompt and seed go to fal; no mask and no negative prompt do."""
        return frozenset({"prompt", "seed"})

    def prepare(self) -> None:
        """Checks the dependency, key and endpoint (:meth:`FalQueue.prepare`), then the price.

        Raises:
            SetupError: with one message saying what is wrong and how to fix it.
        """
        run_sync(self._aprepare())

    async def _aprepare(self) -> None:
        await self.queue.aprepare()
        endpoint = self.options.endpoint
        if self._price(endpoint) is None:
            raise SetupError(
                f"no price known for fal endpoint {endpoint!r}, so spend cannot be "
                f"accounted: set editor.fal.prices_usd[{endpoint!r}] to its USD per image"
            )

    def edit(self, request: EditRequest) -> EditResult:
        return self.edit_many([request])[0]

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        """Runs ``requests`` with at most ``concurrency`` in flight; see :meth:`aedit_many`."""
        return run_sync(self.aedit_many(requests, journal))

    async def aedit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        """Async form of :meth:`edit_many` for callers already inside an event loop.

        Requests sharing an ``attempt_id`` are one attempt and get the same result.
        Without a journal the batch keeps an in-memory one (no resume across processes).

        Raises:
            SetupError: the key or endpoint is rejected; nothing was billed for it.
        """
        await self._aprepare()
        calls = [PaidCall(r.attempt_id, _Arguments(self, r)) for r in requests]
        answers = await self.queue.arun_many(calls, self._read, journal)
        return [self._result(r, a) for r, a in zip(requests, answers, strict=True)]

    def _price(self, endpoint: str) -> float | None:
        return {**DEFAULT_PRICES_USD, **self.options.prices_usd}.get(endpoint)

    def arguments(self, request: EditRequest) -> dict[str, Any]:
        """The model input for one request (the image as a PNG data URI).

        Raises:
            PaidCallFailed: ``fal_bad_input`` unless the image is ``(H, W, 3)`` uint8 RGB.
        """
        image = request.image
        check_rgb(image, "fal_bad_input")
        extra = {}
        if self._matches_aspect_ratio():
            choices = ASPECT_RATIOS[self.options.endpoint]
            extra["aspect_ratio"] = nearest_aspect_ratio(image.shape[1], image.shape[0], choices)
        return {
            **extra,
            **self.options.arguments,
            "prompt": request.prompt,
            "image_urls": [png_data_uri(image)],
            "seed": int(request.seed),
            "num_images": 1,
            "output_format": "png",
            "sync_mode": False,
        }

    async def _read(self, call: PaidCall, payload: dict[str, Any], transfer: FalTransfer) -> PaidReading:
        """A result JSON -> the decoded output image, priced per image returned."""
        images = payload.get("images") or []
        description = str(payload.get("description") or "").strip()
        price = self._price(transfer.endpoint) or self._price(self.options.endpoint) or 0.0
        cost = float(price) * len(images)
        flags = payload.get("has_nsfw_concepts") or payload.get("nsfw_content_detected") or []
        flags = flags if isinstance(flags, list) else [flags]
        if any(bool(f) for f in flags):
            raise PaidCallFailed(
                "refused",
                f"fal_nsfw: the safety checker flagged the output "
                f"(has_nsfw_concepts={flags}){': ' + description if description else ''}",
                state="refused",
                cost_usd=cost,
            )
        if not images:
            raise PaidCallFailed(
                "refused",
                "fal_no_images: " + (description or "the model returned no image"),
                state="refused",
                cost_usd=cost,
            )
        if REFUSAL_TEXT.search(description):
            raise PaidCallFailed("refused", f"fal_refusal: {description}", state="refused", cost_usd=cost)
        first = images[0] if isinstance(images[0], Mapping) else {"url": images[0]}
        try:
            data = await transfer.download(str(first.get("url", "")))
            image, fmt = await asyncio.to_thread(_decode_image, data)
        except PaidCallFailed as failure:
            failure.cost_usd = cost  # the images were billed even if we could not get them
            raise
        except Exception as exc:
            raise PaidCallFailed(
                "failed",
                f"fal_bad_output: cannot decode the output image ({type(exc).__name__}: {exc})",
                state="completed",
                cost_usd=cost,
            ) from None
        metadata = {
            "width": int(image.shape[1]),
            "height": int(image.shape[0]),
            "output_format": fmt,
            "description": description,
        }
        return PaidReading(image, cost, metadata)

    def _result(self, request: EditRequest, answer: PaidAnswer) -> EditResult:
        metadata: dict[str, Any] = {
            "request_id": answer.request_id,
            "endpoint": answer.endpoint,
            "seconds": answer.seconds,
            "cost_usd": answer.cost_usd,
            "resumed": answer.resumed,
            "submit_tries": answer.submit_tries,
            "seed": int(request.seed),
        }
        if answer.lost_request_ids:
            metadata["lost_request_ids"] = list(answer.lost_request_ids)
        if answer.cancelled:
            metadata["cancelled"] = True
        if answer.pending_request_id:
            metadata["pending_request_id"] = answer.pending_request_id
        metadata.update(answer.metadata)
        return EditResult(
            attempt_id=request.attempt_id,
            status=answer.status,
            image=answer.value if answer.status == OK else None,
            reason=answer.reason,
            cost_usd=answer.cost_usd,
            metadata=metadata,
        )


class _Arguments:
    """The deferred model input of one request (built in a worker thread by the queue)."""

    def __init__(self, editor: FalEditor, request: EditRequest) -> None:
        self.editor, self.request = editor, request

    def __call__(self) -> dict[str, Any]:
        return self.editor.arguments(self.request)


def _decode_image(data: bytes) -> tuple[np.ndarray, str]:
    """Image bytes -> (``(h, w, 3)`` ``uint8`` RGB, container format such as ``"PNG"``)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        fmt = image.format or "unknown"
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb), fmt


EDITORS.register(
    "fal",
    FalOptions,
    FalEditor,
    capabilities=EditorCapabilities(
        batch_size=lambda options: options.concurrency,
        limit="fal",
        per_request=True,
        paid=True,
        cancel_in_flight=cancel_open_requests,
    ),
)
