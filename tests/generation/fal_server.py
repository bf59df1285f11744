"""A local stand-in for fal's queue API over HTTPS, for tests and benchmarks.

It speaks the part of the protocol ``fal-client`` uses, on 127.0.0.1 only, with a
certificate from a throw-away CA (``trustme``):

- ``POST /<owner>/<app>[/<path>]`` with the model input -> ``{request_id, status_url,
  response_url, cancel_url, queue_position}``; 401 for an unknown key, 404 for an unknown app.
- ``GET /<owner>/<app>/requests/<id>/status`` -> ``IN_QUEUE`` / ``IN_PROGRESS`` /
  ``COMPLETED`` (with ``error`` and ``error_type`` when the job failed); 404 for an unknown id.
- ``GET /<owner>/<app>/requests/<id>`` -> the result JSON, or the job's error answer
  (422 with a ``detail`` list, or 500), or 400 while the job still runs.
- ``PUT /<owner>/<app>/requests/<id>/cancel`` -> 202 ``{"status": "CANCELLATION_REQUESTED"}``
  for a request not yet completed, 400 ``{"status": "ALREADY_COMPLETED"}`` for a finished one,
  as fal answers. A request still in the queue (``IN_QUEUE``) then never runs and is not
  billed: its status turns ``COMPLETED`` with ``error_type`` ``request_cancelled`` and its
  result answers 400. One already running (``IN_PROGRESS``) finishes anyway and is billed,
  so a test can check that a cancelled request that still completed is fetched, not re-bought.
- The vision router (``vision_apps``: ``openrouter/router``, endpoint
  ``openrouter/router/vision``) answers as fal documents it: ``{"output": <text>, "usage":
  {"prompt_tokens", "completion_tokens", "total_tokens", "cost"}}``, the text scripted for the
  input image's pixels with :meth:`FalServer.answer`, else ``default_answer``; ``usage.cost``
  is ``price_usd`` unless :meth:`FalServer.answer` sets one. ``image_urls``, ``prompt`` and
  ``model`` are required (422 otherwise), as on fal; images come as PNG, JPEG or WebP data URIs
  (the first one is the "input image" a scripted answer is keyed by).
- ``GET /files/<name>`` serves output images; ``/_fake/stats`` and ``/_fake/reset`` let a
  process that runs the server elsewhere (the benchmark) read and reset its counters.

Two counts of requests at once. ``max_in_flight`` counts the ones accepted and not yet collected
(or cancelled in the queue). :meth:`FalServer.max_unfinished` counts what holds one of the
account's slots at fal: accepted and not yet ended, an end being the job's completion or its
cancellation while queued (a job cancelled while running ends when it finishes, as on fal),
whether or not anybody asked for its status or result. :meth:`FalServer.status_outage` answers
every status poll with 503 for a while (submits, results and cancels still answer).

The "model" returns ``255 - input`` as a PNG, so a test knows the right answer without
asking the server. Per prompt, a :class:`Behaviour` injects HTTP errors on submit and status
calls (a code of 0 means "never answer"), refusals, failed jobs and jobs that never finish.
Every submission is counted by the sha256 of its body bytes; ``paid_submits`` counts only the
ones that were accepted (answered with a request id), so a test can assert that no paid
request was ever submitted twice.

``fal-client`` reads its hosts from the environment when first imported; use
:meth:`FalServer.patch_environment` in-process, or pass :meth:`FalServer.env` to a subprocess.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

Outcome = Literal["ok", "nsfw", "no_images", "refusal_text", "policy", "invalid", "error", "stall"]


@dataclass(frozen=True)
class Behaviour:
    """What the fake model does with requests whose prompt matches.

    Attributes:
        outcome: ``ok`` (``255 - input``); ``nsfw`` (a black image flagged in
            ``has_nsfw_concepts``); ``no_images`` (an empty list); ``refusal_text`` (the input
            back with a refusal in ``description``); ``policy`` (422 content_policy_violation);
            ``invalid`` (422 validation error); ``error`` (500, the job failed); ``stall``
            (never completes).
        submit_errors: HTTP codes answered to the first submissions of a payload, in order;
            0 holds the connection open without answering.
        status_errors: HTTP codes answered to the first status polls of each job, in order.
        latency_s: seconds from acceptance to completion; ``None`` uses the server's.
        queued_s: seconds of that spent ``IN_QUEUE`` (cancellable without cost); ``None``
            is half the latency.
    """

    outcome: Outcome = "ok"
    submit_errors: tuple[int, ...] = ()
    status_errors: tuple[int, ...] = ()
    latency_s: float | None = None
    queued_s: float | None = None


@dataclass
class Job:
    """One accepted request as the server keeps it; ``arguments`` is its body less the images."""

    request_id: str
    app: str
    payload_hash: str
    prompt: str
    behaviour: Behaviour
    accepted_at: float
    latency_s: float
    input_image: np.ndarray
    input_key: str  # :func:`_pixels_key` of ``input_image``
    arguments: dict[str, Any]
    status_errors: list[int] = field(default_factory=list)
    collected: bool = False
    cancelled: bool = False  # cancelled while queued: it never ran
    submitted_at: float = 0.0  # when it was accepted (``accepted_at`` moves on a release)
    cancelled_at: float | None = None

    def ended_at(self, held: bool) -> float | None:
        """Monotonic time it ended (cancelled while queued, or ran to its end); ``None`` while
        it has not, or never will by itself (``stall``, or held in the queue)."""
        if self.cancelled:
            return self.cancelled_at
        if held or self.behaviour.outcome == "stall":
            return None
        return self.accepted_at + self.latency_s

    def done(self, now: float) -> bool:
        if self.cancelled:
            return True
        return self.behaviour.outcome != "stall" and now >= self.accepted_at + self.latency_s

    def queued(self, now: float) -> bool:
        queued_s = self.behaviour.queued_s if self.behaviour.queued_s is not None else self.latency_s / 2
        return now < self.accepted_at + queued_s

    def billed(self, now: float, vision: bool) -> bool:
        ran = self.done(now) and not self.cancelled
        return ran and (self.behaviour.outcome in ("ok", "nsfw", "refusal_text") or vision)


class FalServer:
    """The fake fal queue, run by uvicorn in a daemon thread.

    Args:
        latency_s: default seconds from acceptance to completion.
        price_usd: USD billed per output image (``billed_usd`` sums it over finished jobs).
        keys: accepted ``Authorization: Key <key>`` values; the first is ``env()["FAL_KEY"]``.
        locked_keys: keys that authenticate but may not submit (403, as fal answers an
            account with an exhausted balance).
        apps: known ``<owner>/<app>`` ids.
        port: port to bind on 127.0.0.1; 0 picks a free one.
        model: what an ``ok`` job returns: ``invert`` (``255 - input``, the default),
            ``copy`` (the input unchanged: a face "edit" every gate sends to review, which fills
            its cell at the first seed), or
            ``resize`` (the input resized to ``resize_to``, as Nano Banana returns a fixed size
            per aspect ratio; a flow run then has a real alignment to undo).
        resize_to: ``(width, height)`` for ``model="resize"``.
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        price_usd: float = 0.039,
        keys: tuple[str, ...] = ("test-key-id:test-key-secret",),
        locked_keys: tuple[str, ...] = ("locked-key-id:locked-key-secret",),
        apps: tuple[str, ...] = ("fal-ai/nano-banana", "fal-ai/nano-banana-pro", "openrouter/router"),
        vision_apps: tuple[str, ...] = ("openrouter/router",),
        port: int = 0,
        model: Literal["invert", "resize"] = "invert",
        resize_to: tuple[int, int] = (896, 1152),
    ) -> None:
        self.model = model
        self.resize_to = resize_to
        self.latency_s = latency_s
        self.price_usd = price_usd
        self.keys = keys
        self.locked_keys = locked_keys
        self.apps = apps
        self.vision_apps = vision_apps
        self.default_answer = '{"race": "White", "gender": "male"}'
        self._answers: dict[str, tuple[str, float | None]] = {}
        self._requested_port = port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._behaviours: dict[str, Behaviour] = {}
        self._held = False
        self._outage_until = 0.0
        self._outage_s: float | None = None
        self._dir: str | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.port = 0
        self.reset()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FalServer:
        import trustme
        import uvicorn

        self._dir = tempfile.mkdtemp(prefix="fal-server-")
        ca = trustme.CA()
        self.ca_path = os.path.join(self._dir, "ca.pem")
        ca.cert_pem.write_to_path(self.ca_path)
        pem = os.path.join(self._dir, "server.pem")
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(pem)

        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only
        # then, and without it every answer waits 40 ms for a delayed ACK (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._requested_port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            ssl_certfile=pem,
            ssl_keyfile=pem,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
            backlog=4096,
        )
        self._server = uvicorn.Server(config)
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fal-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake fal server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> FalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment that points ``fal-client`` (and httpx's trust store) at this server."""
        host = f"127.0.0.1:{self.port}"
        return {
            "FAL_RUN_HOST": host,
            "FAL_QUEUE_RUN_HOST": host,
            "SSL_CERT_FILE": self.ca_path,
            "FAL_KEY": self.keys[0],
        }

    @contextlib.contextmanager
    def patch_environment(self, *, host: str | None = None) -> Iterator[None]:
        """Sets :meth:`env` in ``os.environ`` for the block, and makes this process import
        ``fal-client`` afresh on both sides of it, as it reads its hosts at import time.

        ``host`` (``"127.0.0.1:<port>"``) points fal-client somewhere else, e.g. a closed port.
        """
        env = self.env()
        if host is not None:
            env.update(FAL_RUN_HOST=host, FAL_QUEUE_RUN_HOST=host)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        _forget_fal_client()
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _forget_fal_client()

    # -- test controls ------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets jobs, counters and behaviours (not keys, apps, price or latency)."""
        with self._lock:
            self._behaviours = {}
            self._answers = {}
            self.jobs: dict[str, Job] = {}
            self.files: dict[str, bytes] = {}
            self.outputs: dict[str, np.ndarray] = {}
            self.submit_attempts: Counter[str] = Counter()
            self.paid_submits: Counter[str] = Counter()
            self.status_calls = 0
            self.result_calls = 0
            self.cancel_calls: Counter[str] = Counter()  # request id -> PUT .../cancel calls
            self.cancelled: set[str] = set()  # ids answered 202
            self.in_flight = 0
            self.max_in_flight = 0
            self.outage_answers = 0  # status polls answered 503 by :meth:`status_outage`
            self._outage_until = 0.0
            self._outage_s: float | None = None  # armed, to start at the next submission
            self._submit_errors_used: Counter[str] = Counter()

    def answer(self, pixels: np.ndarray, text: str, *, cost_usd: float | None = None) -> None:
        """A vision app asked about exactly these ``(H, W, 3)`` uint8 pixels answers ``text``,
        with ``usage.cost`` ``cost_usd`` (``price_usd`` when ``None``)."""
        with self._lock:
            self._answers[_pixels_key(pixels)] = (text, cost_usd)

    def hold(self) -> None:
        """Keeps every job ``IN_QUEUE`` until :meth:`release` (e.g. until several clients have
        submitted, so that they are known to overlap)."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Lets held jobs run: each takes its latency from now."""
        now = time.monotonic()
        with self._lock:
            self._held = False
            for job in self.jobs.values():
                if not job.cancelled and job.accepted_at < now:
                    job.accepted_at = now

    def status_outage(self, seconds: float) -> None:
        """Every status poll of every job answers 503 for ``seconds`` from the next accepted
        submission on (so that a client's set-up does not use it up); submissions, results
        and cancels answer as usual."""
        with self._lock:
            self._outage_s = seconds

    def outage_left_s(self) -> float:
        """Seconds the status outage still lasts (0 when none is on or armed)."""
        with self._lock:
            if self._outage_s is not None:
                return self._outage_s
            return max(0.0, self._outage_until - time.monotonic())

    def max_unfinished(self) -> int:
        """The most requests accepted and not yet ended at any one moment so far (see
        :meth:`Job.ended_at`): what fal counts against an account's concurrency."""
        with self._lock:
            held = self._held
            events = []
            for job in self.jobs.values():
                events.append((job.submitted_at, 1))
                end = job.ended_at(held)
                if end is not None:
                    events.append((max(end, job.submitted_at), -1))
        # at equal times an end comes before a start: a slot freed and taken at once is one
        events.sort(key=lambda e: (e[0], e[1]))
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return most

    def behave(self, prompt: str, behaviour: Behaviour) -> None:
        """Requests whose prompt equals ``prompt`` get ``behaviour``."""
        with self._lock:
            self._behaviours[prompt] = behaviour

    def billed_usd(self) -> float:
        """USD for every job that ran to an answer, collected or not (a job cancelled while
        queued never ran; vision answers cost their ``usage.cost``)."""
        now = time.monotonic()
        with self._lock:
            return sum(self._cost(j) for j in self.jobs.values() if j.billed(now, j.app in self.vision_apps))

    def billed_per_payload(self) -> Counter[str]:
        """Jobs billed per payload hash: a request bought twice shows as 2."""
        now = time.monotonic()
        with self._lock:
            return Counter(j.payload_hash for j in self.jobs.values() if j.billed(now, j.app in self.vision_apps))

    def _cost(self, job: Job) -> float:
        if job.app in self.vision_apps:
            scripted = self._answers.get(job.input_key)
            if scripted is not None and scripted[1] is not None:
                return scripted[1]
        return self.price_usd

    def stats(self) -> dict[str, Any]:
        """Counters as plain numbers (what ``GET /_fake/stats`` answers)."""
        with self._lock:
            counts = {
                "submit_attempts": sum(self.submit_attempts.values()),
                "paid_submits": sum(self.paid_submits.values()),
                "max_paid_per_payload": max(self.paid_submits.values(), default=0),
                "cancel_calls": sum(self.cancel_calls.values()),
                "cancelled": len(self.cancelled),
                "status_calls": self.status_calls,
                "result_calls": self.result_calls,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "outage_answers": self.outage_answers,
            }
        return {
            **counts,
            "max_unfinished": self.max_unfinished(),
            "billed_usd": self.billed_usd(),
            "latency_s": self.latency_s,
        }

    # -- the app ------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        def error(code: int, detail: Any, **headers: str) -> JSONResponse:
            return JSONResponse({"detail": detail}, status_code=code, headers=headers)

        def key(request: Request) -> str:
            return request.headers.get("authorization", "").removeprefix("Key ")

        def authorised(request: Request) -> bool:
            return key(request) in self.keys or key(request) in self.locked_keys

        async def hang() -> None:
            while not self._stopping.is_set():
                await asyncio.sleep(0.05)

        def urls(app_id: str, request_id: str) -> dict[str, str]:
            base = f"{self.base_url}/{app_id}/requests/{request_id}"
            return {
                "request_id": request_id,
                "response_url": base,
                "status_url": base + "/status",
                "cancel_url": base + "/cancel",
            }

        # Controls for a server in another process (the benchmark); before the submit
        # route, which would otherwise take POST /_fake/reset for an app.
        @app.get("/_fake/stats")
        async def stats() -> Response:
            return JSONResponse(self.stats())

        @app.post("/_fake/reset")
        async def reset(request: Request) -> Response:
            settings = json.loads(await request.body() or b"{}")
            self.reset()
            self.latency_s = float(settings.get("latency_s", self.latency_s))
            return JSONResponse(self.stats())

        @app.get("/files/{name}")
        async def file(name: str) -> Response:
            with self._lock:
                data = self.files.get(name)
            if data is None:
                return error(404, "File not found")
            return Response(data, media_type="image/png")

        async def submit(request: Request, owner: str, alias: str) -> Response:
            if not authorised(request):
                return error(401, "Invalid key: no user found for this key id and secret")
            if key(request) in self.locked_keys:
                return error(403, "User is locked. Reason: Exhausted balance. Top up your balance.")
            app_id = f"{owner}/{alias}"
            if app_id not in self.apps:
                return error(404, f"Application '{app_id}' not found")
            raw = await request.body()
            # Parsing and hashing a multi-megabyte body off the loop keeps the fake from
            # being the bottleneck of a throughput benchmark.
            body, digest = await asyncio.to_thread(_parse, raw)
            prompt = str(body.get("prompt", ""))
            with self._lock:
                self.submit_attempts[digest] += 1
                behaviour = self._behaviours.get(prompt, Behaviour())
                used = self._submit_errors_used[digest]
                injected = behaviour.submit_errors[used] if used < len(behaviour.submit_errors) else None
                if injected is not None:
                    self._submit_errors_used[digest] += 1
            if injected == 0:
                await hang()
                return error(503, "shutting down")
            if injected is not None:
                return error(injected, "Rate limit exceeded" if injected == 429 else "Service unavailable")
            if app_id in self.vision_apps:
                missing = [k for k in ("image_urls", "prompt", "model") if not body.get(k)]
                if missing:
                    return error(
                        422,
                        [{"loc": ["body", k], "msg": "Field required", "type": "missing"} for k in missing],
                    )
            try:
                image, image_key = await asyncio.to_thread(_decode_data_uri, body["image_urls"][0])
            except Exception as exc:
                return error(
                    422,
                    [
                        {
                            "loc": ["body", "image_urls", 0],
                            "msg": f"cannot read image: {exc}",
                            "type": "image_load_error",
                        }
                    ],
                )
            request_id = str(uuid.uuid4())
            latency = behaviour.latency_s if behaviour.latency_s is not None else self.latency_s
            job = Job(
                request_id,
                app_id,
                digest,
                prompt,
                behaviour,
                time.monotonic(),
                latency,
                image,
                image_key,
                {k: v for k, v in body.items() if k != "image_urls"},
                list(behaviour.status_errors),
            )
            job.submitted_at = job.accepted_at
            with self._lock:
                if self._outage_s is not None:
                    self._outage_until, self._outage_s = job.accepted_at + self._outage_s, None
                self.jobs[request_id] = job
                self.paid_submits[digest] += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return JSONResponse({**urls(app_id, request_id), "queue_position": 0})

        app.add_api_route("/{owner}/{alias}", submit, methods=["POST"])
        app.add_api_route("/{owner}/{alias}/{path:path}", submit, methods=["POST"])

        def find(request: Request, owner: str, alias: str, request_id: str) -> Job | JSONResponse:
            if not authorised(request):
                return error(401, "Invalid key: no user found for this key id and secret")
            app_id = f"{owner}/{alias}"
            if app_id not in self.apps:
                return error(404, f"Application '{app_id}' not found")
            with self._lock:
                job = self.jobs.get(request_id)
            if job is None or job.app != app_id:
                return error(404, "Request not found")
            return job

        @app.get("/{owner}/{alias}/requests/{request_id}/status")
        async def status(request: Request, owner: str, alias: str, request_id: str) -> Response:
            with self._lock:
                self.status_calls += 1
            job = find(request, owner, alias, request_id)
            if isinstance(job, JSONResponse):
                return job
            with self._lock:
                outage = time.monotonic() < self._outage_until
                self.outage_answers += outage
                injected = 503 if outage else job.status_errors.pop(0) if job.status_errors else None
            if injected == 0:
                await hang()
                return error(503, "shutting down")
            if injected is not None:
                return error(injected, "Service unavailable")
            now = time.monotonic()
            body: dict[str, Any] = {**urls(job.app, job.request_id), "logs": None, "metrics": {}}
            with self._lock:
                held = self._held
            if job.cancelled:
                body.update(status="COMPLETED", error="Request was cancelled", error_type="request_cancelled")
            elif held:
                body.update(status="IN_QUEUE", queue_position=0)
            elif job.done(now):
                body["status"] = "COMPLETED"
                if job.behaviour.outcome in ("policy", "invalid", "error"):
                    body["error"], body["error_type"] = {
                        "policy": (
                            "The content was flagged by a content checker.",
                            "content_policy_violation",
                        ),
                        "invalid": ("Unsupported image format", "validation_error"),
                        "error": ("Runner disconnected", "runner_disconnected"),
                    }[job.behaviour.outcome]
            elif job.queued(now):
                body.update(status="IN_QUEUE", queue_position=0)
            else:
                body["status"] = "IN_PROGRESS"
            return JSONResponse(body)

        @app.get("/{owner}/{alias}/requests/{request_id}")
        async def result(request: Request, owner: str, alias: str, request_id: str) -> Response:
            with self._lock:
                self.result_calls += 1
            job = find(request, owner, alias, request_id)
            if isinstance(job, JSONResponse):
                return job
            if job.cancelled:
                return error(400, "Request was cancelled")
            if self._held or not job.done(time.monotonic()):
                return error(400, "Request is still in progress")
            with self._lock:
                if not job.collected:
                    job.collected = True
                    self.in_flight -= 1
            return await self._answer(job, error)

        @app.put("/{owner}/{alias}/requests/{request_id}/cancel")
        async def cancel(request: Request, owner: str, alias: str, request_id: str) -> Response:
            with self._lock:
                self.cancel_calls[request_id] += 1
            job = find(request, owner, alias, request_id)
            if isinstance(job, JSONResponse):
                return job
            now = time.monotonic()
            with self._lock:
                if job.cancelled or not job.done(now):
                    if job.queued(now) and not job.cancelled:
                        job.cancelled = True  # never runs, never billed
                        job.cancelled_at = now
                        if not job.collected:
                            job.collected = True
                            self.in_flight -= 1
                    self.cancelled.add(request_id)
                    return JSONResponse({"status": "CANCELLATION_REQUESTED"}, status_code=202)
            return JSONResponse({"status": "ALREADY_COMPLETED"}, status_code=400)

        return app

    async def _answer(self, job: Job, error: Any) -> Response:
        outcome = job.behaviour.outcome
        if outcome == "policy":
            return error(
                422,
                [
                    {
                        "loc": ["body", "prompt"],
                        "msg": "The content was flagged by a content checker.",
                        "type": "content_policy_violation",
                        "input": job.prompt,
                        "categories": ["model_moderated"],
                    }
                ],
            )
        if outcome == "invalid":
            return error(
                422,
                [
                    {
                        "loc": ["body", "image_urls", 0],
                        "msg": "Unsupported image format",
                        "type": "image_load_error",
                    }
                ],
            )
        if outcome == "error":
            return error(
                500,
                "Runner disconnected",
                **{"x-fal-error-type": "runner_disconnected", "x-fal-request-id": job.request_id},
            )
        if job.app in self.vision_apps:
            with self._lock:
                text, _ = self._answers.get(job.input_key, (self.default_answer, None))
                cost = self._cost(job)
            prompt_tokens = 1290 + len(str(job.arguments.get("prompt", ""))) // 4
            completion_tokens = max(1, len(text) // 4)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "cost": cost,
            }
            return JSONResponse({"output": text, "usage": usage})
        if outcome == "no_images":
            return JSONResponse({"images": [], "description": ""})
        if outcome == "nsfw":
            return JSONResponse(
                {
                    "images": [await self._image(job, np.zeros_like(job.input_image))],
                    "has_nsfw_concepts": [True],
                    "description": "",
                }
            )
        if outcome == "refusal_text":
            return JSONResponse(
                {
                    "images": [await self._image(job, job.input_image)],
                    "description": "I'm unable to make that edit to a photo of a real person.",
                }
            )
        return JSONResponse(
            {
                "images": [await self._image(job, self._model_output(job.input_image))],
                "description": "Here is the edited image.",
            }
        )

    def _model_output(self, pixels: np.ndarray) -> np.ndarray:
        if self.model == "resize":
            import cv2

            return cv2.resize(pixels, self.resize_to, interpolation=cv2.INTER_AREA)
        if self.model == "copy":
            return pixels.copy()
        return 255 - pixels

    async def _image(self, job: Job, pixels: np.ndarray) -> dict[str, Any]:
        data = await asyncio.to_thread(_encode_png, pixels)
        name = f"{job.request_id}.png"
        with self._lock:
            self.files[name] = data
            self.outputs[job.request_id] = pixels.copy()
        return {
            "url": f"{self.base_url}/files/{name}",
            "content_type": "image/png",
            "file_name": name,
            "file_size": len(self.files[name]),
            "width": int(pixels.shape[1]),
            "height": int(pixels.shape[0]),
        }


def _pixels_key(pixels: np.ndarray) -> str:
    a = np.ascontiguousarray(pixels, dtype=np.uint8)
    return hashlib.sha256(repr(a.shape).encode() + a.tobytes()).hexdigest()


def _parse(raw: bytes) -> tuple[dict[str, Any], str]:
    """Request body -> (its JSON, sha256 hex of its bytes: the payload hash)."""
    return json.loads(raw), hashlib.sha256(raw).hexdigest()


def _encode_png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    # Fastest deflate level: still lossless, and the fake should not cost the benchmark time.
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


#: the data URIs fal takes an image in, by header, and the format their bytes must have
_DATA_URI_FORMATS = {"data:image/png;base64": "PNG", "data:image/jpeg;base64": "JPEG", "data:image/webp;base64": "WEBP"}


#: the last images the fake decoded with their pixel keys, by the sha256 of their data URI (a
#: scoring release sends each image with every question about it: decoding them again was a
#: third of the fake's time)
_DECODED: OrderedDict[str, tuple[np.ndarray, str]] = OrderedDict()
_DECODED_LOCK = threading.Lock()
_DECODED_MAX = 64


def _decode_data_uri(uri: str) -> tuple[np.ndarray, str]:
    """The image of a data URI, read-only (the same array for the same URI), and its
    :func:`_pixels_key`."""
    digest = hashlib.sha256(uri.encode()).hexdigest()
    with _DECODED_LOCK:
        found = _DECODED.get(digest)
        if found is not None:
            _DECODED.move_to_end(digest)
            return found
    pixels = _decode(uri)
    pixels.flags.writeable = False
    found = pixels, _pixels_key(pixels)
    with _DECODED_LOCK:
        _DECODED[digest] = found
        while len(_DECODED) > _DECODED_MAX:
            _DECODED.popitem(last=False)
    return found


def _decode(uri: str) -> np.ndarray:
    from PIL import Image

    header, _, data = uri.partition(",")
    expected = _DATA_URI_FORMATS.get(header)
    if expected is None:
        raise ValueError(f"expected a PNG, JPEG or WebP data URI, received {header[:40]!r}")
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        if image.format != expected:
            raise ValueError(f"expected {expected} bytes, received {image.format}")
        return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()


def _forget_fal_client() -> None:
    for name in [m for m in sys.modules if m == "fal_client" or m.startswith("fal_client.")]:
        del sys.modules[name]


def main() -> None:
    """Serves until stdin closes: ``python -m tests.generation.fal_server --latency 2``.

    Prints one JSON line first: the :meth:`FalServer.env` a client process needs.
    """
    import argparse

    parser = argparse.ArgumentParser(description="fake fal queue on 127.0.0.1 over HTTPS")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--price", type=float, default=0.039, help="USD per output image")
    args = parser.parse_args()
    with FalServer(latency_s=args.latency, price_usd=args.price) as server:
        print(json.dumps(server.env()), flush=True)
        sys.stdin.read()  # the parent closing the pipe, or dying, ends the server


if __name__ == "__main__":
    main()
