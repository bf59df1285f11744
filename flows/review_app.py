"""The review web site (``counterfactory review serve OUT_DIR``): FastAPI, Jinja, a little plain JS.

Pages: ``/queue`` (one candidate at a time, fitted to the screen, with a decision bar, filters
and a counter; the next item comes from ``/api/item`` without a page reload), ``/blind``
(blinded spot-the-edit), ``/stats`` (progress, per-reviewer agreement and time per item;
``/api/stats`` is the same as JSON). Images are served only by sha256 from the run's image
store (``/img/<sha256>``; the blinded page uses opaque trial ids): no request path reaches the
filesystem. Derived views (the normalised source, the mask overlay, the difference heat map) are
written into the same store under their own sha256, so they are as immutable as everything else.

A decision answers one view of an item: the page carries a ticket the server signed (reviewer,
item, the votes the item had, time), never a client-chosen count, and a stale ticket is refused
with 409 (:func:`~counterfactory.manifests.review.record_decision`; the database refuses it too).

Security: every request carries a reviewer token (the ``cf_review`` cookie set by ``/login``, or
``Authorization: Bearer``); the ledger keeps only its sha256, and a revoked token signs nobody in.
Requests that change state need a CSRF token tied to the reviewer and are refused when the
browser says they come from another site (``Origin`` / ``Sec-Fetch-Site``); the cookie is
``SameSite=Strict`` as well. Pages may not be framed (``frame-ancestors 'none'``) and request
bodies are limited to :data:`MAX_BODY_BYTES`.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import math
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactory.manifests.errors import SetupError

try:
    from fastapi import APIRouter, FastAPI, Form, Request
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
    from fastapi.templating import Jinja2Templates
except ImportError as exc:  # the review extra is optional
    raise SetupError(f"the review site needs the review extra ({exc}); pip install 'counterfactory[review]'") from exc
# Prefect brings FastAPI, uvicorn and Jinja2 with the base install, but not python-multipart,
# which FastAPI needs for the site's forms (it raises a bare RuntimeError when a route is made)
if importlib.util.find_spec("python_multipart") is None and importlib.util.find_spec("multipart") is None:
    raise SetupError(
        "the review site needs the review extra (python-multipart, for its sign-in and decision forms, is not "
        "installed); pip install 'counterfactory[review]'"
    )

from counterfactory.flows.engine.run_folder import RunFolder
from counterfactory.flows.engine.sources import prepare_source
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.masks import dilate
from counterfactory.generation.sources import Source, SourceRecord, load_image
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import (
    REASONS,
    QueueItem,
    Reviewer,
    ReviewError,
    SpotDeal,
    deal_spot_trial,
    hash_token,
    last_spot_attempt,
    open_spot_deal,
    parse_cell_id,
    queue_item,
    record_decision,
    record_spot_trial,
    review_queue,
    reviewer_for_token,
    spot_deal,
    spot_pool,
    undo_decision,
)
from counterfactory.manifests.store import DamagedBlobError, ImageStore, MissingBlobError, UnsafeBlobError
from counterfactory.manifests.vocabulary import ACCEPTED, NEEDS_REVIEW, OK, REJECTED
from counterfactory.validation.review_stats import review_summary

HERE = Path(__file__).resolve().parent
COOKIE = "cf_review"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: |candidate - source| at which the heat map saturates (8-bit levels)
HEAT_FULL_SCALE = 64
#: a view's ticket is good for this long (then the page asks for a fresh view)
TICKET_TTL_S = 12 * 3600
#: the largest request body accepted (a decision with a 2,000-character note is ~3 KB)
MAX_BODY_BYTES = 64 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # not no-referrer: under it browsers send "Origin: null" with form posts, which the
    # cross-site check must refuse
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True)
class TemplateView:
    """A template's derived images in the store and the boxes the page needs."""

    source_sha256: str
    overlay_sha256: str
    #: ``(H, W)`` uint8 {0, 255}: the edit mask grown by ``review.spot_dilate_px``
    spot_region: np.ndarray
    #: ``[x0, y0, x1, y1]`` in source pixels: the face zoom
    zoom_box: list[int]
    width: int
    height: int


@dataclass(frozen=True)
class PendingTrial:
    reviewer_id: int
    attempt_id: str
    shown: str
    sha256: str
    template_id: str
    deal: SpotDeal


@dataclass(frozen=True)
class Ticket:
    """The view a decision answers: who saw which item with how many votes on it, and when."""

    reviewer_id: int
    attempt_id: str
    seen: int
    issued: int


def source_record(meta: dict[str, Any]) -> SourceRecord:
    """The source's metadata record from a ledger ``sources.meta``, reading only the record's
    own fields: whatever else a run keeps there (its source check, normalisation notes, keys a
    later version adds) is never validated here."""
    return SourceRecord.model_validate({k: meta[k] for k in SourceRecord.model_fields if k in meta})


def source_edit_mask(spec: Spec, store: ImageStore, row: Any, pixels: np.ndarray, source: Source) -> np.ndarray:
    """The edit region's mask the run drew on the source (``(h, w)`` uint8): the one its source check kept in the store, else computed
    again as the run computes it (a folder made without a store, a limb design)."""
    check = (row.meta or {}).get("check")
    sha = check.get("region_sha256") if isinstance(check, dict) else None
    if isinstance(sha, str) and SHA256.fullmatch(sha) and store.has(sha):
        region = store.get(sha)
        if region.shape == pixels.shape[:2]:
            return region
    try:
        return prepare_source(spec, source).region
    except ValueError as exc:
        raise ReviewError(f"source {row.source_id!r} cannot be shown: {exc}", status=409) from None


class ReviewSite:
    """State shared by the requests of one ``review serve``: ledger, store, spec, caches."""

    def __init__(self, out: Path, spec: Spec, ledger: Ledger) -> None:
        self.out, self.spec, self.ledger = Path(out), spec, ledger
        self.options = spec.review
        #: each editor's attempt budget: which candidate is a cell's final attempt
        self.max_attempts = {view.editor_name: view.editor.max_attempts for view in spec.editor_views()}
        self.store = ImageStore(RunFolder(out).store_dir(spec))
        self.secret = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._views: dict[str, TemplateView] = {}
        self._heat: dict[str, str] = {}
        # the next item's derived images are made while the reviewer looks at this one
        self._warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="review-warm")

    # derived images ---------------------------------------------------------------------
    def template_view(self, template_id: str) -> TemplateView:
        with self._lock:
            if template_id in self._views:
                return self._views[template_id]
        row = next((r for r in self.ledger.sources() if r.source_id == template_id and r.status == OK), None)
        if row is None:
            raise ReviewError(f"source {template_id!r} is not an ok source in the ledger", status=404)
        loaded = load_image(row.path, max_pixels=self.spec.sources.max_pixels)
        if row.sha256 and loaded.sha256 != row.sha256:
            raise ReviewError(
                f"{row.path}: the photo changed since the run (sha256 {loaded.sha256[:12]} != {row.sha256[:12]}); "
                "restore it to review its candidates",
                status=409,
            )
        source = Source(source_record(row.meta or {}), Path(row.path), loaded.sha256, loaded.pixels, loaded.notes)
        region = source_edit_mask(self.spec, self.store, row, loaded.pixels, source)
        overlay = np.zeros((*region.shape, 4), np.uint8)
        overlay[region > 0] = (255, 0, 200, 80)
        ys, xs = np.nonzero(region)
        h, w = region.shape
        if len(xs):
            x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
            pad_x, pad_y = (x1 - x0) * 0.25, (y1 - y0) * 0.25
            box = [
                int(max(0, x0 - pad_x)),
                int(max(0, y0 - pad_y)),
                int(min(w, x1 + pad_x)),
                int(min(h, y1 + pad_y)),
            ]
        else:
            box = [0, 0, w, h]
        view = TemplateView(
            source_sha256=self.store.put(np.ascontiguousarray(loaded.pixels)),
            overlay_sha256=self.store.put(overlay),
            spot_region=dilate(region, self.options.spot_dilate_px),
            zoom_box=box,
            width=w,
            height=h,
        )
        with self._lock:
            self._views[template_id] = view
        return view

    def heat_map(self, item: QueueItem, view: TemplateView) -> str:
        """sha256 of an RGB heat map of ``max_c |candidate - source|`` (inferno, full scale 64 levels)."""
        with self._lock:
            if item.attempt_id in self._heat:
                return self._heat[item.attempt_id]
        source = self.store.get(view.source_sha256).astype(np.int16)
        candidate = self.store.get(item.image_sha256).astype(np.int16)
        if candidate.shape != source.shape:
            raise ReviewError(f"candidate {item.attempt_id[:12]} is not in its source's frame", status=409)
        diff = np.abs(candidate - source).max(axis=2)
        scaled = np.clip(diff * (255.0 / HEAT_FULL_SCALE), 0, 255).astype(np.uint8)
        heat = cv2.cvtColor(cv2.applyColorMap(scaled, cv2.COLORMAP_INFERNO), cv2.COLOR_BGR2RGB)
        sha = self.store.put(heat)
        with self._lock:
            self._heat[item.attempt_id] = sha
        return sha

    def warm(self, item: QueueItem | None) -> None:
        """Make ``item``'s source view and heat map in the background (errors surface when shown)."""
        if item is None:
            return

        def work() -> None:
            try:
                self.heat_map(item, self.template_view(item.template_id))
            except Exception:  # noqa: BLE001 - the same error is raised, and reported, when the item is shown
                pass

        self._warmer.submit(work)

    def close(self) -> None:
        self._warmer.shutdown(wait=False, cancel_futures=True)

    # auth ---------------------------------------------------------------------------------
    def csrf_for(self, token: str) -> str:
        return hmac.new(self.secret, hash_token(token).encode(), hashlib.sha256).hexdigest()

    def _sign(self, body: str) -> str:
        return hmac.new(self.secret, f"ticket|{body}".encode(), hashlib.sha256).hexdigest()

    def ticket_for(self, reviewer: Reviewer, item: QueueItem) -> str:
        """A signed ticket for the view of ``item`` being served to ``reviewer`` now."""
        body = f"{reviewer.reviewer_id}.{item.attempt_id}.{item.resolution.events}.{int(time.time())}"
        return f"{body}.{self._sign(body)}"

    def read_ticket(self, ticket: str, reviewer: Reviewer, attempt_id: str) -> Ticket:
        """The view a posted ticket stands for.

        Raises:
            ReviewError: 403 for a ticket this site did not sign for this reviewer and item,
                409 for one older than :data:`TICKET_TTL_S` (reload for a fresh view).
        """
        parts = ticket.split(".")
        if len(parts) != 5 or not all(parts):
            raise ReviewError("missing or malformed view ticket; reload the page", status=403)
        body, signature = ".".join(parts[:4]), parts[4]
        if not hmac.compare_digest(signature, self._sign(body)):
            raise ReviewError("this view ticket was not issued by this site; reload the page", status=403)
        rid, aid, seen, issued = parts[:4]
        if int(rid) != reviewer.reviewer_id or aid != attempt_id:
            raise ReviewError("this view ticket belongs to another reviewer or item; reload the page", status=403)
        if time.time() - int(issued) > TICKET_TTL_S:
            raise ReviewError("this view is more than 12 hours old; it is shown again as it is now", status=409)
        return Ticket(int(rid), aid, int(seen), int(issued))

    # blinded trials ---------------------------------------------------------------------
    def new_trial(self, reviewer: Reviewer) -> tuple[str, PendingTrial] | None:
        """The reviewer's blinded trial: the one dealt and not answered yet (a reload shows it
        again), else a new one, recorded as dealt before it is shown; None when none is left."""
        deal = open_spot_deal(self.ledger, reviewer.reviewer_id)
        if deal is None:
            pool = spot_pool(self.ledger, reviewer.reviewer_id, max_attempts=self.max_attempts)
            if not pool:
                return None
            last = last_spot_attempt(self.ledger, reviewer.reviewer_id)
            last_template = None
            if last is not None:
                candidate = self.ledger.candidate(last)
                last_template = parse_cell_id(candidate.cell_id)[0] if candidate else None
            # never the same photo twice in a row while another template is left
            fresh = [p for p in pool if parse_cell_id(p[1])[0] != last_template]
            attempt_id = (fresh or pool)[secrets.randbelow(len(fresh or pool))][0]
            shown = "candidate" if secrets.randbelow(2) else "source"
            deal = deal_spot_trial(self.ledger, reviewer, attempt_id, shown)
        trial = self._pending(deal)
        # the page's trial key: the deal, signed for this reviewer
        return f"{deal.deal_id}-{self._sign(f'trial:{reviewer.reviewer_id}:{deal.deal_id}')}", trial

    def _pending(self, deal: SpotDeal) -> PendingTrial:
        candidate = self.ledger.candidate(deal.attempt_id)
        if candidate is None or not candidate.image_sha256:
            raise ReviewError("this trial's candidate is gone from the ledger; reload the page", status=404)
        template_id = parse_cell_id(candidate.cell_id)[0]
        view = self.template_view(template_id)
        sha = candidate.image_sha256 if deal.shown == "candidate" else view.source_sha256
        return PendingTrial(deal.reviewer_id, deal.attempt_id, deal.shown, sha, template_id, deal)

    def _deal_for(self, key: str, reviewer: Reviewer) -> SpotDeal | None:
        deal_id, _, signature = key.partition("-")
        if not deal_id.isdigit() or not hmac.compare_digest(
            signature, self._sign(f"trial:{reviewer.reviewer_id}:{deal_id}")
        ):
            return None
        deal = spot_deal(self.ledger, int(deal_id))
        return deal if deal is not None and deal.reviewer_id == reviewer.reviewer_id else None

    def take_trial(self, key: str, reviewer: Reviewer) -> PendingTrial:
        deal = self._deal_for(key, reviewer)
        if deal is None:
            raise ReviewError("unknown trial; reload the page for your trial", status=404)
        if deal.answered:
            raise ReviewError("this trial was answered already; reload the page for the next one", status=404)
        return self._pending(deal)

    def peek_trial(self, key: str, reviewer: Reviewer) -> PendingTrial | None:
        deal = self._deal_for(key, reviewer)
        return None if deal is None or deal.answered else self._pending(deal)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _filters(request: Request) -> dict[str, str]:
    return {k: request.query_params.get(k, "") for k in ("template", "condition", "reason", "verdict", "state")}


def _condition_label(condition: dict[str, str]) -> str:
    return " · ".join(f"{v}" for v in condition.values())


def _matches(item: QueueItem, f: dict[str, str]) -> bool:
    # the audit sample is blind to the gates: filtering it by their verdict or reasons would
    # tell which items they accepted, so those filters list queued items only
    if item.mode == "audit" and (f["verdict"] or f["reason"]):
        return False
    if f["template"] and item.template_id != f["template"]:
        return False
    if f["condition"] and _condition_label(item.condition) != f["condition"]:
        return False
    if f["reason"] and not any(r.split(":")[0] == f["reason"] for r in item.reasons):
        return False
    if f["verdict"] and item.verdict != f["verdict"]:
        return False
    return not (f["state"] and item.resolution.state != f["state"])


def _thresholds_for(metric: str, thresholds: dict[str, Any]) -> dict[str, Any]:
    return {name: t for name, t in thresholds.items() if metric in name or name.endswith(metric)}


def _crossed(name: str, bound: Any, value: Any) -> bool:
    """Whether ``value`` is on the wrong side of the threshold ``name`` (``max_*`` / ``min_*``)."""
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not isinstance(value, int | float):
        return False
    return (name.startswith("max_") and value > bound) or (name.startswith("min_") and value < bound)


def flagged_metrics(gates: dict[str, Any]) -> list[dict[str, Any]]:
    """What a reviewer should read first: each gate that failed or asked for review, with its
    reasons and the metrics that have a threshold, next to that threshold.

    A measure judged above the editor's noise floor is shown as judged (``X_above_floor`` against
    ``X``'s threshold; its raw ``X``, which was not judged, is left to the full gate record), and
    the metrics that crossed their threshold, the ones that decided, come first (``decides``): the
    line is cut to a few rows on a small screen, and the deciding metric must not be the part cut.
    """
    out = []
    for name, gate in gates.items():
        if not isinstance(gate, dict):
            continue
        reasons = list(gate.get("reasons", [])) + list(gate.get("review", []))
        if gate.get("passed", True) and not reasons:
            continue
        thresholds = {k: v for k, v in (gate.get("thresholds", {}) or {}).items() if v is not None}
        values = gate.get("metrics", {}) or {}
        metrics = []
        for m, v in values.items():
            judged_as = m.removesuffix("_above_floor")
            if m == judged_as and f"{m}_above_floor" in values:
                continue  # judged above the floor: that value is the one shown
            bounds = _thresholds_for(judged_as, thresholds)
            if bounds:
                decides = any(_crossed(t, b, v) for t, b in bounds.items())
                metrics.append({"metric": m, "value": v, "thresholds": bounds, "decides": decides})
        metrics.sort(key=lambda entry: not entry["decides"])
        out.append({"gate": name, "passed": bool(gate.get("passed")), "reasons": reasons, "metrics": metrics})
    # the gates that rejected or held the item before those that only measured
    out.sort(key=lambda g: not any(m["decides"] for m in g["metrics"]))
    return out


@dataclass
class QueueState:
    """What one reviewer sees of the queue through one set of filters."""

    items: list[QueueItem]
    mine: list[QueueItem]

    @property
    def counts(self) -> dict[str, int]:
        return {
            "left": len(self.mine),
            "total": len(self.items),
            "resolved": sum(i.resolution.state == "resolved" for i in self.items),
        }


def queue_state(site: ReviewSite, reviewer: Reviewer, f: dict[str, str]) -> QueueState:
    items = review_queue(site.ledger, site.options, max_attempts=site.max_attempts)
    mine = [
        i
        for i in items
        if _matches(i, f) and i.resolution.state != "resolved" and not i.decided_by(reviewer.reviewer_id)
    ]
    # items this reviewer skipped come last, so a skip moves on
    mine.sort(key=lambda i: i.skipped_by(reviewer.reviewer_id))
    return QueueState(items, mine)


def create_app(site: ReviewSite) -> FastAPI:
    """The FastAPI application over one run folder: the guards (token, body size, security
    headers), then one router per concern (sign-in, files, stats, queue, decisions, blinded
    trials), each made by a factory that closes over ``site``."""
    app = FastAPI(title="counterfactory review", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["fmt"] = _fmt
    app.state.site = site
    _guards(app, site, templates)
    routers = (
        _auth_routes(site, templates),
        _file_routes(site),
        _stats_routes(site, templates),
        _queue_routes(site, templates),
        _decision_routes(site),
        _blind_routes(site, templates),
    )
    for router in routers:
        app.include_router(router)
    return app


def _problem(templates: Jinja2Templates, request: Request, status: int, message: str) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return templates.TemplateResponse(
            request, "login.html", {"message": message, "status": status}, status_code=status
        )
    return JSONResponse({"error": message}, status_code=status)


def _cross_site(request: Request) -> str | None:
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is not None and origin != own:
        return f"cross-site request from {origin} refused"
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    return None


def _check_post(site: ReviewSite, request: Request, csrf: str) -> Response | None:
    why = _cross_site(request)
    if why is None and not hmac.compare_digest(csrf or "", site.csrf_for(request.state.token)):
        why = "missing or wrong CSRF token; reload the page"
    return JSONResponse({"error": why}, status_code=403) if why else None


def _guards(app: FastAPI, site: ReviewSite, templates: Jinja2Templates) -> None:
    """Security headers and the body-size limit on every response, a reviewer token on every
    route but ``/login``."""

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        if request.url.path == "/login":
            return await call_next(request)
        token = request.cookies.get(COOKIE)
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        reviewer = reviewer_for_token(site.ledger, token) if token else None
        if reviewer is None:
            message = (
                "a reviewer token is required: sign in at /login with the token `counterfactory review "
                "add-reviewer NAME` printed"
                if not token
                else "this token is not a reviewer's token (typo, revoked, or the reviewer was added to another ledger)"
            )
            return _problem(templates, request, 401, message)
        request.state.reviewer = reviewer
        request.state.token = token
        return await call_next(request)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                response: Response = JSONResponse({"error": "a request body needs a Content-Length"}, status_code=411)
            elif int(length) > MAX_BODY_BYTES:
                response = JSONResponse(
                    {"error": f"request body of {length} bytes refused (at most {MAX_BODY_BYTES})"}, status_code=413
                )
            else:
                response = await call_next(request)
        else:
            response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response


def _auth_routes(site: ReviewSite, templates: Jinja2Templates) -> APIRouter:
    """Signing in with a reviewer token, signing out, and ``/`` (to the queue)."""
    router = APIRouter()

    @router.get("/login", response_class=HTMLResponse)
    def login_page(request: Request):
        return templates.TemplateResponse(request, "login.html", {"message": None, "status": 200})

    @router.post("/login")
    def login(request: Request, token: str = Form(..., max_length=200)):
        why = _cross_site(request)
        if why:
            return _problem(templates, request, 403, why)
        if reviewer_for_token(site.ledger, token) is None:
            return _problem(templates, request, 401, "this token is not a reviewer's token")
        response = RedirectResponse("/queue", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", max_age=12 * 3600)
        return response

    @router.post("/logout")
    def logout(request: Request, csrf: str = Form("", max_length=128)):
        refused = _check_post(site, request, csrf)
        if refused:
            return refused
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict")
        return response

    @router.get("/")
    def root():
        return RedirectResponse("/queue", status_code=303)

    return router


def store_image(site: ReviewSite, sha256: str, cache_control: str) -> Response:
    """The store's image ``sha256`` as a response, re-read and re-hashed on every request: only
    bytes that are the image its name says are served (never a symlink's target, never a file
    edited in the store); otherwise a 404 or 409 that says why."""
    try:
        data = site.store.read_bytes(sha256)
    except MissingBlobError:
        return JSONResponse({"error": f"no image {sha256[:12]}… in this run's store"}, status_code=404)
    except UnsafeBlobError:
        return JSONResponse(
            {
                "error": f"image {sha256[:12]}… is not served: its store entry is not a regular file inside the store (a symlink?)"
            },
            status_code=404,
        )
    except DamagedBlobError:
        return JSONResponse(
            {
                "error": f"image {sha256[:12]}… is not served: its bytes in the store do not hash to its name "
                "(edited or damaged); delete the file and re-run the spec to rebuild it"
            },
            status_code=409,
        )
    return Response(data, media_type="image/png", headers={"Cache-Control": cache_control})


def _file_routes(site: ReviewSite) -> APIRouter:
    """The page's script and style, and the run's images by sha256."""
    router = APIRouter()

    @router.get("/static/{name}")
    def static(name: str):
        files = {"review.js": "text/javascript", "review.css": "text/css"}
        if name not in files:
            return JSONResponse({"error": f"no static file {name!r}"}, status_code=404)
        return FileResponse(HERE / "static" / name, media_type=files[name])

    @router.get("/img/{sha256}")
    def image(sha256: str):
        if not SHA256.fullmatch(sha256):
            return JSONResponse(
                {"error": "images are addressed by their sha256 (64 lowercase hex digits), nothing else"},
                status_code=400,
            )
        return store_image(site, sha256, "private, max-age=86400")

    return router


def _stats_routes(site: ReviewSite, templates: Jinja2Templates) -> APIRouter:
    """Review progress: the ``/stats`` page and the same summary as JSON."""
    router = APIRouter()

    @router.get("/stats", response_class=HTMLResponse)
    def stats_page(request: Request):
        summary = review_summary(site.ledger, site.options)
        return templates.TemplateResponse(
            request,
            "stats.html",
            {"reviewer": request.state.reviewer, "s": summary, "csrf": site.csrf_for(request.state.token)},
        )

    @router.get("/api/stats")
    def stats():
        return review_summary(site.ledger, site.options)

    return router


def _queue_routes(site: ReviewSite, templates: Jinja2Templates) -> APIRouter:
    """The reviewer's queue: the page with its filters, and one item at a time as a fragment."""
    router = APIRouter()

    def item_context(request: Request, state: QueueState, wanted: str | None) -> dict[str, Any]:
        reviewer: Reviewer = request.state.reviewer
        pick = next((i for i in state.mine if i.attempt_id == wanted), state.mine[0] if state.mine else None)
        context: dict[str, Any] = {
            "reviewer": reviewer,
            "csrf": site.csrf_for(request.state.token),
            "item": None,
            "next_attempt": None,
            **state.counts,
        }
        if pick is None:
            return context
        item = queue_item(site.ledger, site.options, pick.attempt_id, max_attempts=site.max_attempts) or pick
        view = site.template_view(item.template_id)
        following = next((i for i in state.mine if i.attempt_id != item.attempt_id), None)
        site.warm(following)
        context.update(
            item=item,
            view=view,
            heat=site.heat_map(item, view),
            condition=_condition_label(item.condition),
            state=item.resolution.state,
            ticket=site.ticket_for(reviewer, item),
            blind_verdict=item.mode == "audit",
            flagged=flagged_metrics(item.gates),
            next_attempt=following.attempt_id if following else None,
        )
        return context

    @router.get("/queue", response_class=HTMLResponse)
    def queue(request: Request):
        f = _filters(request)
        state = queue_state(site, request.state.reviewer, f)
        context = item_context(request, state, request.query_params.get("item"))
        context.update(
            filters=f,
            reasons=REASONS,
            options={
                "template": sorted({i.template_id for i in state.items}),
                "condition": sorted({_condition_label(i.condition) for i in state.items}),
                "reason": sorted({r.split(":")[0] for i in state.items if i.mode != "audit" for r in i.reasons}),
                "verdict": [NEEDS_REVIEW, ACCEPTED, REJECTED],
                "state": ["open", "disputed"],
            },
        )
        return templates.TemplateResponse(request, "queue.html", context)

    @router.get("/api/item")
    def next_item(request: Request):
        """The reviewer's current item as an HTML fragment with its counters (``item=`` asks for
        one item, else the first one left), and the images to fetch ahead for the one after."""
        state = queue_state(site, request.state.reviewer, _filters(request))
        try:
            context = item_context(request, state, request.query_params.get("item"))
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        html = templates.get_template("item.html").render(context)
        item = context["item"]
        images = []
        if item is not None:
            view = context["view"]
            images = [
                f"/img/{sha}" for sha in (view.source_sha256, item.image_sha256, view.overlay_sha256, context["heat"])
            ]
        return {
            "html": html,
            "attempt_id": item.attempt_id if item is not None else None,
            "next_attempt": context["next_attempt"],
            "images": images,
            **state.counts,
        }

    return router


def _decision_routes(site: ReviewSite) -> APIRouter:
    """Recording a reviewer's decision on the item they were shown, and undoing it; each post
    carries the signed view ticket of what the reviewer saw."""
    router = APIRouter()

    @router.post("/api/decisions")
    def decide(
        request: Request,
        attempt_id: str = Form(..., pattern=r"^[0-9a-f]{64}$"),
        decision: str = Form(..., max_length=8),
        ticket: str = Form(..., max_length=200),
        csrf: str = Form("", max_length=128),
        reason: str = Form("", max_length=40),
        note: str = Form("", max_length=2000),
    ):
        refused = _check_post(site, request, csrf)
        if refused:
            return refused
        reviewer: Reviewer = request.state.reviewer
        try:
            view = site.read_ticket(ticket, reviewer, attempt_id)
            res = record_decision(
                site.ledger,
                site.options,
                attempt_id=attempt_id,
                reviewer=reviewer,
                decision=decision,
                reason=reason or None,
                note=note,
                seen=view.seen,
            )
            item = queue_item(site.ledger, site.options, attempt_id, max_attempts=site.max_attempts)
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        answer: dict[str, Any] = {"state": res.state, "outcome": res.outcome, "votes": res.votes}
        if item is not None:
            # the view this decision leaves: what an undo answers
            answer["ticket"] = site.ticket_for(reviewer, item)
            answer["gate_verdict"] = item.verdict
        return answer

    @router.post("/api/undo")
    def undo(
        request: Request,
        attempt_id: str = Form(..., pattern=r"^[0-9a-f]{64}$"),
        ticket: str = Form(..., max_length=200),
        csrf: str = Form("", max_length=128),
    ):
        refused = _check_post(site, request, csrf)
        if refused:
            return refused
        reviewer: Reviewer = request.state.reviewer
        try:
            view = site.read_ticket(ticket, reviewer, attempt_id)
            res = undo_decision(site.ledger, site.options, attempt_id=attempt_id, reviewer=reviewer, seen=view.seen)
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return {"state": res.state, "outcome": res.outcome, "votes": res.votes}

    return router


def _blind_routes(site: ReviewSite, templates: Jinja2Templates) -> APIRouter:
    """The blinded spot-the-edit trials: the page, its image, and the answer."""
    router = APIRouter()

    @router.get("/blind", response_class=HTMLResponse)
    def blind(request: Request):
        reviewer: Reviewer = request.state.reviewer
        trial = site.new_trial(reviewer)
        context = {
            "reviewer": reviewer,
            "csrf": site.csrf_for(request.state.token),
            "trial": trial[0] if trial else None,
        }
        if trial:
            view = site.template_view(trial[1].template_id)
            context.update(width=view.width, height=view.height)
        return templates.TemplateResponse(request, "blind.html", context)

    @router.get("/blind/image/{trial}")
    def blind_image(request: Request, trial: str):
        pending = site.peek_trial(trial, request.state.reviewer)
        if pending is None:
            return JSONResponse({"error": "unknown or expired trial"}, status_code=404)
        return store_image(site, pending.sha256, "no-store")

    @router.post("/api/spot")
    def spot(
        request: Request,
        trial: str = Form(..., max_length=128),
        answer: str = Form(..., pattern=r"^(edited|unedited)$"),
        csrf: str = Form("", max_length=128),
        x: float | None = Form(None),
        y: float | None = Form(None),
    ):
        refused = _check_post(site, request, csrf)
        if refused:
            return refused
        if any(v is not None and not math.isfinite(v) for v in (x, y)):
            return JSONResponse({"error": "x and y are pixel coordinates: finite numbers"}, status_code=400)
        reviewer: Reviewer = request.state.reviewer
        try:
            pending = site.take_trial(trial, reviewer)
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        said_edited = answer == "edited"
        click = (x, y) if said_edited and x is not None and y is not None else None
        localised = None
        if pending.shown == "candidate" and said_edited:
            region = site.template_view(pending.template_id).spot_region
            h, w = region.shape
            localised = bool(
                click is not None and 0 <= click[0] < w and 0 <= click[1] < h and region[int(click[1]), int(click[0])]
            )
        try:
            record_spot_trial(
                site.ledger, deal=pending.deal, reviewer=reviewer, said_edited=said_edited, click=click,
                localised=localised,
            )  # fmt: skip
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        # what was shown stays unsaid: the answer must not teach the next trial
        return {"recorded": True}

    return router


def serve(out: Path, spec: Spec, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the site with uvicorn until interrupted."""
    import uvicorn

    ledger = Ledger(RunFolder(out).ledger_url(spec))
    site = ReviewSite(out, spec, ledger)
    try:
        uvicorn.run(create_app(site), host=host, port=port, log_level="warning")
    finally:
        site.close()
        ledger.close()
