"""Global concurrency limits from the spec, held by editors, on a real Prefect API server."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
import time

import pytest
import yaml

from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.flows.limits import (
    FAL_LIMIT,
    GPU_LIMIT,
    LimitedEditor,
    LimitedVisionClient,
    apply_limits,
    limited_editor,
    limited_gates,
    spec_limits,
)
from counterfactory.flows.server import prefect_api
from counterfactory.generation.editors.base import EditRequest, EditResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_api() as url:
        yield url


def _spec(tmp_path, specs_dir, **run) -> object:
    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    if run:
        data["run"] = run
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class SlowEditor:
    """Records how many of its batches run at once; each batch takes ``hold_s``."""

    name = "slow"

    def __init__(self, hold_s: float = 0.4, batch_size: int = 1) -> None:
        self.hold_s = hold_s
        self.batch_size = batch_size
        self.inside = 0
        self.most_inside = 0
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def lineage(self):
        return {"backend": self.name}

    def edit_many(self, requests, journal=None):
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.batches.append(len(requests))
        time.sleep(self.hold_s)
        with self._lock:
            self.inside -= 1
        return [EditResult(r.attempt_id, "failed", reason="slow") for r in requests]


def _requests(n: int) -> list[EditRequest]:
    import numpy as np

    image = np.zeros((4, 4, 3), np.uint8)
    return [
        EditRequest(attempt_id=f"a{i}", image=image, prompt="p", seed=0, kind="face", mask=image[..., 0], condition={})
        for i in range(n)
    ]


def _in_threads(editor, n_threads: int, batch: int) -> None:
    # each thread runs in a copy of this context, as Prefect's task runner does: the API URL
    # of the test's server is a context setting
    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(editor.edit_many, _requests(batch)))
        for _ in range(n_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


def test_a_zero_limit_is_refused_when_the_spec_loads(tmp_path, specs_dir):
    for field in ("gpu_slots", "fal_max_concurrency"):
        with pytest.raises(SpecError, match=rf"`run\.{field}`: expected a concurrency limit of at least 1"):
            load_spec(_spec(tmp_path, specs_dir, **{field: 0}))
    # the command line stops before any work: no output folder is made
    out = tmp_path / "out"
    spec = _spec(tmp_path, specs_dir, gpu_slots=0)
    result = subprocess.run(
        [sys.executable, "-m", "counterfactory.flows.cli", "run", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "run.gpu_slots" in result.stderr and "lets no edit start" in result.stderr
    assert not out.exists()


def test_run_section_is_not_part_of_the_study(tmp_path, specs_dir):
    plain = load_spec(_spec(tmp_path, specs_dir))
    limited = load_spec(_spec(tmp_path, specs_dir, gpu_slots=2, fal_max_concurrency=8))
    assert spec_limits(plain) == {}
    assert spec_limits(limited) == {GPU_LIMIT: 2, FAL_LIMIT: 8}
    assert limited.spec_hash() == plain.spec_hash()
    # the classical editor runs on neither a GPU nor fal: it holds no limit
    editor = object()
    assert limited_editor(editor, limited) is editor


def test_limits_are_created_then_updated_from_the_spec(prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    apply_limits({GPU_LIMIT: 3})
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(GPU_LIMIT).limit == 3
        # someone switched it off in the UI: the next run turns it back on with its value
        client.update_global_concurrency_limit(GPU_LIMIT, GlobalConcurrencyLimitUpdate(active=False))
    apply_limits({GPU_LIMIT: 2})
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(GPU_LIMIT)
    assert limit.limit == 2 and limit.active
    with pytest.raises(ValueError, match="at least 1"):
        apply_limits({GPU_LIMIT: 0})


def test_one_gpu_slot_runs_one_batch_at_a_time(prefect_server):
    apply_limits({"test-gpu-one": 1})
    slow = SlowEditor()
    _in_threads(LimitedEditor(slow, "test-gpu-one", 1, occupy_per_request=False), 3, batch=2)
    assert len(slow.batches) == 3 and slow.most_inside == 1
    # the same editor with two slots lets two batches overlap (the bound is the limit, not the wrapper)
    apply_limits({"test-gpu-two": 2})
    slow = SlowEditor(hold_s=1.5)
    _in_threads(LimitedEditor(slow, "test-gpu-two", 2, occupy_per_request=False), 2, batch=2)
    assert slow.most_inside == 2


def test_fal_requests_hold_one_slot_each(prefect_server):
    apply_limits({"test-fal": 3})
    slow = SlowEditor(batch_size=4)
    limited = LimitedEditor(slow, "test-fal", 3, occupy_per_request=True)
    assert limited.batch_size == 3 and limited.name == "slow"
    results = limited.edit_many(_requests(7))
    assert [r.attempt_id for r in results] == [f"a{i}" for i in range(7)]
    assert slow.batches == [3, 3, 1]
    # two threads with batches of 2 each need 4 slots of 3: they cannot overlap
    slow = SlowEditor(batch_size=2)
    _in_threads(LimitedEditor(slow, "test-fal", 3, occupy_per_request=True), 2, batch=2)
    assert slow.most_inside == 1


class SlowVision:
    """A stand-in for the vlm gate's fal client that shares SlowEditor's in-flight counter."""

    def __init__(self, shared: SlowEditor) -> None:
        self.shared = shared
        self.asked: list[int] = []

    def lineage(self):
        return {"backend": "vlm-stand-in"}

    def ask_many(self, images, prompt, journal=None):
        with self.shared._lock:
            self.shared.inside += 1
            self.shared.most_inside = max(self.shared.most_inside, self.shared.inside)
            self.asked.append(len(images))
        time.sleep(self.shared.hold_s)
        with self.shared._lock:
            self.shared.inside -= 1
        return [("q", None) for _ in images]


def test_vlm_questions_and_fal_edits_share_the_accounts_slots(prefect_server, tmp_path, specs_dir):
    apply_limits({FAL_LIMIT: 3})
    slow = SlowEditor(hold_s=1.0, batch_size=2)
    vision = LimitedVisionClient(SlowVision(slow), 3)
    assert vision.lineage() == {"backend": "vlm-stand-in"}  # ids and verdicts do not change
    # an edit batch of 2 and a question batch of 2 need 4 of the account's 3 slots: never together
    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(LimitedEditor(slow, FAL_LIMIT, 3, occupy_per_request=True).edit_many, _requests(2)),
        ),
        threading.Thread(target=contextvars.copy_context().run, args=(vision.ask_many, [object()] * 2, "p")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert slow.batches == [2] and vision.inner.asked == [2] and slow.most_inside == 1
    # more questions than slots go in slices of at most the limit
    assert len(vision.ask_many([object()] * 7, "p")) == 7 and vision.inner.asked[1:] == [3, 3, 1]

    class Gate:
        def __init__(self, backend, answer_backend="fal"):
            self.config = type("Config", (), {"backend": backend, "answer_backend": answer_backend})()
            self.classifier = SlowVision(slow)

    stack = type("Stack", (), {"gates": [Gate("vlm"), Gate("fairface"), Gate("vlm", "openai")]})()
    limited_gates(stack, load_spec(_spec(tmp_path, specs_dir, fal_max_concurrency=3)))
    assert isinstance(stack.gates[0].classifier, LimitedVisionClient) and stack.gates[0].classifier.slots == 3
    assert isinstance(stack.gates[1].classifier, SlowVision)  # a local classifier holds nothing
    assert isinstance(stack.gates[2].classifier, SlowVision)  # nor a VLM asked elsewhere than fal
    # without run.fal_max_concurrency nothing is wrapped
    plain = type("Stack", (), {"gates": [Gate("vlm")]})()
    limited_gates(plain, load_spec(_spec(tmp_path, specs_dir)))
    assert isinstance(plain.gates[0].classifier, SlowVision)
