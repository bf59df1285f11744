"""The answer backends' registry (``validation/scoring/registry.py``): the built-in backends
load on first use, each options model takes a model, an unknown name lists the valid ones, and a
plug-in registered by a module is listed until unregistered."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from counterfactory.manifests.errors import SetupError
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS


def test_the_built_in_backends_and_an_unknown_name():
    assert {"fal", "openai", "transformers"} <= set(ANSWER_BACKENDS.names())
    for name in ("fal", "openai", "transformers"):
        plugin = ANSWER_BACKENDS.get(name)
        assert plugin.origin.startswith("built-in counterfactory.validation.scoring.")
        assert "model" in plugin.options.model_fields  # every backend is told which model answers
    with pytest.raises(SetupError, match=r"unknown answer backend 'opnai'; valid: .*fal.*openai.*transformers"):
        ANSWER_BACKENDS.get("opnai")


def test_a_registered_backend_is_listed_until_unregistered():
    class EchoOptions(BaseModel):
        model: str

    class Echo:
        def __init__(self, options: EchoOptions) -> None:
            self.options = options

    ANSWER_BACKENDS.register("echo-test", EchoOptions, Echo)
    try:
        assert "echo-test" in ANSWER_BACKENDS
        built = ANSWER_BACKENDS.get("echo-test").factory(EchoOptions(model="m"))
        assert isinstance(built, Echo) and built.options.model == "m"
    finally:
        ANSWER_BACKENDS.unregister("echo-test")
    assert "echo-test" not in ANSWER_BACKENDS
