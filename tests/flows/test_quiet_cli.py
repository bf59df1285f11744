"""The demo's output is the command line's own: no line from MediaPipe, TFLite, absl or OpenCV,
unless ``counterfactory --verbose`` asks for them (issue 24)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, demo_spec, user_env

# What those libraries print, as seen on this machine before they were silenced: glog/absl's
# "W0000 00:00:1796206013.485034 14657 inference_feedback_manager.cc:121] ...", TFLite's
# "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.", LiteRT's "INFO: [accelerator_registry.cc:43]
# DestroyAccelerator: ...", OpenCV's "[ WARN:0@3.437] global net_impl_backend.cpp:388 ...".
# A fresh clone's demo once printed LiteRT's "W0000 ... inference_runner_litert.cc:...] ... not aligned"
# inside the progress bar's line, so glog's prefix and a C++ source location count anywhere in a line.
NATIVE = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+|\w\.(?:cc|cpp|h):\d+\]|TensorFlow Lite|XNNPACK|inference_feedback_manager"
    r"|DestroyAccelerator|absl::|\[ WARN:|Logging before InitGoogle"
)
# the README's demo command, less its install step
DEMO = ["run", "assets/specs/demo-face.yaml", "--publish", "--allow-incomplete"]


def _lines(stdout: str, stderr: str) -> list[str]:
    # the progress bar redraws with carriage returns: each redraw is a line of its own
    return [line for line in re.split(r"[\r\n]+", stdout + stderr) if line.strip()]


def _demo(out: Path, *global_options: str, spec: Path | None = None) -> list[str]:
    command = DEMO if spec is None else ["run", str(spec), *DEMO[2:]]
    result = subprocess.run(
        [sys.executable, "-m", "counterfactory", *global_options, *command, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=user_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return _lines(result.stdout, result.stderr)


@pytest.mark.slow
def test_demo_prints_no_native_library_line_and_verbose_brings_them_back(demo_run, tmp_path):
    # the quiet run is the session's demo run: the README's command, in a user's environment
    quiet = _lines(demo_run.run_stdout, demo_run.run_stderr)
    assert not [line for line in quiet if NATIVE.search(line)], "\n".join(quiet)
    # what it does print: the progress bar and the summary, nothing else
    assert any(line.startswith("release written: ") for line in quiet)
    assert any(line.startswith("cells: accepted") or line.startswith("cells: ") for line in quiet)
    other = [
        line
        for line in quiet
        if not re.match(r"cells: +\d+%\|", line)
        and not re.match(
            r"(cells|templates complete|editor calls|waiting for review|release written|digest|report|time): ", line
        )
    ]
    assert not other, other

    # what the demo's release holds (issue 19): at least three quarters of its cells accepted,
    # none waiting in review for face-body tone congruence, which the demo spec does not require
    release = demo_run.release
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines() if line.strip()]
    assert len(items) == 18, len(items)
    accepted = [item for item in items if item["status"] == "accepted"]
    assert len(accepted) >= 0.75 * len(items), [(item["cell_id"], item["status"], item["reasons"]) for item in items]
    assert not [item for item in items if "skin_face_body_mismatch" in (item["reasons"] or [])]

    # the verbose run: the demo's spec on one template (every library loads as in the demo's run)
    loud = _demo(tmp_path / "verbose", "--verbose", spec=demo_spec(tmp_path, strata=[]))
    native = [line for line in loud if NATIVE.search(line)]
    assert native, "\n".join(loud)
    # MediaPipe's graph set-up, TFLite's delegate and LiteRT's teardown are all back
    assert any("XNNPACK" in line or "TensorFlow Lite" in line for line in native), native
    assert any(re.match(r"^[IWE]0000 ", line) for line in native), native
