"""Perceived race and gender from a vision-language model, asked for strict JSON.

The model is reached through an answer backend of ``counterfactory ask``
(:data:`~counterfactory.validation.scoring.registry.ANSWER_BACKENDS`, chosen by name:
``fal``'s vision router, an ``openai``-compatible server, a local ``transformers`` model, a
plug-in's), on that backend's paid client (:mod:`counterfactory.manifests.paid`): its
retries, concurrency bound, spend cap and the caller's journal, so a question already
answered (or, on fal, already submitted) is read back from the journal on resume, never paid
twice. A question is the rendered prompt and the candidate as a PNG; ``temperature`` (0 by
default, so that the same question gets the same answer as far as the model allows) and
``max_tokens`` go as the backend sends them. :class:`VisionAsker` asks; this module's
functions render the prompt and read the answer.

Money (fal). The router bills actual token usage; ``usage.cost`` is the USD charged, and it is what
the journal (and so the spend cap) records for an answered question. Before a question is
sent, the cap is checked against ``estimated_usd_per_question``, a conservative figure the
user can set (default 0.01 USD, about 18 times the 0.00056 USD fal's documentation shows for a
Gemini 2.5 Flash answer about one image); an answer without ``usage.cost`` is recorded at that
estimate.

The prompt is a versioned template in ``assets/prompts/`` (``attribute_vlm_v1.txt``) with
``{LABELS}`` filled from the spec's label set; its version and text are part of every
question's id, so a changed prompt asks again. The answer must be exactly one JSON object
``{"race": <label>, "gender": <label>}`` with labels from that set (a code fence around it is
tolerated); anything else is recorded raw and classified as ``malformed``, ``invalid_label`` or
``refused`` (the refusal wording the editor recognises, or fal's content-policy answer).

Reference: FOCUS (Dehdashtian et al., 2025) checked its edits' labels with a VLM: race
97.9 %, gender 100 %, joint 97.9 %, coverage 1.0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from counterfactory.assets import PROMPTS_DIR
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.paid import PaidCall, PaidCallFailed, PaidJournal, PaidReading
from counterfactory.manifests.paid.fal import REFUSAL_TEXT, check_rgb
from counterfactory.manifests.vocabulary import OK, REFUSED

AnswerStatus = Literal["ok", "malformed", "invalid_label", "refused", "failed"]
DEFAULT_ENDPOINT = "openrouter/router/vision"
DEPRECATED_ENDPOINTS = {"fal-ai/any-llm/vision": DEFAULT_ENDPOINT}
#: USD assumed per question before its real cost is known (see the module docstring).
DEFAULT_ESTIMATE_USD = 0.01
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def current_endpoint(value: str) -> str:
    """``value``, or a ``ValueError`` naming its replacement when fal has deprecated it."""
    if value in DEPRECATED_ENDPOINTS:
        raise ValueError(
            f"fal has deprecated {value!r}; set endpoint: {DEPRECATED_ENDPOINTS[value]} "
            "(the same image_urls, prompt and model inputs)"
        )
    return value


def router_usage(payload: Mapping[str, Any], estimate_usd: float) -> tuple[dict[str, Any], float, bool]:
    """``(usage, cost_usd, measured)`` of one vision-router answer: its ``usage`` mapping, the
    USD it cost (``usage.cost`` when that is a non-negative number, else ``estimate_usd``), and
    whether the cost was the router's own figure."""
    usage = payload.get("usage") if isinstance(payload.get("usage"), Mapping) else {}
    cost = usage.get("cost")
    measured = isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0
    return dict(usage), (float(cost) if measured else estimate_usd), measured


@dataclass(frozen=True)
class VisionAnswer:
    """One question's outcome.

    Attributes:
        status: ``ok`` (valid JSON, every label in the set), ``malformed`` (not one JSON
            object with the asked keys), ``invalid_label`` (a label outside the set),
            ``refused`` (the model declined), ``failed`` (transport or job failure).
        labels: axis -> label for ``ok`` answers, else empty.
        raw: the model's text exactly as returned (None when nothing came back).
        reason: why it is not ``ok``.
        cost_usd: USD this question cost (``usage.cost``; a question fetched again by its
            journaled id after a resume was billed once, by fal, and is recorded once).
        request_id: fal's request id.
        resumed: fetched by a journaled request id instead of asked anew.
    """

    status: AnswerStatus
    labels: dict[str, str] = field(default_factory=dict)
    raw: str | None = None
    reason: str | None = None
    cost_usd: float = 0.0
    request_id: str | None = None
    resumed: bool = False


def load_prompt(version: str) -> str:
    """The template ``assets/prompts/<version>.txt``."""
    path = PROMPTS_DIR / f"{version}.txt"
    if not path.is_file():
        known = sorted(p.stem for p in PROMPTS_DIR.glob("attribute_vlm_*.txt"))
        raise ValueError(f"VLM prompt {version!r} not found at {path}; known: {known}")
    return path.read_text()


def render_prompt(template: str, labels: Mapping[str, Sequence[str]]) -> str:
    """The template with ``{LABELS}`` replaced by one line per axis: ``- race: one of "A", "B"``."""
    lines = [f"- {axis}: one of {', '.join(json.dumps(v) for v in values)}" for axis, values in labels.items()]
    keys = ", ".join(f'"{axis}": <label>' for axis in labels)
    return template.replace("{LABELS}", "\n".join(lines)).replace("{KEYS}", keys)


def parse_answer(
    text: str | None, labels: Mapping[str, Sequence[str]]
) -> tuple[AnswerStatus, dict[str, str], str | None]:
    """``(status, labels, reason)`` for one answer text (see :class:`VisionAnswer`)."""
    if text is None or not text.strip():
        return "malformed", {}, "attribute_vlm: empty answer"
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        if REFUSAL_TEXT.search(text):
            return "refused", {}, f"attribute_vlm: refused: {text.strip()[:200]}"
        return "malformed", {}, f"attribute_vlm: not JSON ({exc.msg} at {exc.pos})"
    if not isinstance(data, dict) or set(data) != set(labels):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        return "malformed", {}, f"attribute_vlm: expected keys {sorted(labels)}, got {got}"
    bad = {k: v for k, v in data.items() if not isinstance(v, str) or v not in labels[k]}
    if bad:
        return "invalid_label", {}, f"attribute_vlm: labels outside the set: {bad}"
    return "ok", {k: str(v) for k, v in data.items()}, None


class VisionAsker:
    """Questions about images through one answer backend
    (:data:`~counterfactory.validation.scoring.registry.ANSWER_BACKENDS`: ``fal``, ``openai``,
    ``transformers``, a plug-in's), on that backend's paid client with the caller's journal.

    One client serves every question (its spend cap counts what is in flight across callers),
    on one event loop of its own in a daemon thread, so that a backend whose connections
    belong to a loop (the ``openai`` client) is used from one loop only, whichever thread asks.

    Args:
        backend: an :class:`~counterfactory.validation.scoring.backends.AnswerBackend`.
        decoding: ``temperature`` / ``max_tokens`` as the backend takes them (part of every
            question's id).
    """

    def __init__(
        self,
        backend: Any,
        *,
        concurrency: int,
        spend_cap_usd: float | None,
        max_retries: int,
        decoding: Mapping[str, Any],
    ) -> None:
        self.backend = backend
        self.decoding = {k: v for k, v in decoding.items() if v is not None}
        self.client = backend.client(concurrency=concurrency, spend_cap_usd=spend_cap_usd, max_retries=max_retries)
        options = getattr(backend, "options", None)
        self.estimate_usd = float(getattr(options, "estimated_usd_per_question", 0.0) or 0.0)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def lineage(self) -> dict[str, Any]:
        """Everything that decides an answer but the prompt and the image."""
        return {**self.backend.lineage(), "decoding": self.decoding, "input_encoding": "png"}

    def question_id(self, image: np.ndarray, prompt: str) -> str:
        """Hash of everything deciding the answer: the lineage, prompt text, image pixels."""
        digest = hashlib.sha256()
        digest.update(json.dumps({**self.lineage(), "prompt": prompt}, sort_keys=True, default=str).encode())
        digest.update(repr((image.shape, str(image.dtype))).encode())
        digest.update(np.ascontiguousarray(image).tobytes())
        return "vlm-" + digest.hexdigest()

    def arguments(self, image: np.ndarray, prompt: str, key: str) -> dict[str, Any]:
        """The backend's request input for one question.

        Raises:
            PaidCallFailed: ``attribute_vlm_bad_input`` unless ``image`` is ``(H, W, 3)`` uint8.
        """
        check_rgb(image, "attribute_vlm_bad_input")
        extra = {"answer_id": key} if getattr(self.backend, "takes_answer_id", False) else {}
        return self.backend.arguments(prompt, [(png_bytes(image), ".png")], dict(self.decoding), 0, **extra)

    async def _read(self, call: PaidCall, payload: dict[str, Any], transfer: Any) -> PaidReading:
        """The backend's reading of a result -> (the reply text, its cost in USD)."""
        try:
            got = self.backend.read(payload)
            reply, cost = got.get("reply"), float(got.get("cost_usd") or 0.0)
        except (CounterfactoryError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PaidCallFailed(
                "failed", f"attribute_vlm_unreadable: {type(exc).__name__}: {exc}"[:500], cost_usd=self.estimate_usd
            ) from None
        return PaidReading(None if reply is None else str(reply), cost, {"finish_reason": got.get("finish_reason")})

    def _run(self, coroutine: Any) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="vision-asker", daemon=True).start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def ask_many(
        self, images: Sequence[np.ndarray], prompt: str, journal: PaidJournal | None = None
    ) -> list[tuple[str, VisionAnswer]]:
        """Ask ``prompt`` about each ``(H, W, 3)`` uint8 image, at most ``concurrency`` in
        flight; returns ``(question id, answer)`` in order, the answer's ``raw`` text unparsed
        (the caller knows the labels)."""
        calls = []
        for image in images:
            key = self.question_id(image, prompt)
            calls.append(PaidCall(key, lambda im=image, key=key: self.arguments(im, prompt, key)))
        answers = self._run(self.client.arun_many(calls, self._read, journal))
        out = []
        for call, a in zip(calls, answers, strict=True):
            kind: AnswerStatus = a.status if a.status in (OK, REFUSED) else "failed"
            raw = a.value if a.status == OK else None
            out.append((call.key, VisionAnswer(kind, {}, raw, a.reason, a.cost_usd, a.request_id, a.resumed)))
        return out

    def close(self) -> None:
        """Closes the backend's connections and stops the loop (idempotent)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self.backend.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)


def png_bytes(image: np.ndarray) -> bytes:
    """``(H, W, 3)`` uint8 RGB as PNG bytes (lossless)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def ask_labels(
    asker: VisionAsker,
    images: Sequence[np.ndarray],
    labels: Mapping[str, Sequence[str]],
    *,
    prompt_version: str = "attribute_vlm_v1",
    journal: PaidJournal | None = None,
) -> list[VisionAnswer]:
    """Perceived labels for each image: ask, then parse each raw answer against ``labels``."""
    prompt = render_prompt(load_prompt(prompt_version), labels)
    out = []
    for _, answer in asker.ask_many(images, prompt, journal):
        if answer.status != OK:
            out.append(answer)
            continue
        status, parsed, reason = parse_answer(answer.raw, labels)
        out.append(VisionAnswer(status, parsed, answer.raw, reason, answer.cost_usd, answer.request_id, answer.resumed))
    return out
