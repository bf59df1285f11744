"""The GPU batch worker: chunks of several callers share one pipeline call, a chunk is never
split, the queue is bounded, failures reach the callers of their batch; and on the tiny
random Qwen-Image-Edit pipeline, two template threads' requests denoised in one batch compute
what one-by-one calls compute."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from counterfactory.generation.editors.base import EditRequest
from counterfactory.generation.editors.qwen import QwenEditor, QwenOptions
from counterfactory.generation.editors.qwen_batch import BatchWorker
from tests.conftest import read_rgb
from tests.generation.conftest_qwen import build_tiny_qwen_pipeline


class Recorder:
    """A batch function that records each batch; the key ``"gate"`` waits for :attr:`release`."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, key, payloads):
        if key == "gate":
            self.entered.set()
            assert self.release.wait(30)
        if key == "boom":
            raise RuntimeError("pipeline exploded")
        self.batches.append((key, list(payloads)))
        return [p * 10 for p in payloads]


def _gated(max_queue: int = 8) -> tuple[BatchWorker, Recorder]:
    run = Recorder()
    worker = BatchWorker(run, max_queue=max_queue, linger_s=0.05)
    worker.submit("gate", [0])
    assert run.entered.wait(30)  # the worker is busy: what follows queues up behind it
    return worker, run


def test_chunks_of_one_key_fill_a_batch_and_are_never_split():
    worker, run = _gated()
    a1 = worker.submit("A", [1, 2], max_batch=4)
    b = worker.submit("B", [3], max_batch=4)
    a2 = worker.submit("A", [4], max_batch=4)
    a3 = worker.submit("A", [5, 6], max_batch=4)  # 3 + 2 > 4: the next A batch
    run.release.set()
    assert (a1.result(30), b.result(30), a2.result(30), a3.result(30)) == ([10, 20], [30], [40], [50, 60])
    assert run.batches[1:] == [("A", [1, 2, 4]), ("B", [3]), ("A", [5, 6])]
    assert worker.stats.batches == 4 and worker.stats.items == 7 and worker.stats.largest_batch == 3
    worker.close()
    assert not worker.alive


def test_chunks_with_another_batch_size_do_not_mix():
    worker, run = _gated()
    small = worker.submit("A", [1], max_batch=1)
    large = worker.submit("A", [2], max_batch=2)
    run.release.set()
    assert small.result(30) == [10] and large.result(30) == [20]
    assert run.batches[1:] == [("A", [1]), ("A", [2])]
    worker.close()


def test_the_queue_is_bounded_so_a_fast_caller_waits():
    worker, run = _gated(max_queue=2)
    worker.submit("A", [1])
    worker.submit("A", [2])
    third = threading.Thread(target=worker.submit, args=("A", [3]))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # blocked: two chunks already wait
    assert worker.stats.queue_high_water <= 2
    run.release.set()
    third.join(30)
    assert not third.is_alive()
    worker.close()
    assert [items for _, items in run.batches[1:]] == [[1], [2], [3]]


def test_a_failed_batch_fails_its_callers_and_the_worker_goes_on():
    worker, run = _gated()
    bad = worker.submit("boom", [1])
    good = worker.submit("A", [2])
    run.release.set()
    with pytest.raises(RuntimeError, match="pipeline exploded"):
        bad.result(30)
    assert good.result(30) == [20]
    worker.close()


def test_close_finishes_queued_work_and_refuses_more():
    worker, run = _gated()
    pending = worker.submit("A", [1])
    run.release.set()
    worker.close()
    assert pending.result(1) == [10] and not worker.alive
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit("A", [2])


def test_bad_chunks_are_refused():
    worker = BatchWorker(Recorder())
    with pytest.raises(ValueError, match="1..2 payloads"):
        worker.submit("A", [1, 2, 3], max_batch=2)
    with pytest.raises(ValueError, match="max_queue"):
        BatchWorker(Recorder(), max_queue=0)
    worker.close()


# -- the tiny pipeline ---------------------------------------------------------------------


class _Gate:
    """Stands in for an editor in the worker's batch key: its ``_run`` holds the worker."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def _run(self, name, requests):
        self.entered.set()
        assert self.release.wait(60)
        return list(requests)


@pytest.mark.slow
def test_two_threads_share_one_pipeline_call_and_get_the_one_by_one_images(tmp_path: Path):
    folder = tmp_path / "tiny-qwen"
    build_tiny_qwen_pipeline(folder)
    source = read_rgb("grace_hopper.jpg")
    base = {"model_id": str(folder), "device": "cpu", "dtype": "float32", "steps": 1, "true_cfg_scale": 1.0}
    batched = QwenEditor(QwenOptions(**base, batch_size=2))
    batched.prepare()
    prompts = ["Change the person's apparent race to Black.", "Make her look older."]
    requests = [
        EditRequest(attempt_id=f"t{i}", image=source, prompt=p, seed=i, kind="face") for i, p in enumerate(prompts)
    ]

    worker = batched._loaded.batch_worker()
    gate = _Gate()
    worker.submit((gate, "edit", 0, 0), ["hold"])
    assert gate.entered.wait(60)
    worker.reset_stats()
    got: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda r=r: got.update({r.attempt_id: batched.edit_many([r])[0]})) for r in requests
    ]
    for t in threads:
        t.start()
    while worker._queue.qsize() < 2:  # both template threads have handed their request over
        threading.Event().wait(0.01)
    gate.release.set()
    for t in threads:
        t.join(600)

    assert worker.stats.batches == 1 and worker.stats.items == 2  # one pipeline call for both
    single = QwenEditor(QwenOptions(**base))  # same loaded weights, batch_size 1
    for request in requests:
        one = single.edit(request)
        both = got[request.attempt_id]
        assert both.status == one.status == "ok"
        assert both.metadata["batch_size"] == 2 and one.metadata["batch_size"] == 1
        # a batch changes only float summation order (prompt padding, batched matmuls)
        diff = np.abs(both.image.astype(int) - one.image.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    assert not np.array_equal(got["t0"].image, got["t1"].image)
