"""Answer backends for ``counterfactory ask``, registered in
:data:`~counterfactory.manifests.registry.ANSWER_BACKENDS` like the editors.

A backend says how one question travels; the paid-request client it names
(:mod:`counterfactory.manifests.paid`) sends it, and keeps ``ask``'s promises: at most
``concurrency`` in flight, the spend cap checked (with what is in flight) before each new
request, transport errors retried with backoff, each answer journaled the moment it returns.
``arguments(prompt, images, decoding, sample)`` is one question's request input (built in a
worker thread), ``read(result)`` its answer as ``{"reply", "finish_reason", "tokens_in",
"tokens_out", "cost_usd"}`` (anything the model says, a refusal included, is an answer),
``client(...)`` the paid client, and ``lineage()`` says which model answered (hashed into every
answer id).

``openai``: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama, LM Studio,
OpenRouter, OpenAI) through the ``openai`` client, images as base64 data URLs, on a
:class:`~counterfactory.manifests.paid.direct.DirectClient` (transient: the client's
connection, time-out, rate-limit and 5xx errors). ``fal`` (:mod:`.fal_backend`): fal's vision
router on the fal queue client.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from counterfactory.manifests.errors import CounterfactoryError, SetupError
from counterfactory.manifests.paid import PaidClient
from counterfactory.manifests.registry import ANSWER_BACKENDS


class TransportError(CounterfactoryError):
    """The request did not get an answer (a reply that is not a chat completion): retry it."""


class AnswerBackend:
    """What ``ask`` calls (one instance per run)."""

    name = ""

    def lineage(self) -> dict[str, Any]:
        raise NotImplementedError

    def client(self, *, concurrency: int, spend_cap_usd: float | None, max_retries: int) -> PaidClient:
        """The paid-request client that sends this backend's questions."""
        raise NotImplementedError

    def arguments(
        self, prompt: str, images: list[tuple[bytes, str]], decoding: dict[str, Any], sample: int
    ) -> dict[str, Any]:
        """One question's request input (``images``: each file's bytes and suffix)."""
        raise NotImplementedError

    def read(self, result: dict[str, Any]) -> dict[str, Any]:
        """A returned result as ``{"reply", "finish_reason", "tokens_in", "tokens_out", "cost_usd"}``."""
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
        estimated_usd_per_question: USD held against ``--max-spend`` for each question in
            flight (its real cost, from the tokens, replaces it when it returns); 0 lets up to
            ``--concurrency`` questions past the cap.
        backoff_s: the first retry's delay in seconds (doubles per retry, jittered, at most 30 s).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    revision: str | None = None
    estimated_usd_per_question: float = Field(0.0, ge=0)
    backoff_s: float = Field(0.1, ge=0)


def data_url(data: bytes, suffix: str) -> str:
    """An image as a ``data:`` URL (the form OpenAI-compatible servers take inline images in)."""
    mime = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}.get(suffix.lower(), "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class OpenAIChat(AnswerBackend):
    """An OpenAI-compatible chat endpoint (``openai.AsyncOpenAI``, its own retries off) on a
    :class:`~counterfactory.manifests.paid.direct.DirectClient`, which retries."""

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
        self.http = openai.AsyncOpenAI(
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

    def client(self, *, concurrency: int, spend_cap_usd: float | None, max_retries: int) -> PaidClient:
        from counterfactory.manifests.paid.direct import DirectClient

        o = self._openai
        return DirectClient(
            self.send,
            name="openai",
            concurrency=concurrency,
            spend_cap_usd=spend_cap_usd,
            estimate_usd=self.options.estimated_usd_per_question,
            max_retries=max_retries,
            backoff_s=self.options.backoff_s,
            # the client's transport failures (APITimeoutError is an APIConnectionError), 429,
            # 5xx, and a 2xx body that is not a chat completion
            transient=(o.APIConnectionError, o.RateLimitError, o.InternalServerError, TransportError),
        )

    def arguments(
        self, prompt: str, images: list[tuple[bytes, str]], decoding: dict[str, Any], sample: int
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": data_url(data, suffix)}} for data, suffix in images
        ]
        content.append({"type": "text", "text": prompt})
        kwargs: dict[str, Any] = {"model": self.options.model, "messages": [{"role": "user", "content": content}]}
        for name in ("temperature", "max_tokens", "top_p"):
            if name in decoding:
                kwargs[name] = decoding[name]
        kwargs["seed"] = int(sample)
        return kwargs

    async def send(self, body: dict[str, Any]) -> dict[str, Any]:
        """POSTs one chat completion; its JSON.

        Raises:
            SetupError: the endpoint rejected the key (401/403).
            TransportError: a 2xx answer that is not a chat completion (retried).
        """
        o = self._openai
        try:
            # the client's own ``post`` with the body as it is: ``chat.completions.create`` first
            # walks the body against its TypedDicts (every message part, the data URLs too),
            # which cost more CPU per answer than the rest of the request
            # and the reply read as JSON, not built into the client's pydantic models (the client
            # still raises its typed errors on a non-2xx status)
            raw = await self.http.post("/chat/completions", body=body, cast_to=self._raw)
        except (o.AuthenticationError, o.PermissionDeniedError) as exc:
            endpoint = self.options.base_url or "https://api.openai.com/v1"
            raise SetupError(
                f"{endpoint} rejected the key in ${self.options.api_key_env} ({type(exc).__name__}: {exc}); "
                f"set ${self.options.api_key_env} to a key it accepts, or --api-key-env to the variable that holds one"
            ) from None
        try:
            resp = raw.json()
            resp["choices"][0]["message"]  # noqa: B018 - the shape of a chat completion
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TransportError(f"not a chat completion: {raw.text[:200]!r}") from exc
        return resp

    def read(self, result: dict[str, Any]) -> dict[str, Any]:
        choice = result["choices"][0]
        message = choice.get("message") or {}
        reply = message.get("content")
        if reply is None and message.get("refusal"):
            reply = message["refusal"]  # the API's own refusal field: a refusal is an answer
        usage = result.get("usage") or {}
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return {
            "reply": reply,
            "finish_reason": choice.get("finish_reason"),
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": self.cost(tokens_in, tokens_out),
        }

    async def aclose(self) -> None:
        await self.http.close()


ANSWER_BACKENDS.register("openai", OpenAIOptions, OpenAIChat)
