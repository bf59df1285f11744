"""The ``counterfactory`` command line. Each command calls the same functions as the Python API."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from counterfactory.flows.cli_common import fail
from counterfactory.flows.cli_release import release, verify
from counterfactory.flows.cli_score import ask, score
from counterfactory.flows.stopping import install_stop_handlers
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.validation.quiet import silence_native_logs

# Prefect's console logging would drown the progress bar; its temporary server's telemetry
# logs database-lock errors. Both can be overridden from the environment.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


class _Commands(click.Group):
    """The command group, and the one place a counterfactory error becomes a message.

    Any :class:`~counterfactory.manifests.errors.CounterfactoryError` a command (or a command
    of a nested group) raises ends the process with ``error: <message>`` on stderr and exit
    status 2, without a traceback; every other exception is a bug and keeps its traceback. A
    command catches an error itself only to add context or to choose another exit status.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CounterfactoryError as exc:
            fail(str(exc))


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--verbose",
    is_flag=True,
    help="Let MediaPipe, TFLite, absl, OpenCV and the run's own Prefect server log to stderr (hidden by default).",
)
def main(verbose: bool) -> None:
    """counterfactory: counterfactual image stimuli, edited, aligned, measured and released."""
    # before any command imports those libraries (they read their switches when they load)
    silence_native_logs(verbose_=verbose)


# the commands that act on a sealed release, and the model-answering ones, live in modules of
# their own; the group reports their errors like its own (_Commands)
for _command in (verify, ask, score, release):
    main.add_command(_command)


def _digest_line(release: Path) -> str:
    """``digest: <sha256 of release.json>``: what ``verify --expect`` checks a copy against."""
    from counterfactory.manifests.release import release_digest

    return f"digest: {release_digest(release)} (record it; `counterfactory verify RELEASE --expect DIGEST`)"


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Output folder (ledger, store, releases)."
)
@click.option("--workers", default=2, show_default=True, help="Templates processed at a time.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--publish", "publish", is_flag=True, help="Seal the release under OUT/releases/ when the run ends.")
@click.option(
    "--allow-incomplete", is_flag=True, help="With --publish: seal even if cells, sources or strata are missing."
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run edits and gates on a Ray cluster: HOST:PORT, ray://HOST:PORT, auto, or local "
    "(a Ray instance on this machine for the run). Default: the spec's run.ray.",
)
def run(
    spec_path: Path,
    out: Path,
    workers: int,
    no_progress: bool,
    publish: bool,
    allow_incomplete: bool,
    ray_address: str | None,
) -> None:
    """Run SPEC_PATH: edit, align, measure and judge every cell into OUT (resumable).

    With --publish, also seal the release (as `counterfactory publish OUT` would).
    """
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.generation.sources import load_metadata
    from counterfactory.manifests.errors import SetupError

    install_stop_handlers()
    # every file the spec names is checked here, before anything is run or paid for; the run
    # gets the parsed spec (parsed once), and checks its release version once
    spec = load_spec(spec_path)
    spec.bind_run_folder(out)
    load_metadata(spec.sources.metadata)

    def check_setup(spec, on_ray: bool) -> None:
        # Fail on a missing model, key or GPU before the flow starts or anything is paid for
        # (a re-run whose cells are all settled needs neither, and skips this). On Ray the
        # editor loads on a GPU node of the cluster, which checks it there before any work.
        from counterfactory.flows.engine.execute import build_editor, build_gate_stack

        for view in spec.editor_views():
            try:
                if not on_ray:
                    build_editor(view)
            except SetupError as exc:
                named = f" ({view.editor_name})" if view.editor_name else ""
                fail(f"editor backend {view.editor.backend!r}{named} cannot run: {exc}")
        try:
            build_gate_stack(spec)
        except SetupError as exc:
            fail(f"the gates cannot run: {exc}")

    # Prefect is imported only when there is work to do (a settled re-run never starts it)
    from counterfactory.flows.resume import run_spec

    started = time.perf_counter()
    summary = run_spec(
        spec,
        out,
        workers=workers,
        progress=not no_progress,
        publish=publish,
        allow_incomplete=allow_incomplete,
        ray=ray_address,
        check_setup=check_setup,
    )
    if summary.missing_outputs:
        click.echo(
            f"note: {summary.missing_outputs} finished edit(s) had lost their image from the image store; "
            "only those attempts were run again",
            err=True,
        )
    if summary.templates == 0:
        click.echo(
            "warning: no source could serve the design, so the release has no items; "
            "see its stats.json for each source's reason",
            err=True,
        )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())) or "no cells"
    click.echo(f"cells: {counts}")
    click.echo(
        f"templates complete: {summary.complete_templates}/{summary.templates}; failed sources: {summary.failed_sources}"
    )
    # an import of 12 rows read "editor calls: 14" and nothing said that its two sources' noise-floor
    # requests were two of them
    floors = (
        f' ({summary.floor_calls} of them noise-floor requests, "return this photo unchanged", one per source photo)'
        if summary.floor_calls
        else ""
    )
    click.echo(f"editor calls: {summary.editor_calls}{floors}")
    if summary.settled:
        click.echo("nothing to run: every cell was already settled in the ledger")
    if summary.release_path is None:
        click.echo(f"not published: seal a release with `counterfactory publish {out}` (or run with --publish)")
    else:
        waiting = json.loads((summary.release_path / "stats.json").read_text()).get("review", {}).get("waiting")
        if waiting and waiting["total"]:
            groups = ", ".join(f"{k} {v}" for k, v in waiting["by_group"].items())
            click.echo(
                f"waiting for review: {waiting['total']} item(s) ({groups}); they are in items.jsonl, not the "
                f"manifest: counterfactory review serve {out}"
            )
        state = "written" if summary.release_created else "unchanged (identical release already existed)"
        click.echo(f"release {state}: {summary.release_path}")
        click.echo(_digest_line(summary.release_path))
        click.echo(f"report: {summary.release_path / 'report.html'}")
    click.echo(f"time: {time.perf_counter() - started:.1f} s")


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Output folder (ledger, store, releases)."
)
@click.option("--cron", metavar="EXPRESSION", help="When to run: a cron expression, e.g. '0 3 * * *' (03:00 daily).")
@click.option("--interval", type=float, metavar="SECONDS", help="When to run: every SECONDS seconds.")
@click.option("--timezone", metavar="IANA_NAME", help="The cron's timezone, e.g. Europe/Berlin (default UTC).")
@click.option("--workers", default=2, show_default=True, help="Templates processed at a time in each run.")
@click.option("--allow-incomplete", is_flag=True, help="Publish even if cells, sources or strata are missing.")
@click.option("--name", "name", help="Deployment name (default: the spec's name).")
def schedule(
    spec_path: Path,
    out: Path,
    cron: str | None,
    interval: float | None,
    timezone: str | None,
    workers: int,
    allow_incomplete: bool,
    name: str | None,
) -> None:
    """Regenerate SPEC_PATH into OUT on a schedule, served by this command until Ctrl-C.

    Each run resumes the spec (an attempt whose inputs did not change is not paid for again),
    then publishes the next release version only if something changed, with diff.json against
    the previous version inside it, and appends a line to OUT/schedule.jsonl. Uses the Prefect
    server PREFECT_API_URL names, or runs one in this process.
    """
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.flows.schedule import make_schedule
    from counterfactory.generation.sources import load_metadata
    from counterfactory.manifests.errors import SetupError

    when = make_schedule(cron=cron, interval=interval, timezone=timezone)
    spec = load_spec(spec_path)
    spec.bind_run_folder(out)
    load_metadata(spec.sources.metadata)
    try:
        # a missing model, key or GPU stops here, not at the first tick
        from counterfactory.flows.engine.execute import build_editor, build_gate_stack

        build_editor(spec)
        build_gate_stack(spec)
    except SetupError as exc:
        fail(f"the spec cannot run here: {exc}")

    from counterfactory.flows.engine.run_folder import SCHEDULE_LOG
    from counterfactory.flows.schedule import serve_schedule

    click.echo(f"scheduled runs of {spec_path} into {out}; log: {out / SCHEDULE_LOG} (Ctrl-C stops)")
    serve_schedule(spec, out, when, workers=workers, allow_incomplete=allow_incomplete, name=name)


@main.command()
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--version", "version", help="Release version X.Y.Z (default: the spec's release.version).")
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="The spec to publish (default: the last run in OUT)."
)
@click.option("--allow-incomplete", is_flag=True, help="Seal even if cells, sources or strata are missing.")
def publish(out: Path, version: str | None, spec_path: Path | None, allow_incomplete: bool) -> None:
    """Seal a release from OUT's ledger and store, with zero editor calls.

    Reports accepted, undecided (needs_review) and unfilled cells per group, and refuses an
    incomplete grid unless --allow-incomplete is given (the release then lists what was left
    out, and why, in left_out.jsonl).
    """
    import hashlib

    from pydantic import ValidationError

    from counterfactory.flows.engine.outcomes import format_completeness
    from counterfactory.flows.engine.release import publish_from_ledger, with_version
    from counterfactory.flows.engine.run_folder import LEDGER_FILE, RunFolder
    from counterfactory.flows.engine.spec import load_spec

    if spec_path is None:
        spec_path, ran_sha = RunFolder(out).recorded_spec()
        if not spec_path.is_file() or hashlib.sha256(spec_path.read_bytes()).hexdigest() != ran_sha:
            fail(
                f"{spec_path}: the spec that ran in {out} is missing or was edited since; publish it "
                "explicitly with --spec PATH (cells the edited spec plans differently show as not run)"
            )
    spec = load_spec(spec_path)
    spec.bind_run_folder(out)
    try:
        spec = with_version(spec, version)
    except ValidationError as exc:  # only the version is validated here
        expected = exc.errors()[0]["msg"].removeprefix("Value error, ")
        fail(f"--version {version!r}: expected {expected}")
    if not RunFolder(out).ledger_file.exists() and spec.ledger_url is None:
        fail(f"{out}: no {LEDGER_FILE} here; run `counterfactory run {spec_path} --out {out}` first")
    result = publish_from_ledger(spec, out, allow_incomplete=allow_incomplete)
    click.echo(format_completeness(result.report, result.left_out))
    state = "written" if result.sealed.created else "unchanged (identical release already existed)"
    click.echo("editor calls: 0")
    click.echo(f"release {state}: {result.sealed.path}")
    click.echo(_digest_line(result.sealed.path))


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option(
    "--sam",
    "checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    help="Segment Anything checkpoint (.pth), e.g. sam_vit_b_01ec64.pth.",
)
@click.option("--model-type", default="vit_b", show_default=True, help="SAM model type matching the checkpoint.")
@click.option("--device", default=None, help="cuda, cuda:N or cpu [default: CUDA when available].")
@click.option("--force", is_flag=True, help="Redraw masks already stored (hand corrections are lost).")
def masks(spec_path: Path, checkpoint: Path, model_type: str, device: str | None, force: bool) -> None:
    """Draw the limb masks SPEC_PATH's metadata asks SAM for, and store them for runs.

    A source record asks with `limb_mask: {sam: {box: [x0, y0, x1, y1]}}` (and/or `points` and
    `point_labels`). Each mask is written once as a PNG under the photos folder's sam_masks/,
    which runs read like a mask file: edits depend on the stored pixels, not on SAM. Stored
    masks are kept (correct them by hand if needed) unless --force.
    """
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.generation.masks_sam import store_sam_masks
    from counterfactory.manifests.vocabulary import FAILED

    spec = load_spec(spec_path)
    stored = store_sam_masks(
        spec.sources.photos,
        spec.sources.metadata,
        checkpoint=checkpoint,
        model_type=model_type,
        device=device,
        force=force,
        max_pixels=spec.sources.max_pixels,
    )
    if not stored:
        fail(f"{spec.sources.metadata}: no source asks for a SAM mask (limb_mask: {{sam: {{box: [x0, y0, x1, y1]}}}})")
    for item in stored:
        if item.status == FAILED:
            click.echo(f"{item.source_id}: failed: {item.reason}")
            continue
        warn = "  (empty: check the prompt)" if not item.inside_share else ""
        click.echo(f"{item.source_id}: {item.status} {item.path} ({item.inside_share:.1%} of the photo){warn}")
    failed = sum(item.status == FAILED for item in stored)
    click.echo(f"SAM masks: {len(stored) - failed} stored, {failed} failed")
    if failed:
        sys.exit(1)


@main.command()
@click.argument("source", type=click.Path(path_type=Path), required=False)
@click.argument("candidate", type=click.Path(path_type=Path), required=False)
@click.option(
    "--batch",
    "table",
    type=click.Path(path_type=Path),
    help="Measure every pair of this table (CSV, JSONL or Parquet: source, candidate, optional id and "
    "mask, condition columns; paths relative to the table's folder) instead of SOURCE CANDIDATE.",
)
@click.option("--mask", type=click.Path(path_type=Path), help="Edit mask (limb region) image; makes this a limb pair.")
@click.option("--kind", type=click.Choice(["face", "limb"]), help="Edit kind (default: limb with --mask, else face).")
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="Take gate and alignment settings from this spec."
)
@click.option(
    "--floor",
    "floor_path",
    type=click.Path(path_type=Path),
    help="The editor's output for 'return this photo unchanged' of SOURCE: judge locality above it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with --batch: one object per pair, JSONL).")
@click.option(
    "--diagnostics",
    is_flag=True,
    help="Also measure a composited pair's registered output before compositing (locality.raw_*); "
    "no rule judges these.",
)
def measure(
    source: Path | None,
    candidate: Path | None,
    table: Path | None,
    mask: Path | None,
    kind: str | None,
    spec_path: Path | None,
    floor_path: Path | None,
    as_json: bool,
    diagnostics: bool,
) -> None:
    """Align CANDIDATE to SOURCE and print every gate's metrics (audit any counterfactual pair).

    With --batch TABLE, every pair of the table: one line per pair (id, verdict, reasons) and a
    summary (counts per verdict, and per value of each condition column); a pair whose file is
    missing or unreadable is a `failed` line with the reason, and the batch goes on.
    """
    from counterfactory.flows.audit import measure_pair

    if table is not None:
        if source is not None or candidate is not None or mask is not None or floor_path is not None:
            fail("--batch TABLE takes no SOURCE, CANDIDATE, --mask or --floor (the table names them per pair)")
        _measure_batch(table, kind=kind, spec_path=spec_path, as_json=as_json, diagnostics=diagnostics)
        return
    if source is None or candidate is None:
        fail("give SOURCE and CANDIDATE, or --batch TABLE")
    report = measure_pair(
        source,
        candidate,
        mask_path=mask,
        kind=kind,
        spec_path=spec_path,
        floor_path=floor_path,
        diagnostics=diagnostics,
    )
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
        return
    click.echo(f"verdict: {report['verdict']}" + (f"  ({', '.join(report['reasons'])})" if report["reasons"] else ""))
    click.echo(f"floor: {report.get('floor_path') or 'not measured'}")
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}")
    align = report["alignment"]
    click.echo(
        f"alignment: ok={align['ok']} scale={align['scale']} rotation={align['rotation_deg']}° "
        f"shift={align['shift_px']} residual_px={align['residual_px']} correlation={align['correlation']}"
    )
    for gate, result in report["gates"].items():
        codes = list(result["reasons"]) + [f"review: {c}" for c in result.get("review", [])]
        click.echo(f"[{gate}] {'pass' if result['passed'] else 'FAIL'}" + (f"  {', '.join(codes)}" if codes else ""))
        for name, value in result["metrics"].items():
            click.echo(f"    {name:28s} {value}")


def _measure_batch(
    table: Path, *, kind: str | None, spec_path: Path | None, as_json: bool, diagnostics: bool = False
) -> None:
    """``measure --batch``: a line (or JSON object) per pair as it is measured, then the summary."""
    from counterfactory.flows.audit import measure_batch, summarise_batch

    reports = []
    for report in measure_batch(table, spec_path=spec_path, kind=kind, diagnostics=diagnostics):
        reports.append({k: report[k] for k in ("verdict", "condition")})
        if as_json:
            click.echo(json.dumps(report, sort_keys=True, default=str))
            continue
        detail = [report["error"]] if "error" in report else list(report["reasons"])
        detail += [f"warning: {w}" for w in report.get("warnings", [])]
        floor = f"floor={report.get('floor_path') or '-'}"
        click.echo(f"{report['id']}\t{report['verdict']}" + (f"\t{'; '.join(detail)}" if detail else "") + f"\t{floor}")
    summary = summarise_batch(reports)
    if as_json:
        click.echo(json.dumps({"summary": summary}, sort_keys=True), err=True)
        return
    counts = ", ".join(f"{verdict} {n}" for verdict, n in summary["verdicts"].items())
    click.echo(f"summary: {summary['pairs']} pairs: {counts}")
    for column, values in summary["by_condition"].items():
        for value, verdicts in values.items():
            counts = ", ".join(f"{verdict} {n}" for verdict, n in verdicts.items())
            click.echo(f"  {column}={value}: {counts}")


@main.command()
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path),
    help="Folder for calibration.json and plots (with --from-review: calibration.json and report.json; "
    "default RUN_DIR/review-calibration).",
)
@click.option(
    "--from-review",
    "from_review",
    type=click.Path(path_type=Path),
    help="Fit the thresholds from the reviewers' first votes on this run folder's review (no editor call, "
    "nothing measured again), held out by source; writes a calibration a spec pins with gates.calibration.",
)
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(path_type=Path),
    help="Also measure this spec's sources (with --from-review: the run's spec, if it recorded none).",
)
@click.option(
    "--failures",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Failure-corpus variants per class and photo (odd ones held out); 0: no-op rules only.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Failure-corpus seed.")
@click.option(
    "--target",
    type=click.FloatRange(0.5, 1.0, max_open=True),
    default=0.95,
    show_default=True,
    help="Good-edit acceptance the corpus thresholds keep on the training split.",
)
@click.option(
    "--london",
    "london",
    type=click.Path(path_type=Path, file_okay=False),
    help="Also build the failure corpus from the Face Research Lab London Set in this folder "
    "(neutral/, smiling/, london_info.csv): split by person, with its real expression pairs.",
)
@click.option(
    "--london-people", type=click.IntRange(min=2), default=None, help="Use this many of its people (all by default)."
)
@click.option(
    "--london-per-class",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Variants per class and person.",
)
@click.option(
    "--london-side", type=click.IntRange(min=128), default=384, show_default=True, help="Its photos' long side, pixels."
)
def calibrate(
    out: Path | None,
    from_review: Path | None,
    spec_path: Path | None,
    failures: int,
    seed: int,
    target: float,
    london: Path | None,
    london_people: int | None,
    london_per_class: int,
    london_side: int,
) -> None:
    """Measure the no-op ceiling and different-person floor; with --failures, build the
    failure-mode corpus, set the face-edit thresholds from it and report the held-out
    good-edit acceptance and per-class catch rates."""
    if from_review is not None:
        from counterfactory.flows.pilot import calibrate_run

        if failures or london is not None:
            fail("--from-review fits the thresholds from a run's review; leave out --failures and --london")
        for line in calibrate_run(from_review, out, spec_path)[1]:
            click.echo(line)
        return
    if out is None:
        fail("calibrate needs --out DIR (or --from-review RUN_DIR)")
    from counterfactory.validation.calibration.base import bundled_photo_paths
    from counterfactory.validation.calibration.calibrate import run_calibration
    from counterfactory.validation.calibration.photo_sets import london_set

    sets = []
    if london is not None:
        if failures == 0:
            fail("--london adds people to the failure corpus: give --failures N too")
        sets.append(
            london_set(london, people=london_people, per_class=london_per_class, max_side=london_side, seed=seed)
        )

    paths = bundled_photo_paths()
    if spec_path is not None:
        from counterfactory.flows.engine.spec import load_spec
        from counterfactory.generation.sources import load_metadata

        spec = load_spec(spec_path)
        paths += [spec.sources.photos / r.path for r in load_metadata(spec.sources.metadata)]
    result = run_calibration(sorted(set(paths)), out, failures=failures, seed=seed, target=target, photo_sets=sets)
    click.echo(json.dumps(result.get("suggested", result), indent=2, sort_keys=True, default=str))
    corpus = result.get("failures")
    if corpus is not None:
        by_set = corpus.get("heldout_by_set", {})
        click.echo("held-out split of the failure corpus (good: accepted; failures: rejected or sent to review):")
        for name, info in corpus["config"].get("photo_sets", {}).items():
            held = "half the people, balanced by group" if info["split_by"] == "person" else "odd variants"
            click.echo(
                f"  {name}: {info['photos']} photos of {info['people']} people at {info['max_side']} px; held out: {held}"
            )
        sets_shown = [n for n in by_set if by_set[n]]
        header = "".join(f"  {n:>16s}" for n in sets_shown) if len(sets_shown) > 1 else ""
        click.echo(f"  {'class':16s} {'n':>4s}  {'all':>14s}{header}")
        for label, rates in corpus["heldout"].items():
            rate = rates.get("acceptance", rates.get("caught"))
            kind = "accepted" if "acceptance" in rates else "caught"
            cells = ""
            if len(sets_shown) > 1:
                for n in sets_shown:
                    r = by_set[n].get(label)
                    cells += (
                        f"  {'-':>16s}"
                        if r is None
                        else f"  {r.get('acceptance', r.get('caught')):9.1%} (n={r['n']:3d})"
                    )
            click.echo(f"  {label:16s} {rates['n']:4d}  {kind} {rate:6.1%}{cells}")
        for group, labels in corpus.get("heldout_by_group", {}).items():
            good = labels.get("good")
            caught = [v["caught"] for k, v in labels.items() if "caught" in v]
            if good is not None:
                lowest = f"; lowest failure-class catch rate {min(caught):.1%}" if caught else ""
                click.echo(f"  group {group}: good edits accepted {good['acceptance']:.1%} (n={good['n']}){lowest}")
        click.echo(
            f"good-edit acceptance {corpus['good_acceptance_heldout']:.1%}; "
            f"lowest failure-class catch rate {corpus['min_caught_heldout']:.1%}"
        )
        for line in path_lines(corpus.get("heldout_by_path", {})):
            click.echo(line)
    click.echo(f"written: {out / 'calibration.json'}")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def path_lines(by_path: dict) -> list[str]:
    """The held-out figures of each judging path (floor request, cohort floor, none), as
    ``calibrate`` prints them: good edits per group and per direction with the largest gap,
    each failure class, identity swaps caught by the identity gate, real smiles caught by the
    expression gate."""
    lines = []
    for path, fig in by_path.items():
        classes = fig["classes"]
        good = classes.get("good", {})
        lines.append(
            f"judging path {path}: good edits accepted {_pct(good.get('acceptance'))} (n={good.get('n', 0)}); "
            f"lowest failure-class catch {_pct(fig['min_caught'])}; largest gap between groups "
            f"{_pct(fig['largest_group_gap'])}"
        )
        groups = ", ".join(f"{g or '-'} {_pct(v['acceptance'])} (n={v['n']})" for g, v in fig["good_by_group"].items())
        lines.append(f"  good by group: {groups}")
        directions = ", ".join(f"{d} {_pct(v['acceptance'])} (n={v['n']})" for d, v in fig["good_by_direction"].items())
        lines.append(f"  good by direction: {directions}")
        caught = ", ".join(f"{k} {_pct(v['caught'])}" for k, v in classes.items() if k != "good")
        lines.append(f"  caught: {caught}")
        lines.append(
            f"  identity swaps caught by the identity gate {_pct(fig['identity_swaps_caught_by_identity'])}; "
            f"real smiles caught by the expression gate {_pct(fig['real_smiles_caught_by_expression'])}"
        )
        if path == "request":  # the identity gate does not depend on the path: once
            overlap = ", ".join(
                f"{g or '-'} good >= {v['good_min']}, swaps <= {v['swap_max']} ({v['swaps_above_good_min']} above)"
                for g, v in fig.get("identity_overlap_by_group", {}).items()
            )
            lines.append(f"  identity cosine, good edits vs swaps per group: {overlap}")
    return lines


@main.group()
def review() -> None:
    """Human review: the web queue and its reviewers."""


#: where ``review serve`` listens unless told otherwise (``review add-reviewer`` prints its login page)
REVIEW_HOST, REVIEW_PORT = "127.0.0.1", 8765


def _review_setup(out: Path, spec_path: Path | None):
    from counterfactory.flows.engine.run_folder import LEDGER_FILE, RunFolder
    from counterfactory.manifests.release_folder import releases_under

    folder = RunFolder(out)
    if spec_path is None and not folder.ledger_file.exists() and not folder.recorded_spec_file.exists():
        if not releases_under(folder.releases, limit=1):
            fail(
                f"{out}: no run here (no {LEDGER_FILE}, no recorded spec, no release); pass the folder a "
                "`counterfactory run SPEC --out DIR` wrote"
            )
    spec = folder.spec_of_run(spec_path)
    return spec, RunFolder(out).ledger_url(spec)


@review.command("serve")
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="The run's spec (default: its newest release's)."
)
@click.option("--host", default=REVIEW_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", default=REVIEW_PORT, show_default=True, help="Port to listen on.")
def review_serve(out: Path, spec_path: Path | None, host: str, port: int) -> None:
    """Serve the review queue over OUT's ledger and image store."""
    from counterfactory.flows.review_app import serve  # SetupError without the review extra

    spec, _ = _review_setup(out, spec_path)
    click.echo(f"review site: http://{host}:{port}/login (Ctrl-C stops it)")
    serve(out, spec, host=host, port=port)


@review.command("add-reviewer")
@click.argument("name")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path, exists=True, file_okay=False), help="The run folder."
)
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="The run's spec (default: its newest release's)."
)
def review_add_reviewer(name: str, out: Path, spec_path: Path | None) -> None:
    """Register NAME as a reviewer and print their token (shown once; the ledger keeps only its hash),
    after the review site's sign-in page and the command that serves it. The token is the last line."""
    from counterfactory.manifests.ledger import Ledger
    from counterfactory.manifests.review import add_reviewer

    _, url = _review_setup(out, spec_path)
    ledger = Ledger(url)
    try:
        token = add_reviewer(ledger, name)
    finally:
        ledger.close()
    # the address goes in the browser, the token into its sign-in form (never into a URL, where
    # it would stay in the history and the server's logs)
    click.echo(f"review site: http://{REVIEW_HOST}:{REVIEW_PORT}/login once `counterfactory review serve {out}` runs")
    click.echo(f"{name}'s token (shown once; the ledger keeps only its sha256), to paste there:")
    click.echo(token)


@review.command("revoke-reviewer")
@click.argument("name")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path, exists=True, file_okay=False), help="The run folder."
)
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="The run's spec (default: its newest release's)."
)
def review_revoke_reviewer(name: str, out: Path, spec_path: Path | None) -> None:
    """Revoke NAME's token: it signs nobody in from now on (their decisions stay in the ledger)."""
    from counterfactory.manifests.ledger import Ledger
    from counterfactory.manifests.review import revoke_reviewer

    _, url = _review_setup(out, spec_path)
    ledger = Ledger(url)
    try:
        changed = revoke_reviewer(ledger, name)
    finally:
        ledger.close()
    click.echo(f"revoked {name}'s token" if changed else f"{name}'s token was already revoked")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per plug-in instead of a table.")
def plugins(as_json: bool) -> None:
    """List the registered editors, gates, trial protocols and release files: kind, name, where
    each comes from (a built-in module, or the distribution whose ``counterfactory.plugins``
    entry point added it) and what it declares (an editor's capabilities, a gate's order)."""
    from counterfactory.flows.engine.plugins import plugin_listing

    # a plug-in that fails to import raises PluginError, reported by the group's one handler
    for row in plugin_listing():
        if as_json:
            click.echo(json.dumps(row, sort_keys=True))
            continue
        declared = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("kind", "name", "origin"))
        click.echo(f"{row['kind']:15s} {row['name']:20s} {row['origin']}" + (f"  [{declared}]" if declared else ""))


if __name__ == "__main__":
    main()
