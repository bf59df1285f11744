"""Where plug-ins register: editor backends and gates, each with its options model.

A new editor backend or gate is one module that ends with one registration line::

    EDITORS.register("mine", MineOptions, MineEditor)

The spec reads these registries to validate ``editor.<backend>`` and ``gates.<kind>.<gate>``
sections, so nothing else changes when a plug-in is added. This module is the bottom layer:
it imports no pipeline code. A registry imports its ``home`` package once, on first use, which
registers the built-in plug-ins (each backend module registers itself on import).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from counterfactory.manifests.errors import SetupError


@dataclass(frozen=True)
class Plugin:
    """One registered plug-in: its name, its options model and what builds it from options."""

    name: str
    options: type[BaseModel]
    factory: Callable[[Any], Any]


class Registry:
    """Plug-ins of one kind, by name (``what`` names the kind in messages)."""

    def __init__(self, what: str, home: str) -> None:
        self.what = what
        self.home = home
        self._plugins: dict[str, Plugin] = {}
        self._lock = threading.RLock()
        self._loaded = False

    def register(self, name: str, options: type[BaseModel], factory: Callable[[Any], Any]) -> Plugin:
        """Add (or replace, for the same factory reloaded) the plug-in ``name``.

        Raises:
            ValueError: ``name`` is taken by another factory.
        """
        plugin = Plugin(name, options, factory)
        with self._lock:
            existing = self._plugins.get(name)
            if existing is not None and _qualname(existing.factory) != _qualname(factory):
                raise ValueError(
                    f"{self.what} {name!r} is already registered by {_qualname(existing.factory)}; choose another name"
                )
            self._plugins[name] = plugin
        return plugin

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a plug-in for their own run)."""
        with self._lock:
            self._plugins.pop(name, None)

    def _load(self) -> None:
        with self._lock:
            if not self._loaded:
                self._loaded = True
                importlib.import_module(self.home)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load()
        with self._lock:
            return sorted(self._plugins)

    def __contains__(self, name: object) -> bool:
        self._load()
        with self._lock:
            return name in self._plugins

    def get(self, name: str) -> Plugin:
        """The plug-in ``name``.

        Raises:
            SetupError: no such plug-in; the message lists the valid names.
        """
        self._load()
        with self._lock:
            plugin = self._plugins.get(name)
        if plugin is None:
            raise SetupError(f"unknown {self.what} {name!r}; valid: {', '.join(self.names())}")
        return plugin


def _qualname(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


#: editor backends: ``factory(options) -> Editor``
EDITORS = Registry("editor backend", "counterfactory.generation.editors")
#: gates: ``factory(options) -> Gate``; options hold the thresholds (per edit kind in the spec)
GATES = Registry("gate", "counterfactory.validation.gates")
