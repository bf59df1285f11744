"""Perceived race and gender from a vision-language model hosted on fal, asked for strict JSON.

The transport is the ``fal`` editor's own (:class:`~counterfactory.generation.editors.fal.FalEditor`):
the same queue client, retries, concurrency bound, spend cap and request journal, so a
question already paid for is fetched by its journaled request id on resume, never asked again.
Only what differs from an edit is replaced: the request body (the prompt, the image as a PNG
data URI, the chosen ``model``) and the reading of the answer (text, not an image).

The prompt is a versioned template in ``assets/prompts/`` (``attribute_vlm_v1.txt``) with
``{LABELS}`` filled from the spec's label set; its version and text are part of every
question's id, so a changed prompt asks again. The answer must be exactly one JSON object
``{"race": <label>, "gender": <label>}`` with labels from that set (a code fence around it is
tolerated); anything else is recorded raw and classified as ``malformed``, ``invalid_label`` or
``refused`` (the same refusal wording the editor recognises).

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

from counterfactory.assets import PROMPTS_DIR
from counterfactory.generation.editors.base import EditJournal, EditRequest, MemoryJournal
from counterfactory.generation.editors.fal import _REFUSAL_TEXT, FalEditor, FalOptions, _encode_png, _Outcome

AnswerStatus = Literal["ok", "malformed", "invalid_label", "refused", "failed"]
DEFAULT_ENDPOINT = "fal-ai/any-llm/vision"
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


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
        cost_usd: money this question cost (0 when fetched again from the journal's id
            after a resume is still billed once, by fal, and recorded once).
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
        if _REFUSAL_TEXT.search(text):
            return "refused", {}, f"attribute_vlm: refused: {text.strip()[:200]}"
        return "malformed", {}, f"attribute_vlm: not JSON ({exc.msg} at {exc.pos})"
    if not isinstance(data, dict) or set(data) != set(labels):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        return "malformed", {}, f"attribute_vlm: expected keys {sorted(labels)}, got {got}"
    bad = {k: v for k, v in data.items() if not isinstance(v, str) or v not in labels[k]}
    if bad:
        return "invalid_label", {}, f"attribute_vlm: labels outside the set: {bad}"
    return "ok", {k: str(v) for k, v in data.items()}, None


class FalVisionClient(FalEditor):
    """Questions to a fal-hosted VLM through :class:`FalEditor`'s queue machinery.

    Args:
        options: the fal transport options; ``endpoint`` is the VLM endpoint and
            ``prices_usd[endpoint]`` its USD per question (required: fal's LLM prices vary by
            model, so the spend cap needs the user's figure).
        model: the ``model`` argument the endpoint routes to (e.g. ``google/gemini-2.5-flash``).
    """

    name = "fal_vlm"

    def __init__(self, options: FalOptions, *, model: str) -> None:
        super().__init__(options)
        self.model = model

    def lineage(self) -> dict[str, Any]:
        return {"backend": self.name, "endpoint": self.options.endpoint, "model": self.model}

    def question_id(self, image: np.ndarray, prompt: str) -> str:
        """Hash of everything deciding the answer: endpoint, model, prompt text, image pixels."""
        digest = hashlib.sha256()
        digest.update(json.dumps({**self.lineage(), "prompt": prompt}, sort_keys=True).encode())
        digest.update(repr((image.shape, str(image.dtype))).encode())
        digest.update(np.ascontiguousarray(image).tobytes())
        return "vlm-" + digest.hexdigest()

    def ask_many(
        self, images: Sequence[np.ndarray], prompt: str, journal: EditJournal | None = None
    ) -> list[tuple[str, VisionAnswer]]:
        """Ask ``prompt`` about each image, at most ``concurrency`` in flight; returns
        ``(question id, answer)`` in order. Parsing is left to the caller (it knows the labels)."""
        requests = [EditRequest(self.question_id(im, prompt), im, prompt, seed=0) for im in images]
        answers = self.edit_many(requests, journal if journal is not None else MemoryJournal())
        return [(r.attempt_id, a) for r, a in zip(requests, answers, strict=True)]

    # -- the two places a question differs from an edit -----------------------------------

    def _arguments(self, request: EditRequest) -> dict[str, Any]:
        image = request.image
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
            raise _Outcome(
                "failed",
                f"attribute_vlm_bad_input: image must be (H, W, 3) uint8 RGB, got {getattr(image, 'shape', None)}",
            )
        return {
            **self.options.arguments,
            "model": self.model,
            "prompt": request.prompt,
            "image_urls": [self._fal.encode(_encode_png(image), "image/png")],
        }

    async def _finish(self, request: EditRequest, progress: Any, payload: dict[str, Any], batch: Any) -> VisionAnswer:
        from counterfactory.generation.editors.fal import _row

        price = float(self._price(progress.endpoint or self.options.endpoint) or 0.0)
        text = payload.get("output")
        error = payload.get("error")
        batch.journal.save(request.attempt_id, _row(progress, "completed"), cost_usd=price)
        if error and not text:
            return VisionAnswer(
                "failed",
                raw=None,
                reason=f"attribute_vlm: {error}",
                cost_usd=price,
                request_id=progress.request_id,
                resumed=progress.resumed,
            )
        return VisionAnswer(
            "ok",
            raw=None if text is None else str(text),
            cost_usd=price,
            request_id=progress.request_id,
            resumed=progress.resumed,
        )

    def _result(
        self,
        request: EditRequest,
        progress: Any,
        status: str,
        *,
        reason: str | None = None,
        cost_usd: float = 0.0,
        **_: Any,
    ) -> VisionAnswer:  # type: ignore[override]
        kind: AnswerStatus = "refused" if status == "refused" else "failed"
        return VisionAnswer(
            kind, reason=reason, cost_usd=cost_usd, request_id=progress.request_id, resumed=progress.resumed
        )


def ask_labels(
    client: FalVisionClient,
    images: Sequence[np.ndarray],
    labels: Mapping[str, Sequence[str]],
    *,
    prompt_version: str = "attribute_vlm_v1",
    journal: EditJournal | None = None,
) -> list[VisionAnswer]:
    """Perceived labels for each image: ask, then parse each raw answer against ``labels``."""
    prompt = render_prompt(load_prompt(prompt_version), labels)
    out = []
    for _, answer in client.ask_many(images, prompt, journal):
        if answer.status != "ok":
            out.append(answer)
            continue
        status, parsed, reason = parse_answer(answer.raw, labels)
        out.append(VisionAnswer(status, parsed, answer.raw, reason, answer.cost_usd, answer.request_id, answer.resumed))
    return out
