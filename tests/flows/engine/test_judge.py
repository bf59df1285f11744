"""The engine's judge (``flows/engine/judge.py``) reads the noise floor's output from the run's
store once per template: the image the floor names, or nothing when it names none or the store
lost it (the cells are then judged on the floor's measures alone)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from counterfactory.flows.engine.judge import floor_image
from counterfactory.manifests.store import ImageStore


def test_the_floor_image_is_the_stored_output_the_floor_names(tmp_path):
    store = ImageStore(tmp_path / "store")
    image = np.random.default_rng(3).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    sha = store.put(image)
    ws = SimpleNamespace(store=store)
    got = floor_image(ws, {"image_sha256": sha, "changed_share": 0.01})
    assert got is not None and np.array_equal(got, image)
    assert floor_image(ws, None) is None
    assert floor_image(ws, {"changed_share": 0.01}) is None  # a floor measured without an output
    assert floor_image(ws, {"image_sha256": "0" * 64}) is None  # named, but not in this store
