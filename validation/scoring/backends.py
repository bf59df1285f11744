"""Answer backends for ``counterfactory ask``, registered in
:data:`~counterfactory.validation.scoring.registry.ANSWER_BACKENDS` like the editors.

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
import hashlib
import math
import os
import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from counterfactory.manifests.errors import CounterfactoryError, SetupError
from counterfactory.manifests.paid import PaidClient, redact
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS


class TransportError(CounterfactoryError):
    """The request did not get an answer (a reply that is not a chat completion): retry it."""


class ReplyError(CounterfactoryError, ValueError):
    """A reply ``ask`` cannot record as an answer (a shape it does not know, token counts that
    are not counts, a body over its bound): recorded as an error row for that answer."""


#: the most bytes of one reply's body (``max_reply_bytes``'s default): 1 MiB
MAX_REPLY_BYTES = 1 << 20
#: the most tokens one request may report on either side; a count beyond it is not a count
MAX_TOKENS = 100_000_000
#: connection failures in a row (no answer between them) after which ``ask`` stops: nothing listens
REFUSED_LIMIT = 3
#: query parameters of a base URL that carry a credential, refused like ``user:password@``
_SECRET_QUERY = re.compile(r"(?i)^(api[_-]?key|key|token|access[_-]?token|secret|password|sig|signature|auth)$")


def token_count(value: Any, field: str) -> int | None:
    """A reported token count: ``None`` (not reported) or a whole number in ``[0, MAX_TOKENS]``.

    Raises:
        ReplyError: a string, a bool, a negative, fractional, infinite or NaN number, or one
            above :data:`MAX_TOKENS`, naming ``field``.
    """
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ReplyError(f"{field} is {shown}: not a token count (a whole number from 0 to {MAX_TOKENS:,})")
    return value


def reply_text(content: Any, field: str = "choices[0].message.content") -> str | None:
    """A chat message's ``content`` as text: a string as it is, a list of text parts joined
    (each ``{"type": "text", "text": ...}`` or a string), ``None`` as no text.

    Raises:
        ReplyError: anything else (a dict, a number, a part that is not text), naming ``field``.
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ReplyError(f"{field}[{i}] is a {str(kind)[:40]!r} part, not text")
        return "".join(texts)
    raise ReplyError(f"{field} is a {type(content).__name__}, not text or a list of text parts")


def endpoint_origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL: where a request goes."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def check_base_url(url: str) -> str:
    """``--base-url`` as given, when it is an http(s) URL with a host and no credentials.

    Raises:
        ValueError: a URL with ``user:password@`` or a key-like query parameter (never echoed:
            it would be stored in every answer's lineage and sent as Basic auth), another
            scheme, or no host.
    """
    parts = urlsplit(url)
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise ValueError(
            "a URL with credentials (user:password@) is refused: they would be stored in every answer and sent "
            "to the server as Basic auth; give the URL without them and the key in the variable --api-key-env names"
        )
    secret = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_QUERY.match(k)]
    if secret:
        raise ValueError(
            f"a URL with a credential in its query ({secret[0]}=...) is refused: it would be stored in every answer; "
            "give the key in the variable --api-key-env names"
        )
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
    return url


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
            flight (its real cost, from the tokens, replaces it when it is read); with 0, no
            question is sent once the answers' cost reaches the cap, so the ones paid past it
            are at most those in flight then: ``--concurrency`` - 1 besides the one that
            reached it.
        backoff_s: the first retry's delay in seconds (doubles per retry, jittered, at most 30 s).
        max_reply_bytes: the most bytes of one reply's body; a longer one is an error for that
            answer (recorded, not stored).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    usd_per_mtok_in: float = Field(0.0, ge=0, allow_inf_nan=False)
    usd_per_mtok_out: float = Field(0.0, ge=0, allow_inf_nan=False)
    revision: str | None = None
    estimated_usd_per_question: float = Field(0.0, ge=0, allow_inf_nan=False)
    backoff_s: float = Field(0.1, ge=0, allow_inf_nan=False)
    max_reply_bytes: int = Field(MAX_REPLY_BYTES, ge=1024)

    @field_validator("base_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)


def data_url(data: bytes, suffix: str) -> str:
    """An image as a ``data:`` URL (the form OpenAI-compatible servers take inline images in)."""
    mime = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}.get(suffix.lower(), "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class OpenAIChat(AnswerBackend):
    """An OpenAI-compatible chat endpoint (``openai.AsyncOpenAI``, its own retries off) on a
    :class:`~counterfactory.manifests.paid.direct.DirectClient`, which retries.

    What it trusts of the server: nothing. Every request (a redirect's too) must go to the
    ``--base-url``'s own scheme, host and port, so the key and the images go nowhere else (a
    redirect elsewhere stops the run, naming both); a reply's body is read up to
    ``max_reply_bytes`` (uncompressed: it asks for ``identity``); a reply's content, finish
    reason and token counts are checked (:meth:`read`); every message it raises is redacted of
    the key and anything else that looks like a credential; a server that refuses connections
    :data:`REFUSED_LIMIT` times in a row stops the run, naming the URL."""

    name = "openai"
    #: ``ask`` passes each question's answer id to :meth:`arguments`: the request's ``seed``
    takes_answer_id = True

    def __init__(self, options: OpenAIOptions) -> None:
        try:
            import openai
        except ImportError:
            raise SetupError(
                "the openai backend needs the openai package: pip install 'counterfactory[score]'"
            ) from None
        try:  # the HTTP library of the client's transport (httpx2 from openai 3, httpx before)
            import httpx2 as http
        except ImportError:
            import httpx as http

        self.options = options
        self._openai = openai
        self._http = http
        self._raw = http.Response
        self._bounded = _bounded_stream_class(http)
        self.endpoint = options.base_url or "https://api.openai.com/v1"
        self.origin = endpoint_origin(self.endpoint)
        self._refused = 0
        key = os.environ.get(options.api_key_env)
        if key is None and options.base_url is None:
            raise SetupError(f"--backend openai without --base-url needs an API key in ${options.api_key_env}")
        self.secrets = (key,) if key else ()
        hooks = {"request": [self._check_request], "response": [self._bound_response]}
        self.http = openai.AsyncOpenAI(
            api_key=key or "not-needed",
            base_url=options.base_url,
            max_retries=0,
            timeout=options.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks=hooks),
        )

    async def _check_request(self, request: Any) -> None:
        """Every request the client sends, a redirect's too: to the endpoint's own origin only,
        and asking for an uncompressed body (so its bound is a bound on what is decoded)."""
        origin = endpoint_origin(str(request.url))
        if origin != self.origin:
            there = f"{origin[0]}://{origin[1]}:{origin[2]}"
            here = f"{self.origin[0]}://{self.origin[1]}:{self.origin[2]}"
            raise SetupError(
                f"{redact(self.endpoint)} redirected the request to {there}, another host than {here}; not followed "
                "(the key and the images go only to --base-url's host); give --base-url the address that answers"
            )
        request.headers["Accept-Encoding"] = "identity"

    async def _bound_response(self, response: Any) -> None:
        """Reads a reply's body through a counter that stops at ``max_reply_bytes``."""
        self._refused = 0  # something answers there
        limit = self.options.max_reply_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await response.aclose()
            raise ReplyError(f"the reply's body is {int(declared):,} bytes, over max_reply_bytes={limit:,}")
        response.stream = self._bounded(response.stream, limit)

    def lineage(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.options.model,
            "revision": self.options.revision,
            # a base URL with credentials is refused (OpenAIOptions): this is the endpoint's identity
            "endpoint": self.endpoint,
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
            secrets=self.secrets,
        )

    def arguments(
        self,
        prompt: str,
        images: list[tuple[bytes, str]],
        decoding: dict[str, Any],
        sample: int,
        answer_id: str = "",
    ) -> dict[str, Any]:
        """One chat completion's body. Its ``seed`` hashes the answer id (which hashes the
        trial, the lineage, the decoding and the sample), as the transformers backend's does:
        a noise-repeat row asks the same prompt of the same image under another trial id, and
        must not be the same request on a server that honours ``seed``."""
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": data_url(data, suffix)}} for data, suffix in images
        ]
        content.append({"type": "text", "text": prompt})
        kwargs: dict[str, Any] = {"model": self.options.model, "messages": [{"role": "user", "content": content}]}
        for name in ("temperature", "max_tokens", "top_p"):
            if name in decoding:
                kwargs[name] = decoding[name]
        kwargs["seed"] = request_seed(answer_id, sample)
        return kwargs

    async def send(self, body: dict[str, Any]) -> dict[str, Any]:
        """POSTs one chat completion; its JSON (a reply over ``max_reply_bytes``:
        ``{"counterfactory_reply_error": why}``, which :meth:`read` records as an error).

        Raises:
            SetupError: the endpoint rejected the key (401/403), redirected elsewhere, or
                refused :data:`REFUSED_LIMIT` connections in a row.
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
        except ReplyError as exc:
            return {"counterfactory_reply_error": str(exc)}
        except (o.AuthenticationError, o.PermissionDeniedError) as exc:
            raise SetupError(
                redact(
                    f"{self.endpoint} rejected the key in ${self.options.api_key_env} ({type(exc).__name__}: {exc}); "
                    f"set ${self.options.api_key_env} to a key it accepts, or --api-key-env to the variable that "
                    "holds one",
                    self.secrets,
                )
            ) from None
        except o.APIConnectionError as exc:
            if isinstance(exc.__cause__, self._http.ConnectError):
                self._refused += 1
                if self._refused >= REFUSED_LIMIT:
                    raise SetupError(
                        redact(
                            f"cannot connect to {self.endpoint} ({exc.__cause__ or 'connection refused'}; "
                            f"{self._refused} tries in a row): is the server running? Start it, or give --base-url "
                            "the address it listens on",
                            self.secrets,
                        )
                    ) from None
            raise
        try:
            resp = raw.json()
            resp["choices"][0]["message"]  # noqa: B018 - the shape of a chat completion
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TransportError(redact(f"not a chat completion: {raw.text[:200]!r}", self.secrets)) from exc
        return resp

    def read(self, result: dict[str, Any]) -> dict[str, Any]:
        """One chat completion as an answer.

        Raises:
            ReplyError: a body over the bound, a content that is neither text nor a list of text
                parts, a finish reason that is not a short string, token counts that are not
                counts (:func:`token_count`), or a count missing where its price is set.
        """
        if "counterfactory_reply_error" in result:
            raise ReplyError(str(result["counterfactory_reply_error"]))
        choices = result.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ReplyError("choices is not a list of choices")
        choice = choices[0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise ReplyError(f"choices[0].message is a {type(message).__name__}, not a message")
        reply = reply_text(message.get("content"))
        if reply is None and message.get("refusal"):
            # the API's own refusal field: a refusal is an answer
            reply = reply_text(message["refusal"], "choices[0].message.refusal")
        if reply is not None and len(reply.encode("utf-8", "surrogatepass")) > self.options.max_reply_bytes:
            raise ReplyError(f"the reply's text is over max_reply_bytes={self.options.max_reply_bytes:,}")
        finish = choice.get("finish_reason")
        if finish is not None and not (isinstance(finish, str) and len(finish) <= 64):
            raise ReplyError("choices[0].finish_reason is not a short string")
        usage = result.get("usage") or {}
        if not isinstance(usage, dict):
            raise ReplyError(f"usage is a {type(usage).__name__}, not a mapping")
        tokens_in = token_count(usage.get("prompt_tokens"), "usage.prompt_tokens")
        tokens_out = token_count(usage.get("completion_tokens"), "usage.completion_tokens")
        o = self.options
        for count, price, name in (
            (tokens_in, o.usd_per_mtok_in, "prompt"),
            (tokens_out, o.usd_per_mtok_out, "completion"),
        ):
            if count is None and price > 0:
                raise ReplyError(f"usage.{name}_tokens is missing, and its price is set: the answer's cost is unknown")
        return {
            "reply": reply,
            "finish_reason": finish,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": self.cost(tokens_in, tokens_out),
        }

    async def aclose(self) -> None:
        await self.http.close()


def request_seed(answer_id: str, sample: int) -> int:
    """A request's ``seed``: 31 bits of the sha256 of the answer id and sample (every server's
    seed type holds it)."""
    digest = hashlib.sha256(f"{answer_id}\0{int(sample)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def _bounded_stream_class(http: Any) -> type:
    """The response body class (of the client's HTTP library) read up to a bound."""

    class BoundedStream(http.AsyncByteStream):
        """A response body read up to ``limit`` bytes (past it, :class:`ReplyError`)."""

        def __init__(self, inner: Any, limit: int) -> None:
            self.inner, self.limit = inner, limit

        async def __aiter__(self) -> Any:
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > self.limit:
                    raise ReplyError(f"the reply's body is over max_reply_bytes={self.limit:,}")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    return BoundedStream


ANSWER_BACKENDS.register("openai", OpenAIOptions, OpenAIChat)
