"""Scheduled regeneration: ``counterfactory schedule SPEC --out OUT --cron "..."`` (or ``--interval``).

The command creates a Prefect deployment of :func:`regenerate_flow` with the schedule and
serves it from its own process until Ctrl-C (Prefect's ``serve``; on shutdown the schedule is
paused, so runs do not pile up while nobody serves them). Prefect's scheduler creates the runs,
so the server needs its background services: a server the user runs (``PREFECT_API_URL``), or,
without one, a server in the command's own process (:func:`~counterfactory.flows.server.prefect_api`
with ``services=True``), which ends with it.

Each scheduled run:

1. runs the spec into ``OUT`` like ``counterfactory run`` (the same flow, as a subflow): an
   attempt whose inputs did not change is in the ledger and is not paid for again;
2. reads every cell's outcome from the ledger and compares the release it would make with the
   newest version already in ``OUT/releases/<name>/`` (:func:`release_changes`: the spec file, the
   sources and strata left out, and every item row: ids, verdict, reasons, image sha256, editor
   lineage, prompt, alignment, gate metrics, reviews);
3. publishes the next version only when something differs (and never when a cell has no attempt
   at all: the inputs changed after the run planned its grid, so the next run decides) (the spec's ``release.version`` for
   the first one, then the next patch version, or the spec's version when it was raised past the
   newest), with ``diff.json`` inside it: why it was published and the items added, removed and
   changed since the previous version (:func:`~counterfactory.validation.release_diff.diff_releases`);
4. appends one line to ``OUT/schedule.jsonl`` (run id, times, editor calls, version published or
   none, the changes; or the error of a run that failed) and shows the same as a Prefect
   markdown artifact.

Runs never overlap: the deployment allows one run at a time and a tick that comes while one is
running is cancelled by the server (the next tick catches up), and the run holds ``OUT``'s lock.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

from counterfactory.flows.artifacts import artifact_key  # noqa: E402
from counterfactory.flows.engine.run_folder import RunFolder  # noqa: E402
from counterfactory.flows.retries import RETRIES, RETRY_DELAYS_S, retry_transient  # noqa: E402
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.release_folder import is_release

DIFF = "diff.json"
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$")


class ScheduleError(CounterfactoryError, ValueError):
    """A schedule that cannot be served; the message says how to write a valid one."""


def make_schedule(*, cron: str | None = None, interval: float | None = None, timezone: str | None = None):
    """A Prefect schedule from ``cron`` (five fields, e.g. ``"0 3 * * *"``) or ``interval``
    (seconds > 0), validated as Prefect's server validates it.

    Raises:
        ScheduleError: neither or both given, a cron that does not parse, an unknown timezone,
            or an interval that is not a positive number of seconds.
    """
    from datetime import timedelta

    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
    from prefect.schedules import Cron, Interval
    from pydantic import ValidationError

    if (cron is None) == (interval is None):
        raise ScheduleError("give exactly one of --cron EXPRESSION or --interval SECONDS")
    if cron is not None:
        try:
            CronSchedule(cron=cron, timezone=timezone)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ScheduleError(
                f"--cron {cron!r} does not parse ({reason}); a cron expression has five fields: minute hour "
                "day-of-month month day-of-week, e.g. '0 3 * * *' for 03:00 every day or '*/15 * * * *' for every "
                "15 minutes"
                + (f"; --timezone takes an IANA name such as 'Europe/Berlin' (got {timezone!r})" if timezone else "")
            ) from None
        return Cron(cron, timezone=timezone)
    if not interval or interval <= 0:
        raise ScheduleError(f"--interval {interval!r}: a positive number of seconds, e.g. 86400 for once a day")
    try:
        IntervalSchedule(interval=timedelta(seconds=interval), timezone=timezone)
    except ValidationError as exc:
        raise ScheduleError(f"--timezone {timezone!r}: {exc.errors()[0]['msg']}; use an IANA name") from None
    return Interval(timedelta(seconds=interval), timezone=timezone)


# --------------------------------------------------------------------------- versions


def _version_key(version: str) -> tuple[int, int, int] | None:
    match = _VERSION.fullmatch(version)
    return tuple(int(g) for g in match.groups()) if match else None  # type: ignore[return-value]


def latest_release(releases_dir: Path, name: str) -> Path | None:
    """The newest sealed version folder of release ``name`` (by semantic version), or None."""
    folder = Path(releases_dir) / name
    if not folder.is_dir():
        return None
    versions = [
        (key, p)
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and is_release(p)
        for key in [_version_key(p.name)]
        if key is not None
    ]
    return max(versions)[1] if versions else None


def next_version(previous: str | None, base: str) -> str:
    """The version a scheduled run publishes: ``base`` (the spec's) when there is no previous
    version or ``base`` is newer, else ``previous`` with its patch number raised."""
    if previous is None:
        return base
    prev, mine = _version_key(previous), _version_key(base)
    if prev is None:
        raise ScheduleError(f"release version {previous!r} is not X.Y.Z; a scheduled run cannot count past it")
    if mine is not None and mine > prev:
        return base
    return f"{prev[0]}.{prev[1]}.{prev[2] + 1}"


# --------------------------------------------------------------------------- what changed


class _DryStage:
    """What :func:`~counterfactory.flows.engine.release.build_items` needs of a stage, copying nothing:
    the item rows come out as the release would hold them."""

    def add_file(self, relative: str, source: Path, *, sha256: str | None = None) -> str:
        return relative


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    from counterfactory.manifests.release import dumps_line

    data = json.loads(dumps_line(row))
    # the expression labels are measured on the images, which the row's sha256 already fixes
    data.pop("expression", None)
    return data


def release_changes(
    spec,
    ws,
    prepared: Sequence[Any],
    failed: Sequence[Any],
    outcomes: Sequence[Any],
    grid: Any,
    previous: Path,
) -> list[str]:
    """What the release this ledger state would make differs in from the sealed ``previous``
    one; empty when it would hold the same items from the same spec file.

    Compared: the spec file's sha256, the sources and strata left out (failed, excluded, short),
    and every item row as ``items.jsonl`` holds it (ids, verdict, reasons, image and source
    sha256, source metadata, editor lineage and prompt, alignment, gate metrics, reviews).
    """
    from counterfactory.flows.engine.outcomes import cell_rows, completeness
    from counterfactory.flows.engine.release import build_items
    from counterfactory.manifests.release_folder import ITEMS, LEFT_OUT, RELEASE_JSON, ReleaseFolder

    changes = []
    sealed = ReleaseFolder(previous, need=(RELEASE_JSON, ITEMS))
    info = sealed.info
    if info.get("spec_sha256") != spec.as_written()[1]:
        changes.append("the spec file changed")
    new_rows = {r["cell_id"]: _comparable(r) for r in build_items(spec, ws, prepared, outcomes, _DryStage())}
    old_rows = {r["cell_id"]: _comparable(r) for r in sealed.rows(ITEMS)}
    added = sorted(set(new_rows) - set(old_rows))
    removed = sorted(set(old_rows) - set(new_rows))
    changed = sorted(c for c in set(new_rows) & set(old_rows) if new_rows[c] != old_rows[c])
    if added or removed or changed:
        changes.append(f"items: {len(added)} added, {len(removed)} removed, {len(changed)} changed")
    _, left_out = completeness(cell_rows(ws, spec, outcomes), failed, grid)
    new_left = sorted(json.dumps(r, sort_keys=True) for r in left_out if r["what"] != "cell")
    old_left = sorted(
        json.dumps(r, sort_keys=True)
        for r in (sealed.rows(LEFT_OUT) if sealed.has(LEFT_OUT) else [])
        if r.get("what") != "cell"
    )
    if new_left != old_left:
        changes.append("the sources or strata left out changed")
    return changes


@dataclass(frozen=True)
class Regeneration:
    """What one scheduled run did."""

    #: the version sealed by this run, None when nothing changed
    published: str | None
    #: the newest version before this run
    previous: str | None
    release_path: str | None
    editor_calls: int
    changes: list[str] = field(default_factory=list)


def publish_if_changed(spec, out: str | Path, *, allow_incomplete: bool = False) -> Regeneration:
    """Seal the next version of ``spec``'s release (parsed, bound to ``out``) from the ledger in
    ``out`` when it would differ from the newest one (module docstring, steps 2-3); zero editor
    calls. The version it would seal is checked once
    (:func:`~counterfactory.flows.engine.release.check_release_version`).

    The caller holds ``out``'s lock. Raises what :func:`~counterfactory.flows.engine.release.publish_release`
    raises (an incomplete grid without ``allow_incomplete``, nothing to publish, ...).
    """
    from counterfactory.flows.engine.outcomes import collect_outcomes
    from counterfactory.flows.engine.release import check_release_version, publish_release, with_version
    from counterfactory.flows.engine.run_folder import open_workspace
    from counterfactory.flows.engine.sources import plan_grid, prepare_sources
    from counterfactory.manifests.release import write_json
    from counterfactory.validation.release_diff import diff_releases

    ws = open_workspace(spec, out)
    try:
        # with the store, each source check the run just kept is read back, not redone
        prepared, failed = prepare_sources(spec, ws.ledger, ws.store)
        grid = plan_grid(spec, prepared)
        outcomes = collect_outcomes(spec, ws, prepared, grid)
        previous = latest_release(ws.releases, spec.release.name)
        prev_version = previous.name if previous else None
        # a cell with no attempt at all: the photos, metadata or spec changed after this run
        # planned its grid; publishing now would seal cells nobody edited
        not_run = sum(1 for o in outcomes for c in o.cells if not c.attempt_ids)
        if not_run:
            return Regeneration(
                None, prev_version, None, 0,
                [f"inputs changed during this run ({not_run} cell(s) not run); the next run publishes"],
            )  # fmt: skip
        if previous is None:
            changes = [f"first version of {spec.release.name}"]
        else:
            changes = release_changes(spec, ws, prepared, failed, outcomes, grid, previous)
            if not changes:
                return Regeneration(None, prev_version, str(previous), 0, [])
        version = next_version(prev_version, spec.release.version)
        target = with_version(spec, version)
        check_release_version(target, ws.releases)

        def write_diff(stage: Path) -> None:
            if previous is None:
                return
            diff = diff_releases(previous, stage)
            diff["a"] = {"name": diff["a"]["name"], "version": diff["a"]["version"]}
            diff["b"] = {"name": spec.release.name, "version": version}
            write_json(stage / DIFF, {**diff, "changes": changes})

        sealed = publish_release(
            target, ws, prepared, failed, outcomes, grid, allow_incomplete=allow_incomplete,
            before_seal=write_diff,
        )  # fmt: skip
        return Regeneration(version, prev_version, str(sealed.path), 0, changes)
    finally:
        ws.ledger.close()


@task(name="publish-if-changed", cache_policy=NONE, retries=RETRIES, retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)  # fmt: skip
def publish_if_changed_task(spec, out: str, allow_incomplete: bool) -> Regeneration:
    return publish_if_changed(spec, out, allow_incomplete=allow_incomplete)


def _log_line(out: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to ``OUT/schedule.jsonl`` (one ``write`` of a whole line)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(RunFolder(out).schedule_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@flow(name="counterfactory-regenerate", log_prints=True)
def regenerate_flow(spec_path: str, out: str, workers: int = 2, allow_incomplete: bool = False) -> dict[str, Any]:
    """One scheduled run (module docstring): run the spec, then publish the next version only
    if something changed, with its diff. Returns :class:`Regeneration` as a dict."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.runtime import flow_run

    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.flows.resume import run_spec

    started = datetime.now(UTC).isoformat()
    spec = load_spec(spec_path)
    spec.bind_run_folder(out)
    base = {"flow_run_id": str(flow_run.id) if flow_run.id else None, "started_at": started}
    try:
        with RunFolder(out).lock():
            # the run's one entry point, under the lock this flow holds through its publish
            summary = run_spec(spec, out, workers=workers, progress=False, locked=True)
            result = publish_if_changed_task(spec, out, allow_incomplete)
    except Exception as exc:
        # a failed run is a line too (an incomplete grid, a folder another run holds, ...)
        _log_line(Path(out), {**base, "finished_at": datetime.now(UTC).isoformat(), "published": None,
                              "error": f"{type(exc).__name__}: {exc}"[:2000]})  # fmt: skip
        raise
    result = Regeneration(**{**asdict(result), "editor_calls": summary.editor_calls})
    record = {
        **base,
        "finished_at": datetime.now(UTC).isoformat(),
        "spec_sha256": spec.as_written()[1],
        **asdict(result),
    }
    _log_line(Path(out), record)
    if result.published:
        text = f"published **{result.published}** ({result.release_path}): " + "; ".join(result.changes)
    else:
        text = f"nothing changed since {result.previous}; no version published"
    create_markdown_artifact(
        f"# {spec.release.name}\n\n{text}\n\neditor calls: {result.editor_calls}\n",
        key=artifact_key(spec.name, "regeneration"),
        description="what this scheduled run published",
    )
    return asdict(result)


def serve_schedule(
    spec,
    out: str | Path,
    schedule,
    *,
    workers: int = 2,
    allow_incomplete: bool = False,
    name: str | None = None,
) -> None:
    """Create the deployment ``counterfactory-regenerate/<name>`` (default: the spec's name)
    with ``schedule`` and serve it until interrupted; see the module docstring. ``spec``: the
    parsed spec (the command line's), or its file; each scheduled run parses the file once.

    Without ``PREFECT_API_URL`` a Prefect server with its scheduler runs in this process for
    as long as it serves.
    """
    from prefect import serve
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from counterfactory.flows.engine.spec import Spec, load_spec
    from counterfactory.flows.server import prefect_api
    from counterfactory.flows.stopping import end_descendants, install_serve_stop_handler

    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    spec_path, out = spec.source_path, Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seconds = _schedule_seconds(schedule)
    with prefect_api(services=True):
        deployment = regenerate_flow.to_deployment(
            name=name or spec.name,
            schedule=schedule,
            parameters={
                "spec_path": str(spec_path),
                "out": str(out),
                "workers": workers,
                "allow_incomplete": allow_incomplete,
            },
            # one run at a time: a tick while a run is going is cancelled, the next one catches up
            concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
            description=f"regenerate {spec.release.name} from {spec_path} into {out}",
        )
        # poll often enough for short intervals, at most every 10 s
        query_s = max(1.0, min(10.0, seconds / 2)) if seconds else 10.0
        install_serve_stop_handler()
        try:
            serve(deployment, query_seconds=query_s, print_starting_message=True)
        finally:
            # Prefect's shutdown can leave a run's process behind; nothing outlives the command
            end_descendants()


def _schedule_seconds(schedule) -> float | None:
    interval = getattr(schedule, "interval", None)
    return interval.total_seconds() if interval is not None else None
