"""The README's two commands stay true: CI runs the test command verbatim."""

from __future__ import annotations

import re

from tests.conftest import REPO


def _commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    demo, tests = _commands()
    assert "counterfactory run assets/specs/demo-face.yaml" in demo
    assert "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()


def test_demo_spec_named_in_readme_exists():
    demo, _ = _commands()
    spec = re.search(r"run (\S+\.yaml)", demo).group(1)
    assert (REPO / spec).is_file()


def test_images_the_readme_shows_are_committed():
    text = (REPO / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert "docs/review-page.png" in images
    for image in images:
        assert (REPO / image).is_file(), image
