"""The Dockerfile's promises, read from the file: both targets, a non-root user, every COPY source in
the build context, exact pins for every package the installed extras name, the /data volume, and
``counterfactory`` as the entrypoint; and the CPU image built and run as CI builds it
(``docker/build.sh cpu --smoke``; the CUDA target needs a registry and a GPU, and is not built here)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "docker" / "constraints.txt"
TARGETS = ("cpu", "cuda")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], dict[str, Stage]]:
    """``(global ARG defaults, stages by name)``; continuation lines joined, comments dropped."""
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            base = parts[0]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            stage = stages[name] = Stage(name, base)
        elif stage is None and keyword == "ARG":
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        elif stage is not None:
            stage.instructions.append((keyword, rest.strip()))
    return args, stages


def _resolve(base: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def _chain(stage: Stage, stages: dict[str, Stage]) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    out = [stage]
    while out[-1].base in stages:
        out.append(stages[out[-1].base])
    return out


def _sources(stage: Stage, stages: dict[str, Stage]) -> list[Stage]:
    """Every stage whose files end up in ``stage``: its FROM chain and what it COPY --from's."""
    seen: dict[str, Stage] = {}
    todo = [stage]
    while todo:
        s = todo.pop()
        for c in _chain(s, stages):
            if c.name in seen:
                continue
            seen[c.name] = c
            for copy in c.all("COPY"):
                m = re.search(r"--from=(\S+)", copy)
                if m and m.group(1) in stages:
                    todo.append(stages[m.group(1)])
    return list(seen.values())


def _dockerignored(rel: str, patterns: list[str]) -> bool:
    rel = rel.rstrip("/")
    for p in patterns:
        p = p.lstrip("/")
        if fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.split("/")[0], p) or rel.startswith(p + "/"):
            return True
    return False


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and "+" not in version, f"{CONSTRAINTS}: {line!r} is not an exact public pin"
            pins[canonicalize_name(name)] = version
    return pins


def _stages():
    return parse_dockerfile(DOCKERFILE.read_text())


def test_both_targets_exist_and_end_as_a_non_root_user():
    _, stages = _stages()
    for target in TARGETS:
        assert target in stages, f"no `FROM ... AS {target}` stage"
        users = stages[target].all("USER")
        assert users, f"stage {target} sets no USER: it would run as root"
        user = users[-1].split(":")[0]
        assert user not in ("root", "0"), f"stage {target} ends as {user}"
        # the user exists: created in the stage itself
        assert any("useradd" in run and re.search(rf"\b{re.escape(user)}\b", run) for run in stages[target].all("RUN"))


def test_data_volume_workdir_and_entrypoint():
    _, stages = _stages()
    for target in TARGETS:
        stage = stages[target]
        volumes = [json.loads(v) if v.startswith("[") else v.split() for v in stage.all("VOLUME")]
        assert any("/data" in v for v in volumes), f"{target}: no /data volume"
        assert stage.all("WORKDIR")[-1] == "/data"
        assert json.loads(stage.all("ENTRYPOINT")[-1]) == ["counterfactory"]
        env = " ".join(stage.all("ENV"))
        assert "PREFECT_HOME=/data/" in env  # Prefect's database on the volume, not in the image


def test_every_copy_source_is_in_the_build_context():
    _, stages = _stages()
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = 0
    for stage in stages.values():
        for copy in stage.all("COPY"):
            parts = [p for p in shlex.split(copy) if not p.startswith("--")]
            if "--from=" in copy:
                continue
            for src in parts[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert not _dockerignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
                copied += 1
    assert copied >= 5
    # what the package needs at install time is all copied: every package folder of pyproject
    folders = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    build = " ".join(c for s in stages.values() for c in s.all("COPY"))
    for folder in folders:
        assert re.search(rf"(^|\s){re.escape(folder)}\s", build), f"package folder {folder} is never copied"


def test_constraints_pin_every_package_each_target_installs():
    _, stages = _stages()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras_decl = pyproject["optional-dependencies"]
    pins = _pins()
    for target in TARGETS:
        installs = [
            run for s in _sources(stages[target], stages) for run in s.all("RUN") if re.search(r"pip install", run)
        ]
        assert installs, f"{target}: nothing is pip-installed"
        extras: set[str] = set()
        for run in installs:
            assert "-c docker/constraints.txt" in run, f"{target}: `{run}` does not use the constraints"
            for group in re.findall(r"'\.\[([^\]]+)\]'", run):
                extras.update(e.strip() for e in group.split(","))
        assert extras, f"{target}: no extras installed"
        required = [Requirement(r) for r in pyproject["dependencies"]]
        for extra in sorted(extras):
            assert extra in extras_decl, f"{target} installs unknown extra {extra!r}"
            required += [Requirement(r) for r in extras_decl[extra]]
        for req in required:
            name = canonicalize_name(req.name)
            assert name in pins, f"{target}: {req.name} (extra or core) is not pinned in {CONSTRAINTS.name}"
            assert Version(pins[name]) in req.specifier, (
                f"{CONSTRAINTS.name} pins {req.name}=={pins[name]}, outside pyproject's {req}; "
                "re-run docker/freeze_constraints.py in the tested venv"
            )
    assert "torch" in pins  # the CUDA target's qwen backend


def test_cpu_image_has_no_gpu_stack_and_cuda_image_has_qwen():
    _, stages = _stages()

    def extras_of(target: str) -> set[str]:
        found: set[str] = set()
        for s in _sources(stages[target], stages):
            for run in s.all("RUN"):
                for group in re.findall(r"'\.\[([^\]]+)\]'", run):
                    found.update(e.strip() for e in group.split(","))
        return found

    assert "gpu" not in extras_of("cpu") and {"remote"} <= extras_of("cpu")
    assert {"gpu", "remote"} <= extras_of("cuda")
    args, stages_ = _stages()
    assert _resolve(stages_["cuda"].base, args).startswith("nvidia/cuda:")
    assert _resolve(stages_["cpu"].base, args).startswith("python:3.11")


def test_docs_document_one_command_per_target():
    # docs/scale.md, "Docker" (moved out of the README with the rest of the scale-out guide)
    text = (REPO / "docs" / "scale.md").read_text()
    block = re.search(r"## Docker.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    for target in TARGETS:
        (line,) = [c for c in commands if f"--target {target} " in c]
        image = re.search(r"-t (\S+) \. && docker run .* (\S+) run (\S+\.yaml) --out /data/", line)
        assert image and image.group(1) == image.group(2), line  # runs the image it built
        spec = image.group(3)
        if spec.startswith("/opt/counterfactory/assets/"):  # a bundled spec: it must exist
            assert (REPO / spec.removeprefix("/opt/counterfactory/")).is_file(), spec


@pytest.mark.slow
def test_the_cpu_image_builds_from_a_bootstrapped_base_and_runs_the_demo_as_its_user(tmp_path):
    """docker/build.sh cpu --smoke, as CI runs it (.ci/run starts the daemon): the base is Debian
    bookworm bootstrapped with debootstrap (no registry), the image runs the README's demo offline as
    uid 10001 with a host folder on /data, and `counterfactory verify` passes on the release it wrote."""
    if shutil.which("docker") is None:
        pytest.skip("no docker command on this machine (.ci/run installs docker.io and starts dockerd)")
    data = tmp_path / "data"
    result = subprocess.run(
        [
            "bash",
            str(REPO / "docker" / "build.sh"),
            "cpu",
            "--smoke",
            "--data",
            str(data),
            "--tag",
            "counterfactory:cpu-test",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert re.search(r"built counterfactory:cpu-test: \d+ MB", log), log[-3000:]
    assert "smoke: demo and verify passed" in log, log[-3000:]
    release = data / "demo-face" / "releases" / "demo-face" / "0.1.0"
    assert (release / "manifest.parquet").stat().st_uid == 10001
    summary = json.loads((release / "release.json").read_text())
    assert summary["name"] == "demo-face" and summary["version"] == "0.1.0"
    # the image's output is the command line's own: no native library's or Prefect's error line
    assert "Permission denied" not in log and "inference_runner_litert" not in log, log[-3000:]
