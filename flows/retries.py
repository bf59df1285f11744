"""Which task failures Prefect retries: transient ones only.

A task is retried only when its exception is one that can pass by itself: a network or
timeout error on the way to a server (fal, the Hub, a Postgres ledger), or a database that
was busy or dropped the connection. Bad input (a spec, a photo, a model that is missing), a
refused release and a gate's verdict never are: the same inputs would fail the same way, and a
gate's verdict is a value, not an exception. A retried template pays for nothing twice: every
finished attempt is in the ledger and is skipped (:func:`~counterfactory.flows.engine.execute.run_edits`).
"""

from __future__ import annotations

from typing import Any

#: seconds before each retry of a task that failed transiently (the last repeats)
RETRY_DELAYS_S = [5.0, 30.0]
#: how many times a task is retried after a transient failure
RETRIES = len(RETRY_DELAYS_S)

#: substrings of a database driver's message that mean "try again later"
_TRANSIENT_DB_MESSAGES = (
    "database is locked",
    "database is busy",
    "could not connect",
    "connection refused",
    "connection reset",
    "server closed the connection",
    "terminating connection",
    "connection timed out",
    "timeout expired",
    "the database system is starting up",
    "the database system is shutting down",
)


def _never_retried() -> tuple[type[BaseException], ...]:
    """Errors that say the input or the setup is wrong: retrying cannot help."""
    from counterfactory.flows.engine.outcomes import PublishError
    from counterfactory.manifests.errors import SetupError
    from counterfactory.manifests.ledger import LedgerError
    from counterfactory.manifests.release import ReleaseExistsError, ReleaseIntegrityError
    from counterfactory.manifests.runlock import RunFolderError
    from counterfactory.manifests.spec import SpecError
    from counterfactory.manifests.store import DamagedBlobError

    return (
        SetupError,
        SpecError,
        PublishError,
        LedgerError,
        ReleaseExistsError,
        ReleaseIntegrityError,
        RunFolderError,
        DamagedBlobError,
    )


def _transient_one(exc: BaseException) -> bool:
    import httpx
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError):
        message = str(exc.orig if exc.orig is not None else exc).lower()
        return any(m in message for m in _TRANSIENT_DB_MESSAGES)
    return False


def is_transient(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a transient failure worth a retry.

    An error that says the input or the setup is wrong (``SetupError``, ``SpecError``,
    ``PublishError``, ...) is never transient, whatever it was raised from.
    """
    if exc is None or isinstance(exc, _never_retried()):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _transient_one(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry the task only when it failed transiently."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            exc = state.result(raise_on_failure=False)
        except Exception:  # noqa: BLE001 - an unreadable state is not a reason to retry
            return False
    return isinstance(exc, BaseException) and is_transient(exc)
