"""Where plug-ins register: editor backends and gates, each with its options model.

A new editor backend or gate is one module that ends with one registration line::

    EDITORS.register("mine", MineOptions, MineEditor)
    GATES.register("mine", MineGateConfig, MineGate, order=70)

The spec reads these registries to validate ``editor.<backend>`` and ``gates.<kind>.<gate>``
sections, and the gate stack is built from ``GATES`` in its order, so nothing else changes
when a plug-in is added. This module is the bottom layer:
it imports no pipeline code. A registry imports its ``home`` package once, on first use, which
registers the built-in plug-ins (each backend module registers itself on import).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, cast

from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema

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
        return self._add(Plugin(name, options, factory))

    def _add(self, plugin: Plugin) -> Plugin:
        name, factory = plugin.name, plugin.factory
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


@dataclass(frozen=True)
class GatePlugin(Plugin):
    """A registered gate: besides name, options model and factory, how the spec fills it in.

    Attributes:
        backend_keys: option names whose calibrated values belong to the backend they were
            measured with; a spec that picks another backend does not inherit them.
        opt_in: the gate stays off unless the spec configures it (it needs files the user
            supplies, such as a classifier).
        order: where the gate runs in the stack (lower first); reasons and results follow it.
    """

    backend_keys: tuple[str, ...] = ()
    opt_in: bool = False
    order: int = 100


class GateRegistry(Registry):
    """Gates by name; :meth:`plugins` lists them in stack order."""

    def register(
        self,
        name: str,
        options: type[BaseModel],
        factory: Callable[[Any], Any],
        *,
        backend_keys: tuple[str, ...] = (),
        opt_in: bool = False,
        order: int = 100,
    ) -> GatePlugin:
        """Add the gate ``name``: ``factory(options) -> Gate``, ``options`` its thresholds model.

        Raises:
            ValueError: ``name`` is taken by another factory, or is ``kind`` (the spec's own
                field beside the gates).
        """
        if name == "kind":
            raise ValueError("a gate cannot be called 'kind' (gates.<kind>.kind names the edit kind)")
        plugin = GatePlugin(name, options, factory, tuple(backend_keys), opt_in, order)
        self._add(plugin)
        return plugin

    def get(self, name: str) -> GatePlugin:
        return cast(GatePlugin, super().get(name))

    def plugins(self) -> list[GatePlugin]:
        """Every registered gate in stack order (``order``, then name)."""
        self._load()
        with self._lock:
            plugins = [p for p in self._plugins.values() if isinstance(p, GatePlugin)]
        return sorted(plugins, key=lambda p: (p.order, p.name))


@dataclass(frozen=True)
class _ModelAt:
    """Pydantic metadata: validate with the model ``module:name``, imported when first needed."""

    module: str
    name: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        model = getattr(importlib.import_module(self.module), self.name)
        return handler.generate_schema(model)


def model_at(module: str, name: str) -> Any:
    """A field type validated by the pydantic model ``name`` of ``module``, imported lazily.

    The spec (this bottom layer) declares its sections this way, so that loading the spec
    module imports no pipeline code: the section's module is imported when a model holding the
    field builds its schema, which ``defer_build=True`` puts off until the first validation.
    Values are instances of the named model; static type checkers see the real class through
    an ``if TYPE_CHECKING`` import beside it.
    """
    return Annotated[Any, _ModelAt(module, name)]


def _qualname(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


#: editor backends: ``factory(options) -> Editor``
EDITORS = Registry("editor backend", "counterfactory.generation.editors")
#: gates: ``factory(options) -> Gate``; options hold the thresholds (per edit kind in the spec)
GATES = GateRegistry("gate", "counterfactory.validation.gates")
