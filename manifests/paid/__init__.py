"""Paid requests: one client interface, its journal and its spend cap, for every caller that
spends money on a remote service (the ``fal`` editor, the VLM attribute gate, ``ask``'s answer
backends). :mod:`~counterfactory.manifests.paid.base` is the interface (what a call, an answer,
a journal and a client are); :mod:`~counterfactory.manifests.paid.fal` is fal's queue API as
such a client (submit, poll, fetch, cancel), :mod:`~counterfactory.manifests.paid.direct` one
for services answered in one request (an OpenAI-compatible chat endpoint). Nothing here knows
who calls it: it sits in the bottom layer so that ``generation/`` and ``validation/`` reach it
without reaching each other.
"""

from __future__ import annotations

from counterfactory.manifests.paid.base import (
    CallStatus,
    MemoryJournal,
    PaidAnswer,
    PaidCall,
    PaidCallFailed,
    PaidClient,
    PaidJournal,
    PaidReading,
    Reader,
    SpendCap,
    SpendHold,
    backoff_delay,
    redact,
    run_sync,
)

__all__ = [
    "CallStatus",
    "MemoryJournal",
    "PaidAnswer",
    "PaidCall",
    "PaidCallFailed",
    "PaidClient",
    "PaidJournal",
    "PaidReading",
    "Reader",
    "SpendCap",
    "SpendHold",
    "backoff_delay",
    "redact",
    "run_sync",
]
