"""A small ledger with candidates in every verdict, for the review tests (no images needed)."""

from __future__ import annotations

from counterfactory.manifests.ledger import Ledger

CELLS = {
    # cell id -> verdicts of its attempts in order
    "biden|race=Black|gender=male": ["needs_review"],
    "biden|race=Black|gender=female": ["needs_review"],
    "biden|race=White|gender=male": ["accepted"],
    "grace|race=Black|gender=female": ["rejected", "accepted"],
    "grace|race=White|gender=female": ["rejected", "rejected"],
}


def attempt_id(cell_id: str, attempt_no: int) -> str:
    import hashlib

    return hashlib.sha256(f"{cell_id}#{attempt_no}".encode()).hexdigest()


def fill(ledger: Ledger, cells: dict[str, list[str]] = CELLS) -> dict[str, list[str]]:
    """Write attempts and candidates; returns cell id -> attempt ids."""
    out = {}
    for cell_id, verdicts in cells.items():
        ids = []
        for no, verdict in enumerate(verdicts, start=1):
            aid = attempt_id(cell_id, no)
            ledger.start_attempt(
                aid, cell_id=cell_id, attempt_no=no, seed=no - 1, backend="classical", lineage={}, prompt="p"
            )
            ledger.finish_attempt(aid, status="ok", output_sha256="0" * 64)
            ledger.record_candidate(
                aid,
                cell_id=cell_id,
                judge_key="k",
                image_sha256=aid,
                alignment={"ok": True},
                verdict=verdict,
                reasons=[]
                if verdict == "accepted"
                else ["face_low_confidence" if verdict == "needs_review" else "identity_drift"],
                gates={},
            )
            ids.append(aid)
        out[cell_id] = ids
    return out
