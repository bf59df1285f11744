"""Answer backends for ``counterfactory ask``, registered in
:data:`~counterfactory.manifests.registry.ANSWER_BACKENDS` like the editors.

A backend answers one trial: ``await backend.answer(prompt, images, decoding, sample)`` returns
``{"reply", "finish_reason", "tokens_in", "tokens_out"}``; ``lineage()`` says which model
answered (hashed into every answer id). Transport errors raise :class:`TransportError`, which
``ask`` retries; anything the model says, a refusal included, is an answer.

``openai``: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama, LM Studio,
OpenRouter, OpenAI) through the ``openai`` client, images as base64 data URLs.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from pydantic import BaseModel, ConfigDict

from counterfactory.manifests.errors import CounterfactoryError, SetupError
from counterfactory.manifests.registry import ANSWER_BACKENDS


class TransportError(CounterfactoryError):
    """The request did not get an answer (connection, timeout, rate limit, server error): retry it."""


class AnswerBackend:
    """What ``ask`` calls (one instance per run)."""

    name = ""

    def lineage(self) -> dict[str, Any]:
        raise NotImplementedError

    async def answer(
        self, prompt: str, images: list[tuple[bytes, str]], decoding: dict[str, Any], sample: int
    ) -> dict[str, Any]:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class OpenAIOptions(BaseModel):
    """``--backend openai``: the model, where it is served, and its price for the spend cap.

    Attributes:
        model: the served model's name (``--model``).
        base_url: the endpoint (``--base-url``, e.g. ``http://127.0.0.1:8000/v1`` for vLLM);
            None is OpenAI's own API.
        api_key_env: the environment variable holding the key (a local server needs none).
        timeout_s: one request's timeout.
        usd_per_mtok_in, usd_per_mtok_out: price per million tokens, for ``--max-spend``.
        revision: a model revision or snapshot date, part of the lineage.
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    revision: str | None = None


def data_url(data: bytes, suffix: str) -> str:
    """An image as a ``data:`` URL (the form OpenAI-compatible servers take inline images in)."""
    mime = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}.get(suffix.lower(), "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class OpenAIChat(AnswerBackend):
    """An OpenAI-compatible chat endpoint (``openai.AsyncOpenAI``; its own retries off, ``ask`` retries)."""

    name = "openai"

    def __init__(self, options: OpenAIOptions) -> None:
        try:
            import openai
        except ImportError:
            raise SetupError(
                "the openai backend needs the openai package: pip install 'counterfactory[score]'"
            ) from None
        try:  # the HTTP response class of the client's transport (httpx2 from openai 3, httpx before)
            from httpx2 import Response as raw_response
        except ImportError:
            from httpx import Response as raw_response

        self.options = options
        self._openai = openai
        self._raw = raw_response
        key = os.environ.get(options.api_key_env)
        if key is None and options.base_url is None:
            raise SetupError(f"--backend openai without --base-url needs an API key in ${options.api_key_env}")
        self.client = openai.AsyncOpenAI(
            api_key=key or "not-needed", base_url=options.base_url, max_retries=0, timeout=options.timeout_s
        )

    def lineage(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.options.model,
            "revision": self.options.revision,
            "endpoint": self.options.base_url or "https://api.openai.com/v1",
        }

    def cost(self, tokens_in: int | None, tokens_out: int | None) -> float:
        o = self.options
        return ((tokens_in or 0) * o.usd_per_mtok_in + (tokens_out or 0) * o.usd_per_mtok_out) / 1e6

    async def answer(
        self, prompt: str, images: list[tuple[bytes, str]], decoding: dict[str, Any], sample: int
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": data_url(data, suffix)}} for data, suffix in images
        ]
        content.append({"type": "text", "text": prompt})
        kwargs: dict[str, Any] = {"model": self.options.model, "messages": [{"role": "user", "content": content}]}
        if "temperature" in decoding:
            kwargs["temperature"] = decoding["temperature"]
        if "max_tokens" in decoding:
            kwargs["max_tokens"] = decoding["max_tokens"]
        if "top_p" in decoding:
            kwargs["top_p"] = decoding["top_p"]
        kwargs["seed"] = int(sample)
        o = self._openai
        try:
            # the client's own ``post`` with the body as it is: ``chat.completions.create`` first
            # walks the body against its TypedDicts (every message part, the data URLs too),
            # which cost more CPU per answer than the rest of the request
            # and the reply read as JSON, not built into the client's pydantic models (the client
            # still raises its typed errors on a non-2xx status)
            raw = await self.client.post("/chat/completions", body=kwargs, cast_to=self._raw)
        except (o.APIConnectionError, o.APITimeoutError, o.RateLimitError, o.InternalServerError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        try:
            resp = raw.json()
            choice = resp["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TransportError(f"not a chat completion: {raw.text[:200]!r}") from exc
        message = choice.get("message") or {}
        reply = message.get("content")
        if reply is None and message.get("refusal"):
            reply = message["refusal"]  # the API's own refusal field: a refusal is an answer
        usage = resp.get("usage") or {}
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return {
            "reply": reply,
            "finish_reason": choice.get("finish_reason"),
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": self.cost(tokens_in, tokens_out),
        }

    async def aclose(self) -> None:
        await self.client.close()


ANSWER_BACKENDS.register("openai", OpenAIOptions, OpenAIChat)
