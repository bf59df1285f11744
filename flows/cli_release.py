"""The ``verify`` command and the ``release`` group (export, push, pull, diff): what is done to a
sealed release. :mod:`counterfactory.flows.cli` adds them to the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from counterfactory.flows.cli_common import fail


@click.command()
@click.argument("release", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--expect",
    "expect",
    metavar="SHA256",
    help="The release's digest (sha256 of its release.json, printed by publish) as recorded elsewhere: "
    "the release must be that one.",
)
def verify(release: Path, expect: str | None) -> None:
    """Check a release folder: every file against its checksum, release.json's record and the
    schema this package ships, every image against the sha256 its manifest row names, the
    derived files (stats.json, report.html, trials.jsonl) against what the release's tables
    give, only regular files, nothing unlisted, nothing outside the folder."""
    import re

    from counterfactory.flows.engine.verify import verify_release
    from counterfactory.manifests.release import release_digest
    from counterfactory.manifests.release_folder import not_a_release

    if expect is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", expect.strip()):
        fail(f"--expect {expect!r}: not a sha256 (64 hex digits); give the digest publish printed")
    why = not_a_release(release)  # a run folder: its releases in one line, not a problem per file
    if why is not None:
        fail(why)
    problems = verify_release(release, expect=expect)
    if problems:
        for p in problems:
            click.echo(p, err=True)
        fail(f"{release}: {len(problems)} problem(s)", code=1)
    click.echo(f"{release}: every file matches its checksum and schema")
    digest = release_digest(release)
    click.echo(f"digest: {digest}" + (" (as expected)" if expect is not None else ""))


@click.group()
def release() -> None:
    """Compare sealed releases; push them to and pull them from the Hugging Face Hub."""


def _hub_call(action, *args, **kwargs):
    """Run a push or pull. A transfer the Hub dropped part-way exits with status 1 (running the
    command again resumes it); bad input and refusals are the group's ``error:`` and status 2."""
    from counterfactory.manifests.hub import HubTransferError

    try:
        return action(*args, **kwargs)
    except HubTransferError as exc:
        fail(str(exc), code=1)


@release.command("export")
@click.argument("release_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", default="ORG/NAME", show_default=True, help="Repository the card points at.")
@click.option("--gated/--ungated", default=None, help="Put the access form in the card [default: as push].")
@click.option(
    "--harness",
    type=click.Choice(["hub", "lmms-eval", "vlmevalkit"]),
    default="hub",
    show_default=True,
    help="hub: the Hub dataset; lmms-eval: a task folder for --include_path; vlmevalkit: TSVs and a dataset class.",
)
def release_export(release_dir: Path, out_dir: Path, repo_id: str, gated: bool | None, harness: str) -> None:
    """Write the Hub dataset of RELEASE_DIR into OUT_DIR without uploading (load_dataset(OUT_DIR, "items")),
    or with --harness its trials as an lmms-eval task folder or VLMEvalKit dataset."""
    if out_dir.exists() and any(out_dir.iterdir()):
        fail(f"{out_dir}: not empty; export into a new folder")
    if harness != "hub":
        from counterfactory.manifests.harness import export_harness

        done = export_harness(release_dir, out_dir, harness)
        click.echo(f"exported {done.name} {done.version}'s trials for {harness} into {out_dir}:")
        for task, n in done.tasks.items():
            click.echo(f"  {task}: {n} trials")
        return
    from counterfactory.flows.engine.verify import export_release

    export = _hub_call(export_release, release_dir, out_dir, repo_id=repo_id, gated=gated)
    click.echo(f"exported {export.name} {export.version} ({export.licence.hub_id}) into {out_dir}:")
    for table in export.tables:
        click.echo(f"  {table.name}: {table.rows} rows in {len(table.files)} shard(s)")


@release.command("push")
@click.argument("release_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--repo", "repo_id", required=True, help="Dataset repository ORG/NAME (created when missing).")
@click.option("--private", is_flag=True, help="Make the repository private.")
@click.option(
    "--gated/--ungated",
    default=None,
    help="Require access requests with an intended-use form [default: gated when the design varies "
    "race, gender or another protected attribute].",
)
def release_push(release_dir: Path, repo_id: str, private: bool, gated: bool | None) -> None:
    """Upload RELEASE_DIR to the Hub as one commit tagged with its version (HF_TOKEN, HF_ENDPOINT)."""
    from counterfactory.flows.engine.verify import push_release

    result = _hub_call(push_release, release_dir, repo_id, private=private, gated=gated)
    state = "pushed" if result.created else "unchanged (this version is already on the Hub)"
    click.echo(f"{state} {result.repo_id}@{result.version}: commit {result.commit}")


@release.command("pull")
@click.argument("ref")
@click.argument("out_dir", type=click.Path(path_type=Path))
def release_pull(ref: str, out_dir: Path) -> None:
    """Restore the release REF (ORG/NAME@VERSION) from the Hub into OUT_DIR and verify it."""
    from counterfactory.flows.engine.verify import pull_release

    path = _hub_call(pull_release, ref, out_dir)
    click.echo(f"pulled {ref} into {path}: every file matches its checksum")


@release.command("diff")
@click.argument("a", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("b", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole diff as JSON.")
def release_diff(a: Path, b: Path, as_json: bool) -> None:
    """Items added, removed and changed (image sha256, verdict) from release A to release B,
    and pass-rate shifts per group with Wilson 95 % intervals.

    Exit codes: 0 identical, 1 different, 2 not comparable (not releases, or of different studies).
    """
    from counterfactory.validation.release_diff import diff_releases

    result = diff_releases(a, b)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        va, vb = result["a"]["version"], result["b"]["version"]
        click.echo(f"{result['a']['name']} {va} -> {vb}")

        def label(row):
            return f"{row['template_id']} {' '.join(f'{k}={v}' for k, v in row['condition'].items())}"

        for kind in ("added", "removed"):
            for row in result[kind]:
                click.echo(f"{kind}: {label(row)} ({row['status']})")
        for row in result["changed"]:
            what = []
            if row["status"][0] != row["status"][1]:
                what.append(f"verdict {row['status'][0]} -> {row['status'][1]}")
            if row["image"][0] != row["image"][1]:
                what.append(f"image {str(row['image'][0])[:12]} -> {str(row['image'][1])[:12]}")
            click.echo(f"changed: {label(row)}: {', '.join(what)}")
        for s in result["pass_rates"]:

            def show(r):
                return "absent" if r is None else f"{r['passed']}/{r['n']} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"

            click.echo(
                f"pass rate {s['group']}: {show(s['a'])} -> {show(s['b'])}" + (" (separated)" if s["separated"] else "")
            )
        for d in result["differences"]:
            # a detail that starts with its kind ("trials: 30 -> 27 rows") is not prefixed twice
            starts = d["detail"].split(" ", 1)[0].rstrip(":")
            click.echo(d["detail"] if starts == d["kind"] else f"{d['kind']}: {d['detail']}")
        click.echo(
            "identical" if result["identical"] else
            f"{len(result['added'])} added, {len(result['removed'])} removed, {len(result['changed'])} changed, "
            f"{len(result['differences'])} other difference(s)"
        )  # fmt: skip
    sys.exit(0 if result["identical"] else 1)
