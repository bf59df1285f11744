"""The ``ask`` and ``score`` commands: a vision-language model answers a release's trials, and
the answers are scored. :mod:`counterfactory.flows.cli` adds them to the command line."""

from __future__ import annotations

from pathlib import Path

import click

from counterfactory.flows.cli_common import fail


@click.command()
@click.argument("release", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--model", required=True, help="The model's name as its endpoint serves it.")
@click.option(
    "--backend",
    default="openai",
    show_default=True,
    help="A registered answer backend: openai (an OpenAI-compatible endpoint), fal (fal's vision router, FAL_KEY), "
    "transformers (a local Qwen2-VL class model: --model is its folder; --concurrency is the batch size).",
)
@click.option(
    "--base-url",
    help="An OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vLLM, Ollama); no credentials in it "
    "(the key goes in --api-key-env's variable), and no redirect to another host is followed.",
)
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable with the key.")
@click.option("--protocol", "protocols", multiple=True, help="Only this protocol's trials (repeatable).")
@click.option("--samples", default=1, show_default=True, help="Answers per trial (at most 10,000; index in the id).")
@click.option("--concurrency", default=4, show_default=True, help="Requests in flight at most.")
@click.option("--max-spend", type=float, help="Stop sending once this model's answers cost this many USD.")
@click.option("--usd-per-mtok-in", type=float, default=0.0, help="Price per million prompt tokens (for --max-spend).")
@click.option("--usd-per-mtok-out", type=float, default=0.0, help="Price per million completion tokens.")
@click.option(
    "--estimated-usd-per-question",
    type=float,
    help="USD held against --max-spend while a question is in flight (default: openai 0, fal 0.01).",
)
@click.option(
    "--ledger", type=click.Path(path_type=Path), help="Answers ledger, outside the release (default: beside it)."
)
@click.option(
    "--backend-option",
    "backend_options",
    multiple=True,
    metavar="NAME=VALUE",
    help="Another option of the backend (repeatable; the value read as YAML), e.g. system_prompt=... "
    "or timeout_s=60 for fal.",
)
@click.option(
    "--judge",
    type=click.Choice(["npdp", "story", "jargon"]),
    help="Instead of the trials, judge --of's answers: npdp (disability-context pairs, NP/DP's C.5 rubric), "
    "story (the protagonist's occupation, academic level and socioeconomic status of each story) or jargon "
    "(which of two term explanations has more jargon, both orders) of the guardrail paper's user context.",
)
@click.option("--of", "of_model", help="With --judge: the model whose answers are judged.")
def ask(
    release: Path,
    model: str,
    backend: str,
    base_url: str | None,
    api_key_env: str,
    protocols: tuple[str, ...],
    samples: int,
    concurrency: int,
    max_spend: float | None,
    usd_per_mtok_in: float,
    usd_per_mtok_out: float,
    estimated_usd_per_question: float | None,
    ledger: Path | None,
    backend_options: tuple[str, ...],
    judge: str | None,
    of_model: str | None,
) -> None:
    """Ask a vision-language model every trial of RELEASE; answers go to the answers ledger beside
    it, committed as they return; a re-run asks only what is missing. With --judge npdp|story|jargon
    --of M, the model judges M's disability-context, story or term-explanation answers instead (the
    rubric's sha256 on each)."""
    import yaml

    from counterfactory.validation.scoring.ask import ask as run_ask
    from counterfactory.validation.scoring.ask import check_amounts
    from counterfactory.validation.scoring.judge import JUDGES

    check_amounts(
        {
            "--max-spend": max_spend,
            "--usd-per-mtok-in": usd_per_mtok_in,
            "--usd-per-mtok-out": usd_per_mtok_out,
            "--estimated-usd-per-question": estimated_usd_per_question,
        }
    )
    options = {
        "model": model,
        "base_url": base_url,
        "api_key_env": api_key_env,
        "usd_per_mtok_in": usd_per_mtok_in,
        "usd_per_mtok_out": usd_per_mtok_out,
    }
    if backend != "openai":  # fal (FAL_KEY from the environment) and plug-ins: the model, and the estimate if given
        options = {"model": model}
    if estimated_usd_per_question is not None:
        options["estimated_usd_per_question"] = estimated_usd_per_question
    for item in backend_options:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            fail(f"--backend-option {item!r}: write NAME=VALUE, e.g. --backend-option timeout_s=60")
        options[name.strip()] = yaml.safe_load(value) if value.strip() else None
    if judge is not None:
        if not of_model:
            fail("--judge needs --of MODEL: the model whose answers are judged")
        summary = JUDGES[judge](
            release,
            backend=backend,
            options=options,
            of_model=str(of_model),
            concurrency=concurrency,
            max_spend=max_spend,
            ledger=ledger,
        )
    else:
        summary = run_ask(
            release,
            backend=backend,
            options=options,
            protocols=protocols,
            samples=samples,
            concurrency=concurrency,
            max_spend=max_spend,
            ledger=ledger,
        )
    click.echo(
        f"{summary.asked} asked, {summary.already} already answered, {summary.failed} failed, "
        f"{summary.invalid} unreadable "
        f"({summary.retries} retries), ${summary.spent_usd:.4f} spent, {summary.seconds:.1f} s -> {summary.ledger}"
    )
    if summary.stopped_at_cap:
        click.echo(f"stopped at the spend cap (${max_spend}); run again with a higher --max-spend to go on")
    if summary.failed or summary.invalid:
        for e in summary.errors[:5]:
            click.echo(e, err=True)
        problems = []
        if summary.invalid:
            problems.append(
                f"{summary.invalid} replies could not be read as answers (error rows in {summary.ledger}: "
                "paid for, not asked again, not scored)"
            )
        if summary.failed:
            problems.append(f"{summary.failed} trials got no answer; run the same command again to ask them")
        fail("; ".join(problems), code=1)


@click.command()
@click.argument("release", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("answers", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Folder for the report.")
@click.option(
    "--parse",
    type=click.Choice(["strict", "lenient"]),
    default="strict",
    show_default=True,
    help="Score the papers' strict reading of each reply, or the reading a person makes.",
)
@click.option(
    "--resamples",
    type=click.IntRange(min=1),
    help="Bootstrap resamples over templates [default: release.json's analysis.bootstrap.resamples, else 999].",
)
@click.option("--min-n", type=int, help="Fewest comparisons a win-rate cell needs (default: release.json's analysis).")
@click.option(
    "--from",
    "source",
    type=click.Choice(["answers", "lmms-eval", "vlmevalkit"]),
    default="answers",
    show_default=True,
    help="ANSWERS are answers ledgers / JSON lines, lmms-eval sample logs (--log_samples), or VLMEvalKit "
    "prediction files, of tasks written by `release export --harness`.",
)
def score(
    release: Path,
    answers: tuple[Path, ...],
    out: Path,
    parse: str,
    resamples: int | None,
    min_n: int | None,
    source: str,
) -> None:
    """Score ANSWERS (answers ledgers or JSON lines; with --from, a harness's logs) of RELEASE as
    the papers define their metrics: scores.json, per_trial.jsonl, the papers' tables, plots and
    report.html in OUT."""
    from counterfactory.validation.scoring.score import score as run_score

    scores = run_score(release, list(answers), out, parse=parse, source=source, resamples=resamples, min_n=min_n)
    models = ", ".join(scores["models"])
    dropped = scores["duplicates_dropped"]
    click.echo(
        f"{scores['answers']} answers of {models} scored ({parse}, {scores['bootstrap']['resamples']} resamples)"
        + (f"; {dropped} duplicate answer row(s) dropped (the same answer id read twice)" if dropped else "")
        + f" -> {out / 'report.html'}"
    )
