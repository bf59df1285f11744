"""Perceived race and gender from a vision-language model hosted on fal, asked for strict JSON.

The model is reached through fal's vision router (``openrouter/router/vision``; the older
``fal-ai/any-llm/vision`` is deprecated by fal), as one client of the shared fal queue
transport (:mod:`counterfactory.manifests.paid.fal`): the same queue client,
retries, cancellation, concurrency bound, spend cap and request journal as the ``fal``
editor, so a question already paid for is fetched by its journaled request id on resume,
never asked again. A question sends ``image_urls`` (the candidate as a PNG data URI),
``prompt``, ``model`` (e.g. ``google/gemini-2.5-flash``), ``temperature`` (0 by default, so
that the same question gets the same answer as far as the model allows), ``reasoning`` and,
when set, ``system_prompt`` and ``max_tokens``; the answer is ``{"output": <text>, "usage":
{..., "cost": <USD>}}``.

Money. The router bills actual token usage; ``usage.cost`` is the USD charged, and it is what
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

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from counterfactory.assets import PROMPTS_DIR
from counterfactory.manifests.paid import PaidCall, PaidJournal, PaidReading
from counterfactory.manifests.paid.fal import (
    REFUSAL_TEXT,
    FalQueue,
    FalQueueOptions,
    FalTransfer,
    check_rgb,
    png_data_uri,
)
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


class FalVisionOptions(FalQueueOptions):
    """``gates.face.attribute.fal`` in the spec: the transport's options
    (:class:`~counterfactory.manifests.paid.fal.FalQueueOptions`) and the router's.

    Attributes:
        endpoint: fal endpoint id of the vision router.
        estimated_usd_per_question: USD the spend cap assumes for a question before fal
            reports its real ``usage.cost``; set it above what your model costs per image.
        temperature: sampling temperature, 0..2 (fal's default is 1; 0 for reproducible answers).
        max_tokens: the most tokens the model may answer with; ``None`` leaves fal's default.
        reasoning: ask the model to reason first (costs more tokens; the answer must still be
            one JSON object).
        system_prompt: optional system prompt.
    """

    endpoint: str = DEFAULT_ENDPOINT
    estimated_usd_per_question: float = Field(DEFAULT_ESTIMATE_USD, ge=0)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    reasoning: bool = False
    system_prompt: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _not_deprecated(cls, value: str) -> str:
        return current_endpoint(value)


class FalVisionClient:
    """Questions about images to a fal-hosted VLM, one call each on a :class:`FalQueue`.

    Args:
        options: the router and transport options.
        model: the ``model`` the router sends the question to (e.g. ``google/gemini-2.5-flash``).
    """

    name = "fal_vlm"

    def __init__(self, options: FalVisionOptions, *, model: str) -> None:
        self.options = options
        self.model = model
        self.queue = FalQueue(
            options.endpoint,
            options,
            estimate_usd=options.estimated_usd_per_question,
            known_endpoints=(DEFAULT_ENDPOINT,),
            client_name="gates.face.attribute.fal",
        )

    def lineage(self) -> dict[str, Any]:
        """Everything that decides an answer but the prompt and the image."""
        o = self.options
        return {
            "backend": self.name,
            "endpoint": o.endpoint,
            "model": self.model,
            "temperature": o.temperature,
            "max_tokens": o.max_tokens,
            "reasoning": o.reasoning,
            "system_prompt": o.system_prompt,
            "input_encoding": "png_data_uri",
        }

    def prepare(self) -> None:
        """Checks fal-client, the key and the endpoint (see :meth:`FalQueue.prepare`)."""
        self.queue.prepare()

    def question_id(self, image: np.ndarray, prompt: str) -> str:
        """Hash of everything deciding the answer: the lineage, prompt text, image pixels."""
        digest = hashlib.sha256()
        digest.update(json.dumps({**self.lineage(), "prompt": prompt}, sort_keys=True).encode())
        digest.update(repr((image.shape, str(image.dtype))).encode())
        digest.update(np.ascontiguousarray(image).tobytes())
        return "vlm-" + digest.hexdigest()

    def arguments(self, image: np.ndarray, prompt: str) -> dict[str, Any]:
        """The router's input for one question.

        Raises:
            PaidCallFailed: ``attribute_vlm_bad_input`` unless ``image`` is ``(H, W, 3)`` uint8.
        """
        check_rgb(image, "attribute_vlm_bad_input")
        o = self.options
        body: dict[str, Any] = {
            "image_urls": [png_data_uri(image)],
            "prompt": prompt,
            "model": self.model,
            "temperature": o.temperature,
            "reasoning": o.reasoning,
        }
        if o.system_prompt is not None:
            body["system_prompt"] = o.system_prompt
        if o.max_tokens is not None:
            body["max_tokens"] = o.max_tokens
        return body

    def ask_many(
        self, images: Sequence[np.ndarray], prompt: str, journal: PaidJournal | None = None
    ) -> list[tuple[str, VisionAnswer]]:
        """Ask ``prompt`` about each ``(H, W, 3)`` uint8 image, at most ``concurrency`` in
        flight; returns ``(question id, answer)`` in order, the answer's ``raw`` text unparsed
        (the caller knows the labels)."""
        calls = [PaidCall(self.question_id(im, prompt), lambda im=im: self.arguments(im, prompt)) for im in images]
        answers = self.queue.run_many(calls, self._read, journal)
        out = []
        for call, a in zip(calls, answers, strict=True):
            kind: AnswerStatus = a.status if a.status in (OK, REFUSED) else "failed"
            out.append(
                (
                    call.key,
                    VisionAnswer(
                        kind,
                        raw=a.value if a.status == OK else None,
                        reason=a.reason,
                        cost_usd=a.cost_usd,
                        request_id=a.request_id,
                        resumed=a.resumed,
                    ),
                )
            )
        return out

    async def _read(self, call: PaidCall, payload: dict[str, Any], transfer: FalTransfer) -> PaidReading:
        """The router's answer -> (its text, ``usage.cost`` in USD)."""
        usage, cost, measured = router_usage(payload, self.options.estimated_usd_per_question)
        text = payload.get("output")
        return PaidReading(
            None if text is None else str(text),
            cost,
            {"usage": usage, "cost_source": "usage" if measured else "estimate"},
        )


def ask_labels(
    client: FalVisionClient,
    images: Sequence[np.ndarray],
    labels: Mapping[str, Sequence[str]],
    *,
    prompt_version: str = "attribute_vlm_v1",
    journal: PaidJournal | None = None,
) -> list[VisionAnswer]:
    """Perceived labels for each image: ask, then parse each raw answer against ``labels``."""
    prompt = render_prompt(load_prompt(prompt_version), labels)
    out = []
    for _, answer in client.ask_many(images, prompt, journal):
        if answer.status != OK:
            out.append(answer)
            continue
        status, parsed, reason = parse_answer(answer.raw, labels)
        out.append(VisionAnswer(status, parsed, answer.raw, reason, answer.cost_usd, answer.request_id, answer.resumed))
    return out
