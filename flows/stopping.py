"""Ctrl-C and SIGTERM stop a command-line run at once, losing only the edits in flight.

Every finished edit is already committed to the ledger and the store (written to a temporary
name, then renamed), so leaving at once is as safe as a kill, and quick: letting Prefect wind
the flow down took over a minute and printed a wall of connection errors, and during a long
template SIGTERM did nothing visible. Prefect's API server is a thread of this process
(:mod:`counterfactory.flows.server`) and ends with it.

Prefect swaps its own SIGTERM handler in while a flow runs; the flow re-installs ours first
thing (:func:`reinstall_stop_handlers`), so the command line keeps this behaviour throughout.
The Python API is left alone unless it asks for it.

Paid requests still waiting at fal are cancelled first (bounded to a few seconds), as they
would otherwise run on and bill; each one fal agrees to cancel is journalled ``cancelled``,
and the next run fetches it if it finished anyway, or submits that same attempt again.
"""

from __future__ import annotations

import os
import signal
import threading

from counterfactory.generation.editors.fal_queue import cancel_open_requests

#: Seconds the stop may spend cancelling paid requests in flight before the process exits.
CANCEL_BUDGET_S = 3.0

_installed = False


def _stop(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    cancelled = cancel_open_requests(CANCEL_BUDGET_S)
    note = f"cancelled {len(cancelled)} paid fal request(s) in flight; " if cancelled else ""
    message = f"\n{name}: stopped; {note}finished edits are saved in the ledger: run the same command to resume\n"
    os.write(2, message.encode())
    os._exit(128 + signum)


def install_stop_handlers() -> None:
    """Make SIGINT and SIGTERM end the process at once with ``128 + signal`` (main thread only)."""
    global _installed
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    _installed = True


def reinstall_stop_handlers() -> None:
    """Put the handlers back after Prefect replaced them (no-op unless installed before)."""
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
