"""Review decisions: the rule, the checks, the audit sample and what publishing gets; SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from counterfactory.manifests.ledger import Base, Ledger
from counterfactory.manifests.review import (
    ReviewError,
    ReviewOptions,
    add_reviewer,
    apply_reviews,
    final_attempts,
    hash_token,
    pending_by_group,
    record_decision,
    review_queue,
    reviewer_for_token,
    sampled,
)
from counterfactory.validation.review_stats import cohens_kappa, review_summary
from tests.manifests.pg import postgres_server
from tests.manifests.review_fixtures import attempt_id, fill

NO_AUDIT = ReviewOptions(audit_accepted_rate=0.0, audit_rejected_rate=0.0)
BLACK_MALE = "biden|race=Black|gender=male"
BLACK_FEMALE = "biden|race=Black|gender=female"


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    else:
        url = request.getfixturevalue("pg_url")
        led = Ledger(url)
        Base.metadata.drop_all(led.engine)
        with led.engine.begin() as c:
            c.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
        led.close()
        led = Ledger(url)
    yield led
    led.close()


def _reviewers(ledger, *names):
    return [reviewer_for_token(ledger, add_reviewer(ledger, n)) for n in names]


def test_tokens_are_stored_only_as_hashes(ledger):
    token = add_reviewer(ledger, "ann")
    with ledger.engine.connect() as c:
        stored = c.exec_driver_sql("SELECT token_sha256 FROM reviewers").scalars().all()
    assert stored == [hash_token(token)] and token not in stored[0]
    assert reviewer_for_token(ledger, token).name == "ann"
    assert reviewer_for_token(ledger, token + "x") is None and reviewer_for_token(ledger, "") is None
    with pytest.raises(ReviewError, match="already exists"):
        add_reviewer(ledger, "ann")


def test_queue_is_needs_review_and_decisions_resolve_it(ledger):
    ids = fill(ledger)
    (ann,) = _reviewers(ledger, "ann")
    queue = review_queue(ledger, NO_AUDIT)
    assert {i.cell_id for i in queue} == {BLACK_MALE, BLACK_FEMALE}
    assert all(i.mode == "queue" and i.required == 1 for i in queue)
    res = record_decision(ledger, NO_AUDIT, attempt_id=ids[BLACK_MALE][0], reviewer=ann, decision="accept", seen=0)
    assert (res.state, res.outcome) == ("resolved", "accepted")
    # refused: already decided, unknown item, an item outside the queue, bad decision or reason
    (bob,) = _reviewers(ledger, "bob")
    for kwargs, status in [
        ({"attempt_id": ids[BLACK_MALE][0], "decision": "reject", "reason": "artifact", "seen": 1}, 409),
        ({"attempt_id": "f" * 64, "decision": "accept", "seen": 0}, 404),
        ({"attempt_id": ids["biden|race=White|gender=male"][0], "decision": "accept", "seen": 0}, 404),
        ({"attempt_id": ids[BLACK_FEMALE][0], "decision": "maybe", "seen": 0}, 400),
        ({"attempt_id": ids[BLACK_FEMALE][0], "decision": "reject", "reason": "ugly", "seen": 0}, 400),
        ({"attempt_id": ids[BLACK_FEMALE][0], "decision": "reject", "reason": "other", "seen": 0}, 400),
        ({"attempt_id": ids[BLACK_FEMALE][0], "decision": "accept", "seen": 3}, 400),
    ]:
        with pytest.raises(ReviewError) as info:
            record_decision(ledger, NO_AUDIT, reviewer=bob, **kwargs)
        assert info.value.status == status, kwargs
    # nothing of that was written
    assert sum(len(i.decisions) for i in review_queue(ledger, NO_AUDIT)) == 1
    res = record_decision(
        ledger,
        NO_AUDIT,
        attempt_id=ids[BLACK_FEMALE][0],
        reviewer=bob,
        decision="reject",
        reason="other",
        note="hairline smeared",
        seen=0,
    )
    assert (res.state, res.outcome, res.reason) == ("resolved", "rejected", "other")


def test_simultaneous_decisions_are_both_kept_and_a_disagreement_needs_a_third(ledger):
    ids = fill(ledger)
    ann, bob, cat = _reviewers(ledger, "ann", "bob", "cat")
    target = ids[BLACK_MALE][0]
    barrier = threading.Barrier(2)
    errors = []

    def decide(reviewer, decision, reason=None):
        barrier.wait()
        try:
            record_decision(
                ledger, NO_AUDIT, attempt_id=target, reviewer=reviewer, decision=decision, reason=reason, seen=0
            )
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [
        threading.Thread(target=decide, args=(ann, "accept")),
        threading.Thread(target=decide, args=(bob, "reject", "skin_tone_shift")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    item = next(i for i in review_queue(ledger, NO_AUDIT) if i.attempt_id == target)
    assert sorted(d.reviewer for d in item.decisions) == ["ann", "bob"]
    assert item.resolution.state == "disputed"
    res = record_decision(
        ledger, NO_AUDIT, attempt_id=target, reviewer=cat, decision="reject", reason="wrong_group", seen=2
    )
    assert (res.state, res.outcome) == ("resolved", "rejected")
    item = next(i for i in review_queue(ledger, NO_AUDIT) if i.attempt_id == target)
    assert [d.mode for d in item.decisions][-1] == "tiebreak"


def test_audit_sample_is_deterministic_and_close_to_its_rate():
    ids = [f"{i:064x}" for i in range(4000)]
    picked = [sampled("audit-accepted", 3, a, 0.1) for a in ids]
    assert picked == [sampled("audit-accepted", 3, a, 0.1) for a in ids]
    # binomial(4000, 0.1): sd = 19, so 400 +- 4 sd
    assert 324 < sum(picked) < 476
    assert not any(sampled("audit-accepted", 3, a, 0.0) for a in ids)
    assert all(sampled("audit-accepted", 3, a, 1.0) for a in ids)


def test_full_audit_queues_every_candidate_with_an_image(ledger):
    fill(ledger)
    everything = ReviewOptions(audit_accepted_rate=1.0, audit_rejected_rate=1.0)
    queue = review_queue(ledger, everything)
    assert len(queue) == 7
    assert {i.mode for i in queue if i.verdict != "needs_review"} == {"audit"}
    finals = final_attempts(ledger)
    assert attempt_id("grace|race=Black|gender=female", 2) in finals
    assert attempt_id("grace|race=Black|gender=female", 1) not in finals
    assert attempt_id("grace|race=White|gender=female", 2) in finals


def test_release_rows_get_history_and_effective_status(ledger):
    ids = fill(ledger)
    ann, bob = _reviewers(ledger, "ann", "bob")
    opts = ReviewOptions(audit_accepted_rate=1.0, audit_rejected_rate=1.0)
    record_decision(ledger, opts, attempt_id=ids[BLACK_MALE][0], reviewer=ann, decision="accept", seen=0)
    rejected_final = ids["grace|race=White|gender=female"][1]
    record_decision(ledger, opts, attempt_id=rejected_final, reviewer=ann, decision="accept", seen=0)
    record_decision(ledger, opts, attempt_id=ids[BLACK_FEMALE][0], reviewer=bob, decision="skip", seen=0)
    rows = [
        {
            "item_id": ids[c][-1],
            "status": v[-1],
            "reasons": ["r"],
            "condition": dict(x.split("=") for x in c.split("|")[1:]),
        }
        for c, v in {
            BLACK_MALE: ["needs_review"],
            BLACK_FEMALE: ["needs_review"],
            "grace|race=White|gender=female": ["rejected", "rejected"],
        }.items()
    ]
    apply_reviews(ledger, opts, rows)
    by = {r["item_id"]: r for r in rows}
    assert by[ids[BLACK_MALE][0]]["status"] == "accepted"
    assert by[ids[BLACK_MALE][0]]["review"]["decisions"][0]["reviewer"] == "ann"
    assert by[ids[BLACK_MALE][0]]["review"]["gate_verdict"] == "needs_review"
    assert by[rejected_final]["status"] == "accepted" and by[rejected_final]["review"]["mode"] == "audit"
    # a skip is history, not a decision: still waiting
    assert by[ids[BLACK_FEMALE][0]]["status"] == "needs_review"
    assert by[ids[BLACK_FEMALE][0]]["review"]["decisions"][0]["decision"] == "skip"
    assert pending_by_group(rows) == {"total": 1, "by_group": {"gender=female": 1, "race=Black": 1}}
    summary = review_summary(ledger, opts)
    assert summary["override"]["rejected"]["n"] == 1 and summary["override"]["rejected"]["hits"] == 1


@pytest.mark.parametrize(
    ("a_yes_b_yes", "a_yes_b_no", "a_no_b_yes", "a_no_b_no", "kappa"),
    # the worked examples of the Wikipedia article "Cohen's kappa" (2x2 tables of 50 and 100 items)
    [(20, 5, 10, 15, 0.4), (45, 15, 25, 15, 0.1304), (25, 35, 5, 35, 0.2593)],
)
def test_cohens_kappa_matches_published_examples(a_yes_b_yes, a_yes_b_no, a_no_b_yes, a_no_b_no, kappa):
    pairs = (
        [("y", "y")] * a_yes_b_yes + [("y", "n")] * a_yes_b_no + [("n", "y")] * a_no_b_yes + [("n", "n")] * a_no_b_no
    )
    assert cohens_kappa(pairs) == pytest.approx(kappa, abs=5e-5)
    assert cohens_kappa([]) is None


def test_double_review_needs_two_matching_decisions_and_feeds_kappa(ledger):
    ids = fill(ledger)
    ann, bob = _reviewers(ledger, "ann", "bob")
    double = ReviewOptions(audit_accepted_rate=1.0, audit_rejected_rate=1.0, double_review_rate=1.0)
    plan = {  # attempt -> (ann, bob)
        ids[BLACK_MALE][0]: (("accept", None), ("accept", None)),
        ids[BLACK_FEMALE][0]: (("reject", "skin_tone_shift"), ("reject", "skin_tone_shift")),
        ids["biden|race=White|gender=male"][0]: (("accept", None), ("reject", "artifact")),
        ids["grace|race=White|gender=female"][1]: (("reject", "artifact"), ("reject", "skin_tone_shift")),
    }
    for aid, ((a, ra), (b, rb)) in plan.items():
        first = record_decision(ledger, double, attempt_id=aid, reviewer=ann, decision=a, reason=ra, seen=0)
        assert first.state == "open"  # one decision is not enough in the double-review sample
        record_decision(ledger, double, attempt_id=aid, reviewer=bob, decision=b, reason=rb, seen=1)
    states = {i.attempt_id: i.resolution for i in review_queue(ledger, double) if i.attempt_id in plan}
    assert states[ids[BLACK_MALE][0]].outcome == "accepted"
    assert states[ids[BLACK_FEMALE][0]].outcome == "rejected"
    assert states[ids["biden|race=White|gender=male"][0]].state == "disputed"
    assert states[ids["grace|race=White|gender=female"][1]].outcome == "rejected"
    agreement = review_summary(ledger, double)["agreement"]
    assert agreement["pairs"] == 4 and agreement["agree"] == 3
    # accept/reject: (a,a) (r,r) (a,r) (r,r): p_o = 3/4, p_e = 2/4*1/4 + 2/4*3/4 = 1/2 -> kappa 1/2
    assert agreement["kappa"] == pytest.approx(0.5)
    # skin-tone shift: (n,n) (y,y) (n,n) (n,y): p_o = 3/4, p_e = 3/4*2/4 + 1/4*2/4 = 1/2 -> 1/2
    assert agreement["kappa_per_reason"]["skin_tone_shift"] == pytest.approx(0.5)
