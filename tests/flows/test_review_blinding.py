"""The review site keeps the audit sample blind and serves only verified images, over a real
``counterfactory run`` folder (the review tests' shared run, copied per test): the probes of
issue 36 as an attacker would try them.
"""

from __future__ import annotations

import os
import re

import httpx
import pytest
from PIL import Image
from sqlalchemy import text

from counterfactory.flows.engine.spec import load_spec
from counterfactory.flows.review_app import _matches
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import QueueItem, add_reviewer, review_queue
from counterfactory.validation.review_stats import review_summary
from tests.flows.review_setup import serving


def _signed_in(base: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=120)
    assert client.post("/login", data={"token": token}).status_code == 303
    return client


def _token(out, name: str = "ann") -> str:
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        return add_reviewer(ledger, name)
    finally:
        ledger.close()


def _audit_items(spec_path, out, verdict: str):
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        return [
            i for i in review_queue(ledger, load_spec(spec_path).review) if i.mode == "audit" and i.verdict == verdict
        ]
    finally:
        ledger.close()


def test_an_audit_item_matches_no_verdict_or_reason_filter():
    item = QueueItem("a" * 64, "t|race=Black", "t", {"race": "Black"}, 1, True, "rejected", ["identity_low:0.1"], {},
                     "b" * 64, "audit", 1)  # fmt: skip
    none = {"template": "", "condition": "", "reason": "", "verdict": "", "state": ""}
    assert _matches(item, none)
    assert not _matches(item, dict(none, verdict="rejected"))
    assert not _matches(item, dict(none, reason="identity_low"))
    queued = QueueItem(**{**item.__dict__, "mode": "queue"})
    assert _matches(queued, dict(none, verdict="rejected")) and _matches(queued, dict(none, reason="identity_low"))


@pytest.mark.slow
def test_audit_items_take_no_verdict_or_reason_filter(run_copy):
    spec_path, out = run_copy
    accepted = _audit_items(spec_path, out, "accepted")
    assert accepted  # the review run audits every accepted candidate
    with serving(out, spec_path) as base:
        ann = _signed_in(base, _token(out))
        # unfiltered, the queue deals audit items (blind to the gates)
        listed = ann.get("/api/item").json()
        assert listed["attempt_id"] is not None and listed["total"] > 0
        # the bypass: asking for what the gates accepted must not list the audit items they accepted
        by_verdict = ann.get("/api/item", params={"verdict": "accepted"}).json()
        assert by_verdict["attempt_id"] not in {i.attempt_id for i in accepted}
        assert by_verdict["left"] == 0
        page = ann.get("/queue", params={"verdict": "accepted"}).text
        assert not any(f'data-attempt="{i.attempt_id}"' in page for i in accepted)
        # an audit item's view says nothing of the gates' verdict before the first decision
        shown = ann.get("/api/item", params={"item": accepted[0].attempt_id}).json()
        assert shown["attempt_id"] == accepted[0].attempt_id
        assert 'id="gate-verdict"' not in shown["html"] and "audit sample" in shown["html"]


@pytest.mark.slow
def test_the_override_rate_counts_each_reviewers_first_vote(run_copy):
    spec_path, out = run_copy
    target = _audit_items(spec_path, out, "accepted")[0].attempt_id
    with serving(out, spec_path) as base:
        ann = _signed_in(base, _token(out))
        html = ann.get("/api/item", params={"item": target}).json()["html"]
        form = dict(
            zip(("attempt_id", "ticket", "csrf"), re.search(r'data-attempt="(\w+)" data-ticket="([\w.]+)" data-csrf="(\w+)"', html).groups())
        )  # fmt: skip
        # reject, read the gates' verdict, undo, accept
        first = ann.post("/api/decisions", data=dict(form, decision="reject", reason="artifact")).json()
        assert first["gate_verdict"] == "accepted"
        undo = {"attempt_id": target, "ticket": first["ticket"], "csrf": form["csrf"]}
        assert ann.post("/api/undo", data=undo).status_code == 200
        html = ann.get("/api/item", params={"item": target}).json()["html"]
        ticket = re.search(r'data-ticket="([\w.]+)"', html).group(1)
        assert (
            ann.post("/api/decisions", data=dict(form, ticket=ticket, decision="accept")).json()["outcome"]
            == "accepted"
        )
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        override = review_summary(ledger, load_spec(spec_path).review)["override"]["accepted"]
    finally:
        ledger.close()
    # the first vote (reject) reversed the gates; the accept after reading their verdict does not count
    assert (override["n"], override["hits"]) == (1, 1)


@pytest.mark.slow
def test_a_blinded_trial_is_dealt_once_and_recorded_when_shown(run_copy):
    spec_path, out = run_copy
    with serving(out, spec_path) as base:
        ann = _signed_in(base, _token(out))
        keys, images = [], []
        for _ in range(3):  # reloading deals the same trial, the same image
            page = ann.get("/blind").text
            key = re.search(r'data-trial="([\w-]+)"', page).group(1)
            keys.append(key)
            images.append(ann.get(f"/blind/image/{key}").content)
        assert len(set(keys)) == 1 and len(set(images)) == 1
        # shown, not answered: on record already
        ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
        try:
            with ledger.engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM spot_deals")).scalar_one() == 1
            assert review_summary(ledger, load_spec(spec_path).review)["spot_the_edit"]["unanswered"] == 1
        finally:
            ledger.close()
        csrf = re.search(r'data-csrf="(\w+)"', page).group(1)
        r = ann.post("/api/spot", data={"trial": keys[0], "csrf": csrf, "answer": "unedited"})
        assert r.json() == {"recorded": True}
        assert ann.post("/api/spot", data={"trial": keys[0], "csrf": csrf, "answer": "edited"}).status_code == 404
        following = re.search(r'data-trial="([\w-]+)"', ann.get("/blind").text)
        assert following is None or following.group(1) != keys[0]


@pytest.mark.slow
def test_img_serves_only_a_verified_store_file(run_copy):
    spec_path, out = run_copy
    store = out / "store"
    blobs = sorted(store.rglob("*.png"))
    linked, edited, other = blobs[0], blobs[1], blobs[2]
    with Image.open(other) as im:
        assert im.size  # a real image with other bytes
    linked.unlink()
    os.symlink("/etc/passwd", linked)
    edited.write_bytes(other.read_bytes())
    with serving(out, spec_path) as base:
        ann = _signed_in(base, _token(out))
        served = ann.get(f"/img/{other.stem}")
        assert served.status_code == 200 and served.content == other.read_bytes()
        r = ann.get(f"/img/{linked.stem}")
        assert r.status_code == 404 and b"root:" not in r.content
        assert "its store entry is not a regular file inside the store (a symlink?)" in r.json()["error"]
        r = ann.get(f"/img/{edited.stem}")
        assert r.status_code == 409 and "do not hash to its name" in r.json()["error"]


@pytest.mark.slow
def test_img_serves_nothing_through_a_store_folder_symlinked_out_of_the_store(run_copy, tmp_path):
    """The bytes behind the symlinked folder hash to their names, but they lie outside the store
    (whoever can write the store and knows a file's sha256 could read it), so they are not served."""
    spec_path, out = run_copy
    store = out / "store"
    blob = sorted(store.rglob("*.png"))[0]
    folder = blob.parent
    outside = tmp_path / "outside" / folder.name
    outside.parent.mkdir()
    folder.rename(outside)
    os.symlink(outside, folder)
    assert (folder / blob.name).read_bytes() == (outside / blob.name).read_bytes()
    with serving(out, spec_path) as base:
        ann = _signed_in(base, _token(out))
        r = ann.get(f"/img/{blob.stem}")
        assert r.status_code == 404, r.status_code
        assert "not a regular file inside the store" in r.json()["error"]
