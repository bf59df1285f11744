"""Ctrl-C and SIGTERM stop a command-line run at once, losing only the edits in flight.

Every finished edit is already committed to the ledger and the store (written to a temporary
name, then renamed), so leaving at once is as safe as a kill, and quick: letting Prefect wind
the flow down took over a minute and printed a wall of connection errors, and during a long
template SIGTERM did nothing visible. Prefect's API server is a thread of this process
(:mod:`counterfactory.flows.server`) and ends with it.

Prefect swaps its own SIGTERM handler in while a flow runs; the flow re-installs ours first
thing (:func:`reinstall_stop_handlers`), so the command line keeps this behaviour throughout.
The Python API is left alone unless it asks for it.

Paid requests still in flight are cancelled first (bounded to a few seconds), as they would
otherwise run on and bill: each registered editor backend that declares a ``cancel_in_flight``
hook (:class:`~counterfactory.generation.editors.registry.EditorCapabilities`) is asked to. fal's
journals each request fal agrees to cancel as ``cancelled``, and the next run fetches it if it
finished anyway, or submits that same attempt again.
"""

from __future__ import annotations

import os
import signal
import threading

from counterfactory.generation.editors.registry import EDITORS
from counterfactory.validation.quiet import terminal_fd

#: Seconds the stop may spend cancelling paid requests in flight before the process exits.
CANCEL_BUDGET_S = 3.0

_installed = False


def cancel_in_flight(budget_s: float = CANCEL_BUDGET_S) -> dict[str, int]:
    """``{backend: requests cancelled}``: every registered backend's ``cancel_in_flight`` hook,
    sharing ``budget_s`` seconds (a backend not yet registered has sent nothing)."""
    import time

    deadline = time.monotonic() + budget_s
    out: dict[str, int] = {}
    for plugin in sorted(EDITORS.registered(), key=lambda p: p.name):
        hook = getattr(getattr(plugin, "capabilities", None), "cancel_in_flight", None)
        left = deadline - time.monotonic()
        if hook is None or left <= 0:
            continue
        cancelled = list(hook(left))
        if cancelled:
            out[plugin.name] = len(cancelled)
    return out


def _stop(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    cancelled = cancel_in_flight(CANCEL_BUDGET_S)
    note = "".join(f"cancelled {n} paid {backend} request(s) in flight; " for backend, n in cancelled.items())
    message = f"\n{name}: stopped; {note}finished edits are saved in the ledger: run the same command to resume\n"
    os.write(terminal_fd(), message.encode())
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


#: Seconds the runs a stopped ``schedule`` command started get to end after SIGTERM before SIGKILL.
CHILD_GRACE_S = 10.0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now, children first (read from ``/proc``; empty elsewhere)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        kids = [child for child, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def end_descendants(grace_s: float = CHILD_GRACE_S) -> int:
    """SIGTERM every process this one started, SIGKILL those still there after ``grace_s``;
    returns how many there were."""
    import time

    pids = descendants(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return len(pids)


#: Seconds a stopped ``schedule`` command gives Prefect's own shutdown (which pauses the
#: schedule) before it ends the runs it started and exits regardless.
SERVE_GRACE_S = 20.0

_serve_stopping = False


def _force_stop(signum: int, after_s: float) -> None:
    import time

    time.sleep(after_s)
    ended = end_descendants()
    note = f"ended {ended} process(es) of scheduled runs in flight; " if ended else ""
    message = f"\n{signal.Signals(signum).name}: stopped serving; {note}the next start resumes from the ledger\n"
    os.write(terminal_fd(), message.encode())
    os._exit(128 + signum)


def _stop_serving(signum: int, _frame: object) -> None:
    global _serve_stopping
    if _serve_stopping:  # a second Ctrl-C: no more waiting
        _force_stop(signum, 0.0)
    _serve_stopping = True
    threading.Thread(target=_force_stop, args=(signum, SERVE_GRACE_S), name="serve-stop", daemon=True).start()
    raise KeyboardInterrupt


def install_serve_stop_handler() -> None:
    """Make Ctrl-C end a serving ``schedule`` command within :data:`SERVE_GRACE_S`, with the
    runs it started.

    Ctrl-C first goes to Prefect's runner as usual (it pauses the schedule and winds down). That
    shutdown waits for the runs in flight, and a KeyboardInterrupt that lands inside its task
    group can be lost: in CI the command served eight more runs over two minutes after a
    SIGINT. So a watchdog ends the runs this process started and exits after the grace period
    (a second Ctrl-C: at once). A scheduled run is a resume, so ending it is as safe as a kill;
    the next start picks it up from the ledger. Main thread only.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_serving)
