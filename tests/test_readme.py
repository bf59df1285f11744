"""The README stays true and short: CI runs its test command verbatim, its demo command is the
one the tests run, what it shows the demo printing is what the demo prints, it names no date,
and every page it links is there. What moved out of it is checked where it now lives (the docs
site: tests/test_docs_site.py; the ask and score commands: tests/validation/test_readme_scores.py)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

README = REPO / "README.md"


def _commands() -> list[str]:
    text = README.read_text()
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    demo, tests = _commands()
    assert "counterfactory run assets/specs/demo-face.yaml" in demo
    assert "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_test_command_installs_the_docs_extra_so_the_site_is_built_in_ci():
    # tests/test_docs_site.py builds the site with `mkdocs build --strict` where mkdocs is installed
    _, tests = _commands()
    extras = re.search(r"-e '\.\[([^\]]+)\]'", tests).group(1).split(",")
    assert "docs" in extras


def test_demo_spec_named_in_readme_exists():
    demo, _ = _commands()
    spec = re.search(r"run (\S+\.yaml)", demo).group(1)
    assert (REPO / spec).is_file()


def test_images_the_readme_shows_are_committed():
    text = README.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert "docs/review-page.png" in images
    for image in images:
        assert (REPO / image).is_file(), image


def test_the_readme_is_read_in_five_minutes_and_names_no_date():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    dates = re.findall(
        r"\b20\d\d-\d\d(?:-\d\d)?\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b", text
    )
    assert dates == [], dates
    # no line of prose a reader must scroll sideways for (the test command is one line on purpose)
    _, tests = _commands()
    long = [line for line in text.splitlines() if len(line) > 200 and line != tests]
    assert long == [], long


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (REPO / link).exists(), link
    for named in ("ARCHITECTURE.md", "CHANGELOG.md"):
        assert f"`{named}`" in README.read_text() and (REPO / named).is_file()


def test_the_extras_table_names_every_extra_of_pyproject():
    import tomllib

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    table = re.search(r"\| extra \| for \|\n\|---\|---\|\n(.*?)\n\n", README.read_text(), re.S).group(1)
    named = set(re.findall(r"`([a-z]+)`", " ".join(line.split("|")[1] for line in table.splitlines())))
    # harness and libreface are test-only environments, dev the tests' own tools
    assert extras - {"harness", "libreface", "dev"} <= named, extras - named


def _shown_demo_output() -> list[str]:
    block = re.search(r"## What the demo printed.*?```\n(.*?)```", README.read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line]


@pytest.mark.slow
def test_what_the_readme_shows_the_demo_printing_is_what_it_prints(demo_run):
    printed = demo_run.run_stdout.splitlines()
    for shown in _shown_demo_output():
        # "..." stands for what differs run to run (a digest) or folder to folder
        pattern = ".*".join(re.escape(part) for part in shown.replace("out/demo-face", "\0").split("..."))
        pattern = pattern.replace(re.escape("\0"), ".*")
        assert any(re.fullmatch(pattern, line) for line in printed), (shown, printed)
