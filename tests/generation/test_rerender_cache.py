"""The TAEF2 round trips kept on disk (``generation/rerender.py::RerenderCache``): a kept round
trip is byte for byte the one computed afresh, the key moves with the pixels and the graphs and
nothing else, and a damaged entry costs a recomputation, never a wrong image."""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.generation.rerender import CACHE_ENV, Rerenderer, get_rerenderer

pytestmark = pytest.mark.slow  # four 128 px round trips, each graph loaded twice


@pytest.fixture(scope="module")
def small(grace):
    import cv2

    return cv2.resize(grace, (128, 160), interpolation=cv2.INTER_AREA)


def test_a_kept_round_trip_is_the_fresh_one_and_is_read_not_computed(small, tmp_path):
    fresh = Rerenderer()(small)
    cached = Rerenderer(cache=tmp_path)
    first = cached(small)
    assert (cached.cache.hits, cached.cache.misses) == (0, 1)
    second = cached(small)
    assert (cached.cache.hits, cached.cache.misses) == (1, 1)
    np.testing.assert_array_equal(first, fresh)
    np.testing.assert_array_equal(second, fresh)
    # another process with the same graphs reads the same entry
    other = Rerenderer(cache=tmp_path, max_side=4096, threads=1)
    np.testing.assert_array_equal(other(small), fresh)
    assert (other.cache.hits, other.cache.misses) == (1, 0)


def test_the_key_is_the_pixels_and_the_graphs(small, tmp_path):
    cache = Rerenderer(cache=tmp_path).cache
    moved = small.copy()
    moved[0, 0, 0] ^= 1
    assert cache.key(small) == cache.key(small.copy())
    assert cache.key(moved) != cache.key(small)
    assert cache.key(small) != cache.key(np.ascontiguousarray(small.reshape(160 * 128, 1, 3)))
    another = type(cache)(tmp_path, cache.model.replace("taef2:", "taef2:x"))
    assert another.key(small) != cache.key(small)


def test_a_damaged_entry_is_computed_again_and_replaced(small, tmp_path):
    rerender = Rerenderer(cache=tmp_path)
    fresh = rerender(small)
    (entry,) = tmp_path.glob("*/*.npy")
    entry.write_bytes(b"\x93NUMPY half a file")
    np.testing.assert_array_equal(rerender(small), fresh)
    assert rerender.cache.misses == 2
    np.save(entry, np.zeros((3, 3, 3), np.uint8))  # a readable array of the wrong shape
    np.testing.assert_array_equal(rerender(small), fresh)
    assert rerender.cache.misses == 3 and not list(tmp_path.glob("*/*.part"))


def test_the_shared_rerenderer_keeps_round_trips_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kept"))
    assert get_rerenderer(96).cache.folder == tmp_path / "kept"
    monkeypatch.delenv(CACHE_ENV)
    assert get_rerenderer(96).cache is None
