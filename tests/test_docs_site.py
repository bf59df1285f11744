"""The docs site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, lists every page,
and documents only commands and options the code has."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pytest
import yaml

from tests.conftest import REPO

DOCS = REPO / "docs"


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _config() -> dict:
    # mkdocs.yml holds no python tags: plain YAML reads it
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    pages = _nav_pages(_config()["nav"])
    on_disk = sorted(p.name for p in DOCS.glob("*.md"))
    assert sorted(pages) == on_disk


def test_the_command_reference_is_generated_from_the_click_commands():
    text = (DOCS / "commands.md").read_text()
    assert "::: mkdocs-click" in text and ":module: counterfactory.flows.cli" in text and ":command: main" in text
    assert "mkdocs-click" in _config()["markdown_extensions"]


def test_the_gates_page_lists_every_reason_code_as_the_code_does():
    from counterfactory.validation.reasons import markdown_table

    assert markdown_table() in (DOCS / "gates.md").read_text()


def _documented_commands() -> list[str]:
    """Every ``counterfactory ...`` command line the README and the docs pages show."""
    found = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        # code spans and code-block lines; a block's continuation lines (ending in \) are joined
        text = re.sub(r"\\\n\s*", " ", text)
        for line in re.findall(r"`([^`\n]*counterfactory [^`\n]*)`", text) + text.splitlines():
            for m in re.finditer(r"(?:^|[\s(`/])counterfactory ([a-z][^`|;&)]*)", line):
                found.append(m.group(1).strip())
    return found


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    from counterfactory.flows.cli import main

    command, rest = main, list(words)
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return command, rest


def test_every_option_the_docs_name_is_one_the_command_takes():
    checked, wrong = 0, []
    for line in _documented_commands():
        words = line.split()
        if not words or words[0] not in {
            "run", "schedule", "publish", "release", "masks", "measure", "calibrate", "verify",
            "ask", "score", "review", "plugins",
        }:  # fmt: skip
            continue  # prose: "counterfactory is ...", the package name
        command, rest = _resolve(words)
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
        for word in rest:
            flag = word.split("=", 1)[0].strip("[]()'\".,")
            if re.fullmatch(r"--?[a-z][a-z0-9-]*", flag):
                checked += 1
                if flag not in options:
                    wrong.append(f"{line!r}: {flag} is not an option of {command.name}")
    assert checked > 50 and wrong == [], "\n".join(wrong)


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (README command 2 installs it)")
    pytest.importorskip("mkdocs_click")
    pytest.importorskip("mkdocstrings_handlers.python")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    commands = (tmp_path / "site" / "commands" / "index.html").read_text()
    # generated from the commands: an option only the code knows appears
    assert "--allow-incomplete" in commands and "--base-url" in commands and "add-reviewer" in commands
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "load_spec" in api and "verify_release" in api
