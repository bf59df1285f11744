"""The review web site (``counterfactory review serve OUT_DIR``): FastAPI, Jinja, a little plain JS.

Pages: ``/queue`` (one candidate at a time with filters and a counter), ``/blind`` (blinded
spot-the-edit), ``/stats`` (JSON). Images are served only by sha256 from the run's image store
(``/img/<sha256>``; the blinded page uses opaque trial ids): no request path reaches the
filesystem. Derived views (the normalised source, the mask overlay, the difference heat map) are
written into the same store under their own sha256, so they are as immutable as everything else.

Security: every request carries a reviewer token (the ``cf_review`` cookie set by ``/login``, or
``Authorization: Bearer``); the ledger keeps only its sha256. Requests that change state need a
CSRF token tied to the reviewer and are refused when the browser says they come from another
site (``Origin`` / ``Sec-Fetch-Site``); the cookie is ``SameSite=Strict`` as well.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fastapi import FastAPI, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from counterfactory.flows.steps import prepare_source
from counterfactory.generation.masks import dilate
from counterfactory.generation.sources import Source, SourceRecord, load_image
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import (
    REASONS,
    QueueItem,
    Reviewer,
    ReviewError,
    hash_token,
    parse_cell_id,
    queue_item,
    record_decision,
    record_spot_trial,
    review_queue,
    reviewer_for_token,
    spot_pool,
)
from counterfactory.manifests.spec import Spec
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.review_stats import review_summary

HERE = Path(__file__).resolve().parent
COOKIE = "cf_review"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: |candidate - source| at which the heat map saturates (8-bit levels)
HEAT_FULL_SCALE = 64
#: a blinded trial not answered within this many seconds is forgotten
TRIAL_TTL_S = 3600


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
    issued: float


class ReviewSite:
    """State shared by the requests of one ``review serve``: ledger, store, spec, caches."""

    def __init__(self, out: Path, spec: Spec, ledger: Ledger) -> None:
        self.out, self.spec, self.ledger = Path(out), spec, ledger
        self.options = spec.review
        self.store = ImageStore(spec.store_dir if spec.store_dir is not None else self.out / "store")
        self.secret = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._views: dict[str, TemplateView] = {}
        self._heat: dict[str, str] = {}
        self._trials: dict[str, PendingTrial] = {}

    # derived images ---------------------------------------------------------------------
    def template_view(self, template_id: str) -> TemplateView:
        with self._lock:
            if template_id in self._views:
                return self._views[template_id]
        row = next((r for r in self.ledger.sources() if r.source_id == template_id and r.status == "ok"), None)
        if row is None:
            raise ReviewError(f"source {template_id!r} is not an ok source in the ledger", status=404)
        meta = {k: v for k, v in (row.meta or {}).items() if k != "normalisation"}
        loaded = load_image(row.path, max_pixels=self.spec.sources.max_pixels)
        if row.sha256 and loaded.sha256 != row.sha256:
            raise ReviewError(
                f"{row.path}: the photo changed since the run (sha256 {loaded.sha256[:12]} != {row.sha256[:12]}); "
                "restore it to review its candidates",
                status=409,
            )
        source = Source(SourceRecord.model_validate(meta), Path(row.path), loaded.sha256, loaded.pixels, loaded.notes)
        prepared = prepare_source(self.spec, source)
        region = prepared.region
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

    # auth ---------------------------------------------------------------------------------
    def csrf_for(self, token: str) -> str:
        return hmac.new(self.secret, hash_token(token).encode(), hashlib.sha256).hexdigest()

    # blinded trials ---------------------------------------------------------------------
    def new_trial(self, reviewer: Reviewer) -> tuple[str, PendingTrial] | None:
        pool = spot_pool(self.ledger, reviewer.reviewer_id)
        with self._lock:
            now = time.time()
            for key in [k for k, t in self._trials.items() if now - t.issued > TRIAL_TTL_S]:
                del self._trials[key]
            pending = {t.attempt_id for t in self._trials.values() if t.reviewer_id == reviewer.reviewer_id}
        pool = [p for p in pool if p[0] not in pending]
        if not pool:
            return None
        attempt_id, cell_id, cand_sha = pool[secrets.randbelow(len(pool))]
        template_id, _ = parse_cell_id(cell_id)
        view = self.template_view(template_id)
        shown = "candidate" if secrets.randbelow(2) else "source"
        trial = PendingTrial(
            reviewer.reviewer_id,
            attempt_id,
            shown,
            cand_sha if shown == "candidate" else view.source_sha256,
            template_id,
            time.time(),
        )
        key = secrets.token_urlsafe(18)
        with self._lock:
            self._trials[key] = trial
        return key, trial

    def take_trial(self, key: str, reviewer: Reviewer) -> PendingTrial:
        with self._lock:
            trial = self._trials.get(key)
            if trial is None or trial.reviewer_id != reviewer.reviewer_id:
                raise ReviewError("unknown or expired trial; reload the page for a new image", status=404)
            del self._trials[key]
        return trial

    def peek_trial(self, key: str, reviewer: Reviewer) -> PendingTrial | None:
        with self._lock:
            trial = self._trials.get(key)
        return trial if trial is not None and trial.reviewer_id == reviewer.reviewer_id else None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _filters(request: Request) -> dict[str, str]:
    return {k: request.query_params.get(k, "") for k in ("template", "condition", "reason", "verdict", "state")}


def _condition_label(condition: dict[str, str]) -> str:
    return " · ".join(f"{v}" for v in condition.values())


def _matches(item: QueueItem, f: dict[str, str]) -> bool:
    if f["template"] and item.template_id != f["template"]:
        return False
    if f["condition"] and _condition_label(item.condition) != f["condition"]:
        return False
    if f["reason"] and not any(r.split(":")[0] == f["reason"] for r in item.reasons):
        return False
    if f["verdict"] and item.verdict != f["verdict"]:
        return False
    return not (f["state"] and item.resolution.state != f["state"])


def create_app(site: ReviewSite) -> FastAPI:
    """The FastAPI application over one run folder."""
    app = FastAPI(title="counterfactory review", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["fmt"] = _fmt
    app.state.site = site

    def problem(request: Request, status: int, message: str) -> Response:
        if "text/html" in request.headers.get("accept", ""):
            return templates.TemplateResponse(
                request, "login.html", {"message": message, "status": status}, status_code=status
            )
        return JSONResponse({"error": message}, status_code=status)

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
                else "this token is not a reviewer's token (typo, or the reviewer was added to another ledger)"
            )
            return problem(request, 401, message)
        request.state.reviewer = reviewer
        request.state.token = token
        return await call_next(request)

    def cross_site(request: Request) -> str | None:
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is not None and origin != own:
            return f"cross-site request from {origin} refused"
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return "cross-site request refused"
        return None

    def check_post(request: Request, csrf: str) -> Response | None:
        why = cross_site(request)
        if why is None and not hmac.compare_digest(csrf or "", site.csrf_for(request.state.token)):
            why = "missing or wrong CSRF token; reload the page"
        return JSONResponse({"error": why}, status_code=403) if why else None

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request):
        return templates.TemplateResponse(request, "login.html", {"message": None, "status": 200})

    @app.post("/login")
    def login(request: Request, token: str = Form(..., max_length=200)):
        why = cross_site(request)
        if why:
            return problem(request, 403, why)
        if reviewer_for_token(site.ledger, token) is None:
            return problem(request, 401, "this token is not a reviewer's token")
        response = RedirectResponse("/queue", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", max_age=12 * 3600)
        return response

    @app.get("/")
    def root():
        return RedirectResponse("/queue", status_code=303)

    @app.get("/static/{name}")
    def static(name: str):
        files = {"review.js": "text/javascript", "review.css": "text/css"}
        if name not in files:
            return JSONResponse({"error": f"no static file {name!r}"}, status_code=404)
        return FileResponse(HERE / "static" / name, media_type=files[name])

    @app.get("/img/{sha256}")
    def image(sha256: str):
        if not SHA256.match(sha256):
            return JSONResponse(
                {"error": "images are addressed by their sha256 (64 lowercase hex digits), nothing else"},
                status_code=400,
            )
        if not site.store.has(sha256):
            return JSONResponse({"error": f"no image {sha256[:12]}… in this run's store"}, status_code=404)
        return FileResponse(
            site.store.path(sha256), media_type="image/png", headers={"Cache-Control": "private, max-age=86400"}
        )

    @app.get("/queue", response_class=HTMLResponse)
    def queue(request: Request):
        reviewer: Reviewer = request.state.reviewer
        items = review_queue(site.ledger, site.options)
        f = _filters(request)
        mine = [
            i
            for i in items
            if _matches(i, f) and i.resolution.state != "resolved" and not i.decided_by(reviewer.reviewer_id)
        ]
        # items this reviewer skipped come last, so a skip moves on
        mine.sort(key=lambda i: i.skipped_by(reviewer.reviewer_id))
        wanted = request.query_params.get("item")
        item = next((i for i in mine if i.attempt_id == wanted), mine[0] if mine else None)
        context: dict[str, Any] = {
            "reviewer": reviewer,
            "filters": f,
            "left": len(mine),
            "total": len(items),
            "resolved": sum(i.resolution.state == "resolved" for i in items),
            "options": {
                "template": sorted({i.template_id for i in items}),
                "condition": sorted({_condition_label(i.condition) for i in items}),
                "reason": sorted({r.split(":")[0] for i in items for r in i.reasons}),
                "verdict": ["needs_review", "accepted", "rejected"],
                "state": ["open", "disputed"],
            },
            "reasons": REASONS,
            "csrf": site.csrf_for(request.state.token),
            "item": None,
        }
        if item is not None:
            item = queue_item(site.ledger, site.options, item.attempt_id) or item
            view = site.template_view(item.template_id)
            res = item.resolution
            context.update(
                item=item,
                view=view,
                heat=site.heat_map(item, view),
                condition=_condition_label(item.condition),
                state=res.state,
                seen=res.votes,
            )
        return templates.TemplateResponse(request, "queue.html", context)

    @app.post("/api/decisions")
    def decide(
        request: Request,
        attempt_id: str = Form(..., pattern=r"^[0-9a-f]{64}$"),
        decision: str = Form(..., max_length=8),
        seen: int = Form(..., ge=0),
        csrf: str = Form("", max_length=128),
        reason: str = Form("", max_length=40),
        note: str = Form("", max_length=2000),
    ):
        refused = check_post(request, csrf)
        if refused:
            return refused
        try:
            res = record_decision(
                site.ledger,
                site.options,
                attempt_id=attempt_id,
                reviewer=request.state.reviewer,
                decision=decision,
                reason=reason or None,
                note=note,
                seen=seen,
            )
        except ReviewError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return {"state": res.state, "outcome": res.outcome, "votes": res.votes}

    @app.get("/blind", response_class=HTMLResponse)
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

    @app.get("/blind/image/{trial}")
    def blind_image(request: Request, trial: str):
        pending = site.peek_trial(trial, request.state.reviewer)
        if pending is None:
            return JSONResponse({"error": "unknown or expired trial"}, status_code=404)
        return FileResponse(
            site.store.path(pending.sha256), media_type="image/png", headers={"Cache-Control": "no-store"}
        )

    @app.post("/api/spot")
    def spot(
        request: Request,
        trial: str = Form(..., max_length=64),
        answer: str = Form(..., pattern=r"^(edited|unedited)$"),
        csrf: str = Form("", max_length=128),
        x: float | None = Form(None),
        y: float | None = Form(None),
    ):
        refused = check_post(request, csrf)
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
        record_spot_trial(
            site.ledger,
            attempt_id=pending.attempt_id,
            reviewer=reviewer,
            shown=pending.shown,
            said_edited=said_edited,
            click=click,
            localised=localised,
        )
        return {"shown": pending.shown, "localised": localised}

    @app.get("/stats")
    def stats():
        return review_summary(site.ledger, site.options)

    return app


def serve(out: Path, spec: Spec, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the site with uvicorn until interrupted."""
    import uvicorn

    ledger = Ledger(ledger_url_for(out, spec))
    try:
        uvicorn.run(create_app(ReviewSite(out, spec, ledger)), host=host, port=port, log_level="warning")
    finally:
        ledger.close()


def run_spec_for(out: Path, spec_path: Path | None = None) -> Spec:
    """The spec a run folder was made with: ``spec_path`` if given, else the spec file its last run
    recorded, else the spec.yaml of its newest release.

    Raises:
        FileNotFoundError: neither is there; the message says to pass ``--spec``.
    """
    from counterfactory.manifests.spec import load_spec

    if spec_path is not None:
        return load_spec(spec_path)
    from counterfactory.flows.publish import PublishError, remembered_spec

    try:
        # the spec file `counterfactory run` recorded: a release's spec.yaml is the text as
        # written, whose relative paths only mean something beside the original file
        remembered, _ = remembered_spec(out)
        if remembered.is_file():
            return load_spec(remembered)
    except PublishError:
        pass
    found = sorted((Path(out) / "releases").glob("*/*/spec.yaml"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"{out}: no release with a spec.yaml under {Path(out) / 'releases'}; pass the run's spec with --spec"
        )
    return load_spec(found[-1])


def ledger_url_for(out: Path, spec: Spec) -> str:
    return spec.ledger_url or f"sqlite:///{Path(out).resolve() / 'ledger.sqlite'}"
