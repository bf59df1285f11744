"""The README's path from the demo to scores, as written: its ``ask`` and ``score`` commands,
parsed out of the README, run against README command 1's release, with ``--base-url`` pointed
at an OpenAI-compatible stand-in server (tests/validation/standin_vlm.py) instead of the vLLM /
llama.cpp / Ollama server a lab runs. They end with the score report of the demo release."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from counterfactory.manifests.release import read_jsonl
from tests.conftest import REPO
from tests.validation.standin_vlm import StandIn
from tests.validation.test_ask_score import _env, _images

pytestmark = pytest.mark.slow

DEMO_RELEASE = "out/demo-face/releases/demo-face/0.1.0"


def readme_commands() -> dict[str, list[str]]:
    """The README's "From the demo to scores" block: each ``counterfactory`` command by name."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## From the demo to scores.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = {}
    for line in block.splitlines():
        words = shlex.split(line)
        if words and words[0].endswith("/counterfactory"):
            commands[words[1]] = words[1:]
    return commands


def test_the_readme_shows_ask_against_a_server_and_score():
    commands = readme_commands()
    assert set(commands) == {"ask", "score"}
    ask, score = commands["ask"], commands["score"]
    assert ask[1] == score[1] == DEMO_RELEASE  # README command 1's release
    assert ask[ask.index("--base-url") + 1] == "http://127.0.0.1:8000/v1"
    assert score[2] == f"{DEMO_RELEASE}.answers.sqlite"  # where ask keeps its answers


def test_the_readmes_ask_and_score_end_with_the_demo_releases_score_report(demo_run, tmp_path):
    # the README's relative paths, from a folder holding README command 1's output
    release = tmp_path / DEMO_RELEASE
    shutil.copytree(demo_run.release, release)
    trials = read_jsonl(release / "trials.jsonl")
    assert {t["protocol"] for t in trials} == {"2afc", "mcq"}
    server = StandIn(_images(release), flaky=0.0).start()
    try:
        commands = readme_commands()
        for name in ("ask", "score"):
            args = [server.base_url if a == "http://127.0.0.1:8000/v1" else a for a in commands[name]]
            done = subprocess.run(
                [sys.executable, "-m", "counterfactory", *args],
                cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        # every trial was asked once, with the model the README names
        assert server.requests == len(trials)
    finally:
        server.stop()
    scores = tmp_path / "out" / "demo-face" / "scores"
    report = (scores / "report.html").read_text()
    assert "Qwen/Qwen2.5-VL-7B-Instruct" in report
    assert "focus_table1_polarisation" in report or "focus_4_1_2afc_retention" in report
    # blank cells are explained, and no interval bound is floating-point noise
    assert "id='blank-cells'" in report and not re.search(r"\[-?\d\.\d+e-1\d,", report)
    data = json.loads((scores / "scores.json").read_text())
    assert set(data["models"]) == {"Qwen/Qwen2.5-VL-7B-Instruct"}
