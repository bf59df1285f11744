"""The flow on Ray (prefect-ray's RayTaskRunner): the same items, images and metrics as on one
machine, and a cluster that cannot run the spec stopped before any work."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.flows.ray import (
    RayTargetError,
    check_ray_target,
    is_remote_address,
    ray_target,
    task_resources,
)
from counterfactory.manifests.ledger import Ledger
from tests.conftest import REPO
from tests.flows.review_setup import write_spec

ray = pytest.importorskip("ray", reason="the `ray` extra (ray, prefect-ray) is not installed")
pytest.importorskip("prefect_ray", reason="the `ray` extra (ray, prefect-ray) is not installed")

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ledger_view(out: Path) -> dict:
    """Per attempt: status, output sha256, and its candidate's verdict, reasons, aligned image
    sha256, alignment and every gate's metrics; the run's bookkeeping (times, claims) left out."""
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        view = {}
        for a in ledger.attempts():
            c = ledger.candidate(a.attempt_id)
            view[a.attempt_id] = {
                "cell": a.cell_id,
                "status": a.status,
                "output": a.output_sha256,
                "verdict": c.verdict if c else None,
                "reasons": list(c.reasons) if c else None,
                "image": c.image_sha256 if c else None,
                "alignment": json.dumps(c.alignment, sort_keys=True) if c else None,
                "gates": json.dumps({k: v.get("metrics") for k, v in c.gates.items()}, sort_keys=True) if c else None,
            }
        return view
    finally:
        ledger.close()


# -- the cluster checked before any work (no Ray instance needed) -------------------------


def test_remote_addresses_are_told_apart():
    assert not is_remote_address("local") and not is_remote_address("auto")
    assert not is_remote_address("127.0.0.1:6379") and not is_remote_address("localhost:6379")
    assert not is_remote_address(f"{socket.gethostname()}:6379")
    assert is_remote_address("ray://127.0.0.1:10001")  # Ray Client: workers are the cluster's
    assert is_remote_address("203.0.113.7:6379")  # TEST-NET-3: never this machine


def test_num_gpus_follow_the_backend(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    assert ray_target(spec) is None  # no run.ray and no --ray: threads on this machine
    target = ray_target(spec, "local")
    assert target.num_gpus == 0 and target.num_cpus == 1 and not target.remote
    gpu = spec.model_copy(deep=True)
    gpu.editor = type(spec.editor).model_validate({"backend": "qwen", "qwen": {"device": "cuda"}})
    assert ray_target(gpu, "local").num_gpus == 1
    explicit = spec.model_copy(update={"run": type(spec.run).model_validate({"ray": {"num_gpus": 0.5}})})
    assert ray_target(explicit).num_gpus == 0.5 and ray_target(explicit).address == "local"
    # what the tasks ask Ray for: GPU edit tasks keep their worker process (the loaded pipeline)
    assert task_resources(ray_target(spec, "local")) == ({"num_gpus": 0.0}, {"num_cpus": 1.0})
    assert task_resources(ray_target(gpu, "local")) == ({"num_gpus": 1.0, "max_calls": 0}, {"num_cpus": 1.0})


def test_sqlite_with_remote_workers_is_refused(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    for address in ("ray://203.0.113.7:10001", "203.0.113.7:6379"):
        with pytest.raises(RayTargetError, match="cannot share a SQLite ledger file.*PostgreSQL"):
            check_ray_target(ray_target(spec, address), spec, prefect_api_url="http://10.0.0.2:4200/api")


def test_remote_workers_need_a_prefect_api_they_can_reach(tmp_path):
    spec = load_spec(write_spec(tmp_path, ledger_url="postgresql+psycopg://u@db.example/ledger"))
    with pytest.raises(RayTargetError, match="loopback.*PREFECT_API_URL"):
        check_ray_target(ray_target(spec, "ray://203.0.113.7:10001"), spec, prefect_api_url=None)


def test_malformed_address_names_the_accepted_forms(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    with pytest.raises(RayTargetError, match="HOST:PORT, ray://HOST:PORT, 'local' or 'auto'"):
        check_ray_target(ray_target(spec, "headnode"), spec, prefect_api_url=None)


@pytest.mark.slow
def test_cli_stops_on_an_address_that_does_not_answer_before_any_work(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    port = _free_port()  # nothing listens there
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "run", str(spec), "--out", str(out), "--no-progress", "--ray", f"127.0.0.1:{port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"the Ray address 127.0.0.1:{port} does not answer" in done.stderr
    assert "nothing was run" in done.stderr
    assert not out.exists()  # no folder, no ledger, no Prefect flow run
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_cli_refuses_sqlite_with_a_remote_cluster_before_any_work(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [*CLI, "run", str(spec), "--out", str(out), "--no-progress", "--ray", "ray://203.0.113.7:10001"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot share a SQLite ledger file" in done.stderr and "PostgreSQL" in done.stderr
    assert not out.exists()


# -- a real run on a local Ray instance ----------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    """A two-CPU Ray instance for the module; every process it started is gone afterwards."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    context = ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        log_to_driver=False,
        namespace="counterfactory-test",
    )
    spawned = {p: " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True) if p.pid not in before}
    assert any("raylet" in cmd for cmd in spawned.values()), spawned
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        _, alive = psutil.wait_procs(list(spawned), timeout=30)
        assert not alive, f"Ray processes outlived ray.shutdown(): {[spawned[p] for p in alive]}"


@pytest.mark.slow
def test_a_run_on_ray_matches_the_local_run(local_ray, tmp_path):
    from counterfactory.flows.engine import execute
    from counterfactory.flows.resume import run_spec

    spec = write_spec(tmp_path)
    local = run_spec(spec, tmp_path / "local", workers=2, progress=False)

    def not_here(*args, **kwargs):
        raise AssertionError("on Ray, edits and gates run in the cluster's worker processes, not the driver")

    # the Ray workers are other processes: what is patched here cannot reach them
    with pytest.MonkeyPatch.context() as patch:
        for name in ("run_edits", "judge_attempts", "build_editor", "build_gate_stack"):
            patch.setattr(execute, name, not_here)
        on_ray = run_spec(spec, tmp_path / "ray", workers=2, progress=False, ray=local_ray)

    assert local.editor_calls > 0
    assert (on_ray.counts, on_ray.editor_calls, on_ray.templates) == (local.counts, local.editor_calls, local.templates)
    # the same attempts (ids hash everything that decides an output), the same image bytes,
    # verdicts, reasons, alignments and gate metrics
    assert _ledger_view(tmp_path / "ray") == _ledger_view(tmp_path / "local")

    again = run_spec(spec, tmp_path / "ray", workers=2, progress=False, ray=local_ray)
    assert again.editor_calls == 0 and again.counts == local.counts  # resumes from the ledger


def test_run_ray_in_the_spec_file_is_read_and_left_out_of_the_hash(tmp_path):
    import yaml

    plain = write_spec(tmp_path / "plain")
    data = yaml.safe_load(plain.read_text())
    data["run"] = {"ray": {"address": "10.0.0.5:6379", "num_cpus": 2, "connect_timeout_s": 3}}
    on_ray = tmp_path / "ray.yaml"
    on_ray.write_text(yaml.safe_dump(data))
    shutil.copy(tmp_path / "plain" / "meta.yaml", tmp_path / "meta.yaml")
    spec = load_spec(on_ray)
    target = ray_target(spec)
    assert (target.address, target.num_cpus, target.connect_timeout_s) == ("10.0.0.5:6379", 2.0, 3.0)
    assert ray_target(spec, "local").address == "local"  # --ray wins over the spec
    # where a study runs decides none of its outputs
    assert spec.spec_hash() == load_spec(plain).spec_hash()
    data["run"] = {"ray": {"adress": "local"}}
    on_ray.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="adress"):
        load_spec(on_ray)
