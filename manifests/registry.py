"""The generic plug-in registry and the loading of installed packages' plug-ins.

A :class:`Registry` holds plug-ins of one kind by name: an options model and a factory, plus
what the pipeline needs to know without building the plug-in (an editor's capabilities, a
gate's stack order, declared by the subclass its kind keeps). Each registry lives with its
kind, in the layer that owns it, as diffusers keeps its pipeline mappings in ``pipelines/``:

    EDITORS            generation/editors/registry.py    (built-ins: generation/editors/__init__.py)
    GATES              validation/gates/registry.py      (built-ins: validation/gates/__init__.py)
    ANSWER_BACKENDS    validation/scoring/registry.py
    TRIAL_PROTOCOLS    manifests/trials.py               (built-ins: manifests/protocols/)
    RELEASE_FILES      manifests/release_files.py

A new plug-in is one module that ends with one registration line::

    EDITORS.register("mine", MineOptions, MineEditor, capabilities=EditorCapabilities(paid=True))
    GATES.register("mine", MineGateConfig, MineGate, order=70)

A registry may name the modules holding its built-in plug-ins (``built_ins``), modules of its
own layer, imported once on first use (each registers itself on import); a registry whose
package imports its built-ins statically names none. Then come every installed package's
plug-ins: each entry point of the group ``counterfactory.plugins`` names a module whose import
registers them (:func:`load_entry_points`).

This module is the bottom layer: it names no module and reads no table of modules above it
(``tests/test_imports.py``).
"""

from __future__ import annotations

import contextvars
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from counterfactory.manifests.errors import SetupError

#: the entry-point group an installed package declares its plug-in modules in
ENTRY_POINT_GROUP = "counterfactory.plugins"


class PluginError(SetupError):
    """An installed plug-in cannot be loaded; the message names its distribution and module."""


#: class attributes a trial protocol or release file declares, listed by ``counterfactory plugins``
_DECLARED = ("paper", "unit", "needs_biographies", "description")


@dataclass(frozen=True)
class Plugin:
    """One registered plug-in: its name, its options model and what builds it from options.

    Attributes:
        origin: where it comes from, for ``counterfactory plugins``: ``built-in <module>``,
            ``<distribution> <version> (<module>)`` for one an entry point loaded, or
            ``module <module>`` for one registered by importing a module directly.
    """

    name: str
    options: type[BaseModel]
    factory: Callable[[Any], Any]
    origin: str = field(default="", compare=False)

    def describe(self) -> dict[str, Any]:
        """What the plug-in declares besides its name and origin (``counterfactory plugins``):
        the declarations its factory class sets (a trial protocol's ``paper``, ``unit`` and
        ``needs_biographies``, a release file's ``description``)."""
        declared = {key: getattr(self.factory, key, None) for key in _DECLARED}
        return {key: value for key, value in declared.items() if value not in (None, "", False)}


#: ``(distribution, top-level package)`` of the entry point being imported: registrations from
#: that package record the distribution (a built-in it imports on the way stays built-in)
_LOADING: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "counterfactory_plugin_loading", default=None
)
_ENTRY_LOCK = threading.RLock()
_entry_state: dict[str, Any] = {"loaded": False, "error": None}


def load_entry_points() -> None:
    """Import, once per process, every module the installed packages name in the
    ``counterfactory.plugins`` entry-point group; their imports register their plug-ins.

    Raises:
        PluginError: a module failed to import (again on every later call, so that no run
            goes on without a plug-in it may name); the message names the distribution.
    """
    from importlib.metadata import entry_points

    with _ENTRY_LOCK:
        if _entry_state["loaded"]:
            if _entry_state["error"] is not None:
                raise _entry_state["error"]
            return
        _entry_state["loaded"] = True
        for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
            dist = getattr(point, "dist", None)
            where = f"{dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
            module = point.value.split(":", 1)[0].strip()
            token = _LOADING.set((where, module.split(".", 1)[0]))
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any failure of a plug-in's import is reported as its own
                error = PluginError(
                    f"plug-in {point.name!r} of distribution {where} failed to import its module {point.value!r}: "
                    f"{type(exc).__name__}: {exc}; fix or uninstall that package"
                )
                _entry_state["error"] = error
                raise error from exc
            finally:
                _LOADING.reset(token)


def _origin_of(factory: Callable[..., Any]) -> str:
    module = str(getattr(factory, "__module__", "?"))
    loading = _LOADING.get()
    if loading is not None and module.split(".", 1)[0] == loading[1]:
        return f"{loading[0]} ({module})"
    if module == "counterfactory" or module.startswith("counterfactory."):
        return f"built-in {module}"
    return f"module {module}"


class Registry:
    """Plug-ins of one kind, by name (``what`` names the kind in messages, ``kind`` in listings).

    ``built_ins``: the modules (of the registry's own layer) that hold its built-in plug-ins,
    imported once on first use; empty where the registry's package imports them itself.
    """

    plugin_type: type[Plugin] = Plugin

    def __init__(self, what: str, kind: str, *, built_ins: tuple[str, ...] = ()) -> None:
        self.what = what
        self.kind = kind
        self.built_ins = tuple(built_ins)
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
        if not plugin.origin:
            object.__setattr__(plugin, "origin", _origin_of(factory))
        with self._lock:
            existing = self._plugins.get(name)
            if existing is not None and qualname(existing.factory) != qualname(factory):
                raise ValueError(
                    f"{self.what} {name!r} is already registered by {qualname(existing.factory)}; choose another name"
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
                for module in self.built_ins:
                    importlib.import_module(module)
        load_entry_points()

    def registered(self) -> list[Plugin]:
        """The plug-ins registered so far, loading nothing (safe in a signal handler)."""
        with self._lock:
            return list(self._plugins.values())

    def plugins(self) -> list[Plugin]:
        """Every registered plug-in, by name."""
        self._load()
        with self._lock:
            return [self._plugins[n] for n in sorted(self._plugins)]

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


def qualname(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"
