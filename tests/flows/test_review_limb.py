"""Review of a limb set: the queue page shows the limb mask, and spot-the-edit localises clicks
against the limb mask grown by ``review.spot_dilate_px``."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
import yaml
from sqlalchemy import text

from counterfactory.assets import PHOTOS_DIR, SPECS_DIR
from counterfactory.flows.engine.spec import load_spec
from counterfactory.flows.review_app import ReviewSite
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import add_reviewer
from tests.flows.review_setup import run_and_publish, serving

pytestmark = pytest.mark.slow


def test_limb_set_blinded_clicks_inside_the_limb_mask_are_localised(tmp_path):
    spec = yaml.safe_load((SPECS_DIR / "demo-limb.yaml").read_text())
    spec["sources"] = {"photos": str(PHOTOS_DIR), "metadata": str(PHOTOS_DIR / "limb-metadata.yaml")}
    spec["review"] = {"audit_accepted_rate": 1.0, "audit_rejected_rate": 1.0, "spot_dilate_px": 6}
    spec_path = tmp_path / "limb.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    sealed, calls = run_and_publish(spec_path, out)
    assert calls > 0
    loaded = load_spec(spec_path)
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    token = add_reviewer(ledger, "ann")
    site = ReviewSite(out, loaded, ledger)
    views = {s.source_id: site.template_view(s.source_id) for s in ledger.sources() if s.status == "ok"}
    with serving(out, spec_path) as base:
        client = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {token}"})
        page = client.get("/queue").text
        overlay = re.search(r'<img class="overlay" src="/img/(\w+)"', page).group(1)
        assert overlay in {v.overlay_sha256 for v in views.values()}
        results = []
        while True:
            page = client.get("/blind").text
            found = re.search(r'data-trial="([\w-]+)" data-csrf="(\w+)"', page)
            if not found:
                break
            trial, csrf = found.groups()
            image = client.get(f"/blind/image/{trial}").content
            template = next(
                t for t, v in views.items() if image in (_png(out, v.source_sha256), *_candidates(out, ledger, t))
            )
            region = views[template].spot_region
            ys, xs = np.nonzero(region)
            x, y = float(np.median(xs)), float(np.median(ys))
            assert region[int(y), int(x)]
            answer = client.post("/api/spot", data={"trial": trial, "csrf": csrf, "answer": "edited", "x": x, "y": y})
            assert answer.json() == {"recorded": True}
            results.append(trial)
    with ledger.engine.connect() as c:
        rows = c.execute(text("SELECT shown, localised FROM spot_trials")).all()
    ledger.close()
    assert results and len(rows) == len(results)
    # SQLite hands booleans back as 0/1
    assert all(
        (None if r.localised is None else bool(r.localised)) is (True if r.shown == "candidate" else None) for r in rows
    )


def _png(out, sha):
    return (out / "store" / sha[:2] / f"{sha}.png").read_bytes()


def _candidates(out, ledger, template):
    return [
        _png(out, c.image_sha256)
        for c in ledger.candidates()
        if c.cell_id.startswith(f"{template}|") and c.image_sha256
    ]
