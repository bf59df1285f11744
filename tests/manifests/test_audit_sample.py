"""Uncertainty sampling: the audit sample adds candidates near a threshold, marked
``random: false``, and keeps its random share, marked ``random: true``."""

from __future__ import annotations

import hashlib

from counterfactory.manifests.audit_sample import audit_mode, threshold_margin
from counterfactory.manifests.ledger import AttemptRow, CandidateRow, Ledger
from counterfactory.manifests.review import ReviewOptions, review_queue, review_records


def _gates(pose: float) -> dict:
    return {
        "face": {
            "metrics": {"pose_change_deg": pose, "position_change": 0.001},
            "thresholds": {"max_pose_change_deg": 4.8, "max_position_change": 0.012, "backend": "mediapipe"},
        },
        "locality": {
            "metrics": {"face_change": 0.5, "face_change_above_floor": 0.2},
            "thresholds": {"min_face_change": 0.039},
        },
    }


def test_the_margin_is_the_nearest_threshold_in_log_ratio_and_reads_the_floor_relative_measure():
    assert abs(threshold_margin(_gates(4.0)) - abs(__import__("math").log(4.0 / 4.8))) < 1e-12
    assert threshold_margin({"face": {"metrics": {}, "thresholds": {"max_pose_change_deg": 4.8}}}) is None
    near = ReviewOptions(audit_accepted_rate=0.0, audit_rejected_rate=0.0, audit_near_threshold=0.25)
    assert audit_mode(near, "a" * 64, "accepted", _gates(4.5)) == ("audit", False)
    assert audit_mode(near, "a" * 64, "accepted", _gates(1.0)) == (None, None)
    assert audit_mode(near, "a" * 64, "needs_review", _gates(1.0)) == ("queue", None)
    assert audit_mode(ReviewOptions(audit_accepted_rate=1.0), "a" * 64, "accepted", _gates(1.0)) == ("audit", True)


def test_the_queue_marks_each_audit_item_random_or_near_a_threshold(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    poses = [1.0, 4.4, 5.2, 12.0] * 10
    with ledger.session() as s, s.begin():
        for k, pose in enumerate(poses):
            aid = hashlib.sha256(f"c{k}".encode()).hexdigest()
            s.add(
                AttemptRow(
                    attempt_id=aid,
                    cell_id=f"t{k}|race=A",
                    attempt_no=1,
                    seed=0,
                    backend="x",
                    lineage={},
                    prompt="p",
                    status="ok",
                    cost_usd=0.0,
                    calls=1,
                    meta={},
                )
            )
            s.add(
                CandidateRow(
                    attempt_id=aid,
                    cell_id=f"t{k}|race=A",
                    judge_key="k",
                    image_sha256=aid,
                    alignment={},
                    verdict="accepted" if pose < 4.8 else "rejected",
                    reasons=[],
                    gates=_gates(pose),
                )
            )
    try:
        plain = ReviewOptions(audit_accepted_rate=0.3, audit_rejected_rate=0.3)
        near = ReviewOptions(audit_accepted_rate=0.3, audit_rejected_rate=0.3, audit_near_threshold=0.25)
        random_share = {i.attempt_id for i in review_queue(ledger, plain)}
        items = review_queue(ledger, near)
        assert {i.attempt_id for i in items if i.random} == random_share  # the random share is kept
        added = [i for i in items if i.random is False]
        assert added and all(i.attempt_id not in random_share for i in added)
        pose_of = {hashlib.sha256(f"c{k}".encode()).hexdigest(): p for k, p in enumerate(poses)}
        assert {pose_of[i.attempt_id] for i in added} <= {4.4, 5.2}  # only those near 4.8
        assert len(added) == sum(1 for a, p in pose_of.items() if p in (4.4, 5.2) and a not in random_share)
        records = review_records(ledger, near, [i.attempt_id for i in items])
        assert {r["random"] for r in records.values()} == {True, False}
        assert "random" not in next(iter(review_records(ledger, plain, random_share).values()))
    finally:
        ledger.close()
