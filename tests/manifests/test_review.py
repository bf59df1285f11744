"""Review decisions: the rule, the checks, the audit sample and what publishing gets; SQLite and PostgreSQL."""

from __future__ import annotations

import re
import threading

import pytest
from sqlalchemy import text

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
    revoke_reviewer,
    sampled,
    undo_decision,
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


def _race(ledger, options, target, calls) -> list:
    """Run ``calls`` (reviewer, decision, reason, seen) at one moment; the outcome of each."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def decide(k, reviewer, decision, reason, seen):
        barrier.wait()
        try:
            results[k] = record_decision(
                ledger, options, attempt_id=target, reviewer=reviewer, decision=decision, reason=reason, seen=seen
            )
        except ReviewError as exc:
            results[k] = exc

    threads = [threading.Thread(target=decide, args=(k, *c)) for k, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _votes(ledger, options, target):
    item = next(i for i in review_queue(ledger, options) if i.attempt_id == target)
    return [(d.reviewer, d.decision) for d in item.decisions], item.resolution


def test_two_reviewers_answering_one_view_at_once_store_one_vote_and_the_other_is_told(ledger):
    ids = fill(ledger)
    ann, bob, cat = _reviewers(ledger, "ann", "bob", "cat")
    target = ids[BLACK_MALE][0]
    results = _race(ledger, NO_AUDIT, target, [(ann, "accept", None, 0), (bob, "reject", "skin_tone_shift", 0)])
    refused = [r for r in results if isinstance(r, ReviewError)]
    assert len(refused) == 1 and refused[0].status == 409
    history, res = _votes(ledger, NO_AUDIT, target)
    assert len(history) == 1 and res.state == "resolved"
    # the loser's view is stale; a decided item is not reopened by it, nor by a forged seen=0
    for reviewer in (ann, bob, cat):
        with pytest.raises(ReviewError) as info:
            record_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=reviewer, decision="accept", seen=0)
        assert info.value.status == 409
    assert _votes(ledger, NO_AUDIT, target)[0] == history


@pytest.mark.parametrize("burst", [2, 3, 10])
def test_one_reviewer_posting_one_view_many_times_at_once_stores_one_vote(ledger, burst):
    """A double click (2), a key burst such as ``a a r`` (3), ten concurrent posts (10)."""
    ids = fill(ledger)
    (bob,) = _reviewers(ledger, "bob")
    target = ids[BLACK_FEMALE][0]
    calls = [(bob, "accept", None, 0) if k % 3 != 2 else (bob, "reject", "artifact", 0) for k in range(burst)]
    results = _race(ledger, NO_AUDIT, target, calls)
    assert sum(not isinstance(r, ReviewError) for r in results) == 1
    assert all(r.status == 409 for r in results if isinstance(r, ReviewError))
    history, _ = _votes(ledger, NO_AUDIT, target)
    assert len(history) == 1 and history[0][0] == "bob"
    # counted in the database itself, not only by the application
    with ledger.engine.connect() as c:
        n = c.execute(text("SELECT count(*) FROM review_decisions WHERE attempt_id = :a"), {"a": target}).scalar_one()
    assert n == 1


def test_the_database_refuses_a_second_vote_even_past_the_application(ledger):
    from sqlalchemy.exc import IntegrityError

    from counterfactory.manifests.ledger import DecisionRow

    ids = fill(ledger)
    (ann,) = _reviewers(ledger, "ann")
    target = ids[BLACK_MALE][0]
    record_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=ann, decision="accept", seen=0)
    for seq, ballot in ((0, "vote:x:0"), (1, f"vote:{ann.reviewer_id}:0")):
        with pytest.raises(IntegrityError), ledger.session() as s, s.begin():
            s.add(
                DecisionRow(
                    attempt_id=target,
                    reviewer_id=ann.reviewer_id,
                    mode="queue",
                    decision="accept",
                    seen=seq,
                    seq=seq,
                    ballot=ballot,
                )
            )


def test_a_disagreement_needs_a_third_reviewer_who_breaks_the_tie(ledger):
    ids = fill(ledger)
    ann, bob, cat = _reviewers(ledger, "ann", "bob", "cat")
    double = ReviewOptions(audit_accepted_rate=0.0, audit_rejected_rate=0.0, double_review_rate=1.0)
    target = ids[BLACK_MALE][0]
    assert record_decision(ledger, double, attempt_id=target, reviewer=ann, decision="accept", seen=0).state == "open"
    res = record_decision(
        ledger, double, attempt_id=target, reviewer=bob, decision="reject", reason="skin_tone_shift", seen=1
    )
    assert res.state == "disputed"
    res = record_decision(
        ledger, double, attempt_id=target, reviewer=cat, decision="reject", reason="wrong_group", seen=2
    )
    assert (res.state, res.outcome) == ("resolved", "rejected")
    item = next(i for i in review_queue(ledger, double) if i.attempt_id == target)
    assert [d.mode for d in item.decisions][-1] == "tiebreak"


def test_a_double_review_item_is_never_resolved_by_one_person(ledger):
    ids = fill(ledger)
    ann, bob = _reviewers(ledger, "ann", "bob")
    double = ReviewOptions(audit_accepted_rate=0.0, audit_rejected_rate=0.0, double_review_rate=1.0)
    target = ids[BLACK_MALE][0]
    # a double click: the second answers the same view and is refused
    results = _race(ledger, double, target, [(ann, "accept", None, 0), (ann, "accept", None, 0)])
    assert sum(isinstance(r, ReviewError) for r in results) == 1
    # a fresh view of the same reviewer: still one person
    with pytest.raises(ReviewError, match="already decided") as info:
        record_decision(ledger, double, attempt_id=target, reviewer=ann, decision="accept", seen=1)
    assert info.value.status == 409
    assert _votes(ledger, double, target)[1].state == "open"
    res = record_decision(ledger, double, attempt_id=target, reviewer=bob, decision="accept", seen=1)
    assert (res.state, res.outcome, res.votes) == ("resolved", "accepted", 2)


def test_undo_withdraws_a_vote_with_a_new_row_and_only_from_the_view_it_answered(ledger):
    ids = fill(ledger)
    ann, bob = _reviewers(ledger, "ann", "bob")
    target = ids[BLACK_MALE][0]
    assert record_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=ann, decision="accept", seen=0).state == (
        "resolved"
    )
    with pytest.raises(ReviewError) as info:  # bob cannot undo ann's vote
        undo_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=bob, seen=1)
    assert info.value.status == 409
    res = undo_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=ann, seen=1)
    assert (res.state, res.votes, res.events) == ("open", 0, 2)
    with pytest.raises(ReviewError):  # one undo per vote
        undo_decision(ledger, NO_AUDIT, attempt_id=target, reviewer=ann, seen=2)
    res = record_decision(
        ledger, NO_AUDIT, attempt_id=target, reviewer=ann, decision="reject", reason="artifact", seen=2
    )
    assert (res.state, res.outcome) == ("resolved", "rejected")
    history, _ = _votes(ledger, NO_AUDIT, target)
    assert history == [("ann", "accept"), ("ann", "undo"), ("ann", "reject")]
    # once someone else has voted after it, a vote can no longer be undone from its old view
    other = ids[BLACK_FEMALE][0]
    double = ReviewOptions(audit_accepted_rate=0.0, audit_rejected_rate=0.0, double_review_rate=1.0)
    record_decision(ledger, double, attempt_id=other, reviewer=ann, decision="accept", seen=0)
    record_decision(ledger, double, attempt_id=other, reviewer=bob, decision="accept", seen=1)
    with pytest.raises(ReviewError) as info:
        undo_decision(ledger, double, attempt_id=other, reviewer=ann, seen=1)
    assert info.value.status == 409
    # the manifest history carries every row, the undo included
    rows = [{"item_id": target, "status": "needs_review", "reasons": ["x"]}]
    apply_reviews(ledger, NO_AUDIT, rows)
    assert [d["decision"] for d in rows[0]["review"]["decisions"]] == ["accept", "undo", "reject"]
    assert rows[0]["status"] == "rejected"


def test_a_revoked_reviewer_signs_in_no_more_and_keeps_their_decisions(ledger):
    ids = fill(ledger)
    token = add_reviewer(ledger, "ann")
    ann = reviewer_for_token(ledger, token)
    record_decision(ledger, NO_AUDIT, attempt_id=ids[BLACK_MALE][0], reviewer=ann, decision="accept", seen=0)
    assert revoke_reviewer(ledger, "ann") is True and revoke_reviewer(ledger, "ann") is False
    assert reviewer_for_token(ledger, token) is None
    with pytest.raises(ReviewError) as info:
        revoke_reviewer(ledger, "nobody")
    assert info.value.status == 404
    assert _votes(ledger, NO_AUDIT, ids[BLACK_MALE][0])[1].outcome == "accepted"


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


def test_cohens_kappa_of_three_labels_and_of_one():
    """Three labels, 40 items, counted by hand from the definition (not from the code under test):
    rows rater A, columns rater B, labels x y z = [[10, 2, 3], [1, 8, 1], [2, 2, 11]];
    p_o = 29/40; marginals A 15 10 15, B 13 12 15: p_e = (195 + 120 + 225)/1600 = 540/1600;
    kappa = (29/40 - 540/1600) / (1 - 540/1600) = 620/1060 = 0.58491."""
    table = {("x", "x"): 10, ("x", "y"): 2, ("x", "z"): 3, ("y", "x"): 1, ("y", "y"): 8, ("y", "z"): 1}
    table |= {("z", "x"): 2, ("z", "y"): 2, ("z", "z"): 11}
    pairs = [pair for pair, n in table.items() for _ in range(n)]
    assert cohens_kappa(pairs) == pytest.approx(620 / 1060, abs=1e-12)
    # the labels' order does not matter, nor their kind
    assert cohens_kappa(pairs[::-1]) == pytest.approx(620 / 1060, abs=1e-12)
    assert cohens_kappa([(True, False), (False, True)]) == pytest.approx(-1.0)
    # one label used by both raters for everything: p_e = 1, perfect but uninformative agreement
    assert cohens_kappa([("accept", "accept")] * 3) == 1.0


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


def test_reviewer_names_are_normalised_and_confusable_ones_refused(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        add_reviewer(ledger, "alice")
        add_reviewer(ledger, "\uff42\uff4f\uff42")  # fullwidth "bob", stored as NFKC "bob"
        for confusable, said in (
            ("\u0430lice", "mixes Cyrillic and Latin letters"),  # a Cyrillic а, then Latin
            ("ALICE", "is confusable with the existing reviewer 'alice'"),
            ("\u0412\u041e\u0412", "is confusable with the existing reviewer 'bob'"),  # all Cyrillic ВОВ
            ("BOB", "is confusable with the existing reviewer 'bob'"),
            ("mallory\n\u202eyrollam", "no control, invisible or direction-changing characters"),
            ("eve\u200b", "no control, invisible or direction-changing characters"),
        ):
            with pytest.raises(ReviewError, match=re.escape(said)):
                add_reviewer(ledger, confusable)
        with ledger.session() as s:
            names = sorted(s.scalars(text("SELECT name FROM reviewers")))
        assert names == ["alice", "bob"]
        # revoking finds a reviewer by the same key
        assert revoke_reviewer(ledger, "ALICE") is True
    finally:
        ledger.close()
