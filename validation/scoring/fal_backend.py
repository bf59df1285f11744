"""``counterfactory ask --backend fal``: fal's vision router answers the trials.

Questions go to ``openrouter/router/vision`` (the VLM attribute gate asks through this
backend too, :mod:`counterfactory.validation.backends.vlm`) through the fal queue client
(:class:`~counterfactory.manifests.paid.fal.FalQueue`), the same paid-request client as the
``fal`` editor and that gate. A question sends ``image_urls`` (the trial's images as data URIs,
in order), ``prompt``, ``model`` (``--model``, e.g. ``google/gemini-2.5-flash``), the trial's
``temperature`` and ``max_tokens`` when its decoding settings name them, and ``system_prompt``
when one is set; the answer is ``{"output": <text>, "usage": {..., "cost": <USD>}}``. The
router takes no seed: samples of one trial differ only as far as the model samples.

Money and resume. fal bills a request that runs whether or not anybody collects it, so the
queue journals each request id (with the estimated price) in the answers ledger's
``requests`` table before it waits: a question in flight when ``ask`` is killed, even by
SIGKILL, is fetched by its request id on the next run, never submitted again. The answer, with
``usage.cost`` as its ``cost_usd`` (``estimated_usd_per_question`` when the router reports
none), replaces that row in one transaction. ``--max-spend`` is checked before each submission
against the model's answers plus every journaled request not yet answered, at
``estimated_usd_per_question`` each (0.01 USD unless ``--estimated-usd-per-question`` says
otherwise; set it above what the model costs per question). A text refusal is an answer like
any other; fal's content-policy block (HTTP 422 ``content_policy_violation``) is recorded as an
answer with no reply and ``finish_reason`` ``content_filter``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from counterfactory.manifests.paid import PaidCallFailed, PaidClient
from counterfactory.manifests.paid.fal import FalQueue, FalQueueOptions
from counterfactory.validation.backends.vlm import (
    DEFAULT_ENDPOINT,
    DEFAULT_ESTIMATE_USD,
    current_endpoint,
    router_usage,
)
from counterfactory.validation.scoring.backends import AnswerBackend, data_url
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS


class FalAnswerOptions(FalQueueOptions):
    """``--backend fal``: the transport's options
    (:class:`~counterfactory.manifests.paid.fal.FalQueueOptions`; ``ask`` sets ``concurrency``,
    ``spend_cap_usd`` and ``max_retries`` from its own options) and the router's.

    Attributes:
        model: the model the router sends the question to (``--model``).
        endpoint: fal endpoint id of the vision router.
        estimated_usd_per_question: USD the spend cap holds for a question in flight, and
            records for an answer without ``usage.cost``.
        system_prompt: optional system prompt (part of the lineage, so of every answer id).
        reasoning: ask the model to reason first (sent, and part of the lineage, only when set;
            the attribute gate sets it to false).
    """

    model: str
    endpoint: str = DEFAULT_ENDPOINT
    estimated_usd_per_question: float = Field(DEFAULT_ESTIMATE_USD, ge=0, allow_inf_nan=False)
    system_prompt: str | None = None
    reasoning: bool | None = None

    @field_validator("endpoint")
    @classmethod
    def _not_deprecated(cls, value: str) -> str:
        return current_endpoint(value)


class FalVisionRouter(AnswerBackend):
    """fal's vision router on the fal queue client."""

    name = "fal"
    #: the router answers questions about images: a question without one is not sent
    needs_images = True

    def __init__(self, options: FalAnswerOptions) -> None:
        self.options = options

    def lineage(self) -> dict[str, Any]:
        o = self.options
        lineage = {"backend": self.name, "model": o.model, "endpoint": o.endpoint, "system_prompt": o.system_prompt}
        if o.reasoning is not None:  # absent when unset: the answer ids of earlier asks stay
            lineage["reasoning"] = o.reasoning
        return lineage

    def client(self, *, concurrency: int, spend_cap_usd: float | None, max_retries: int) -> PaidClient:
        o = self.options
        transport = FalQueueOptions.model_validate(
            o.model_dump(include=set(FalQueueOptions.model_fields))
            | {"concurrency": concurrency, "spend_cap_usd": spend_cap_usd, "max_retries": max_retries}
        )
        return FalQueue(
            o.endpoint,
            transport,
            estimate_usd=o.estimated_usd_per_question,
            known_endpoints=(DEFAULT_ENDPOINT,),
            client_name="fal",
        )

    def arguments(
        self, prompt: str, images: list[tuple[bytes, str]], decoding: dict[str, Any], sample: int
    ) -> dict[str, Any]:
        if not images:
            raise PaidCallFailed(
                "failed",
                "fal_no_image: the vision router answers questions about images; ask this with --backend openai",
            )
        o = self.options
        body: dict[str, Any] = {
            "image_urls": [data_url(data, suffix) for data, suffix in images],
            "prompt": prompt,
            "model": o.model,
        }
        for name in ("temperature", "max_tokens"):
            if name in decoding:
                body[name] = decoding[name]
        if o.system_prompt is not None:
            body["system_prompt"] = o.system_prompt
        if o.reasoning is not None:
            body["reasoning"] = o.reasoning
        return body

    def read(self, result: dict[str, Any]) -> dict[str, Any]:
        usage, cost, _ = router_usage(result, self.options.estimated_usd_per_question)
        text = result.get("output")
        return {
            "reply": None if text is None else str(text),
            "finish_reason": result.get("finish_reason"),
            "tokens_in": usage.get("prompt_tokens"),
            "tokens_out": usage.get("completion_tokens"),
            "cost_usd": cost,
        }


ANSWER_BACKENDS.register("fal", FalAnswerOptions, FalVisionRouter)
