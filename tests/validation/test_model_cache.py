"""The process's loaded models are explicit state (``validation.backends.ModelCache``): one lock
over the models and the thread count they are built with."""

from __future__ import annotations

import threading

from counterfactory.validation.backends import ModelCache


def test_a_model_is_cached_under_the_thread_count_it_was_built_with():
    cache = ModelCache()
    built: list[int | None] = []

    def build(threads):
        built.append(threads)
        return object()

    first = cache.get(("detector", "x"), build)
    assert cache.get(("detector", "x"), build) is first and built == [None]
    assert cache.set_threads(0) == 1 and cache.threads == 1  # at least one thread
    # a model built before the count was set is not handed out as if built with it
    second = cache.get(("detector", "x"), build)
    assert second is not first and built == [None, 1]
    assert cache.get(("detector", "x"), build) is second


def test_callers_on_many_threads_build_one_model():
    cache = ModelCache()
    cache.set_threads(2)
    built: list[int | None] = []
    start = threading.Barrier(8)
    got: list[object] = []

    def build(threads):
        built.append(threads)
        return object()

    def ask():
        start.wait()
        got.append(cache.get(("au", "y"), build))

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert built == [2] and len({id(g) for g in got}) == 1
