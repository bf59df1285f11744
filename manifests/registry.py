"""Where plug-ins register: editor backends, gates, trial protocols and release files.

Each kind is a :class:`Registry` of the same shape: a name, an options model and a factory,
plus what the pipeline needs to know without building the plug-in (an editor's
:class:`EditorCapabilities`, a gate's stack order). A new plug-in is one module that ends with
one registration line::

    EDITORS.register("mine", MineOptions, MineEditor, capabilities=EditorCapabilities(paid=True))
    GATES.register("mine", MineGateConfig, MineGate, order=70)
    TRIAL_PROTOCOLS.register("mine", MineProtocolOptions, MineProtocol)
    RELEASE_FILES.register("mine.jsonl", MineFileOptions, MineFile)
    ANSWER_BACKENDS.register("mine", MineBackendOptions, MineBackend)

The spec reads these registries to validate ``editor.<backend>``, ``gates.<kind>.<gate>`` and
``trials.protocols``; the gate stack is built from ``GATES`` in its order; concurrency limits,
Ray resources and the stop handler read an editor's capabilities; the trial bank and the
release read their registries; so nothing else changes when a plug-in is added.

A registry imports, once, on first use, the modules that hold its built-in plug-ins (each
module registers itself on import), then every installed package's plug-ins: each entry point
of the group ``counterfactory.plugins`` names a module whose import registers them
(:func:`load_entry_points`). Which modules hold the built-ins the package root says
(:data:`counterfactory.BUILT_IN_MODULES`, by the registry's ``kind``): this module is the bottom
layer and names no module above it.

The spec's sections are registered the same way (:data:`SPEC_SECTIONS`): each module that owns
a section's model ends with ``SPEC_SECTIONS.register("sources", SourcesConfig)``, and the spec
(:mod:`counterfactory.manifests.spec`) types its fields with :func:`section`.
"""

from __future__ import annotations

import contextvars
import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema

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


def device_gpus(options: Any) -> dict[str, float]:
    """Ray resources of an editor whose options may name a ``device``: one GPU per edit task
    on ``cuda``, none otherwise (and for options without a device)."""
    device = str(getattr(options, "device", "cpu"))
    return {"num_gpus": 1.0 if device.startswith("cuda") else 0.0}


def _one_request(options: Any) -> int:
    return 1


@dataclass(frozen=True)
class EditorCapabilities:
    """What the pipeline needs to know about an editor backend, declared where it registers.

    Attributes:
        batch_size: ``batch_size(options)``: requests handed over at once, for an editor that
            has no ``batch_size`` of its own.
        limit: the global concurrency limit its batches hold: ``"gpu"`` (``run.gpu_slots``) or
            ``"fal"`` (``run.fal_max_concurrency``); None holds none.
        per_request: the limit counts requests in flight (a remote account), not batches (a GPU).
        paid: each request costs money (a remote service).
        resources: ``resources(options)``: Ray resources of one edit task (``num_gpus``) when
            ``run.ray`` sets none.
        cancel_in_flight: ``cancel_in_flight(timeout_s) -> ids``: cancels the paid requests this
            process has in flight, for a stop (Ctrl-C, SIGTERM); bounded by ``timeout_s`` and safe
            in a signal handler.
    """

    batch_size: Callable[[Any], int] = _one_request
    limit: str | None = None
    per_request: bool = False
    paid: bool = False
    resources: Callable[[Any], dict[str, float]] = device_gpus
    cancel_in_flight: Callable[[float], Sequence[str]] | None = None


@dataclass(frozen=True)
class EditorPlugin(Plugin):
    """A registered editor backend with its :class:`EditorCapabilities`."""

    capabilities: EditorCapabilities = field(default_factory=EditorCapabilities)

    def describe(self) -> dict[str, Any]:
        caps = self.capabilities
        out: dict[str, Any] = {"paid": caps.paid}
        if caps.limit:
            out["limit"] = caps.limit + (" per request" if caps.per_request else " per batch")
        if caps.resources is not device_gpus:
            out["resources"] = _qualname(caps.resources)
        if caps.cancel_in_flight is not None:
            out["cancel_in_flight"] = _qualname(caps.cancel_in_flight)
        return out


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
    """Plug-ins of one kind, by name (``what`` names the kind in messages, ``kind`` in listings)."""

    plugin_type: type[Plugin] = Plugin

    def __init__(self, what: str, kind: str) -> None:
        self.what = what
        self.kind = kind
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
                from counterfactory import BUILT_IN_MODULES

                for module in BUILT_IN_MODULES.get(self.kind, ()):
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


class EditorRegistry(Registry):
    """Editor backends by name, each with its :class:`EditorCapabilities`."""

    def register(
        self,
        name: str,
        options: type[BaseModel],
        factory: Callable[[Any], Any],
        *,
        capabilities: EditorCapabilities | None = None,
    ) -> EditorPlugin:
        """Add the backend ``name``: ``factory(options) -> Editor``, with what it declares.

        Raises:
            ValueError: ``name`` is taken by another factory, or ``capabilities.limit`` is
                neither ``"gpu"`` nor ``"fal"``.
        """
        capabilities = capabilities or EditorCapabilities()
        if capabilities.limit not in (None, "gpu", "fal"):
            raise ValueError(
                f"editor {name!r}: capabilities.limit must be 'gpu', 'fal' or None, not {capabilities.limit!r}"
            )
        plugin = EditorPlugin(name, options, factory, capabilities=capabilities)
        self._add(plugin)
        return plugin

    def get(self, name: str) -> EditorPlugin:
        return cast(EditorPlugin, super().get(name))

    def batch_size_of(self, editor: Any) -> int:
        """Requests to hand ``editor`` at once: its own ``batch_size``, else what its backend
        declared (``EditorCapabilities.batch_size`` of its options; ``1`` by default)."""
        size = getattr(editor, "batch_size", None)
        if size is None and getattr(editor, "options", None) is not None:
            size = self.capabilities(str(getattr(editor, "name", ""))).batch_size(editor.options)
        return max(1, int(size or 1))

    def capabilities(self, name: str) -> EditorCapabilities:
        """What the backend ``name`` declared (the defaults for an unknown name, e.g. a test double)."""
        if name not in self:
            return EditorCapabilities()
        return self.get(name).capabilities


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

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"order": self.order}
        if self.opt_in:
            out["opt_in"] = True
        if self.backend_keys:
            out["backend_keys"] = list(self.backend_keys)
        return out


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
        plugin = GatePlugin(name, options, factory, "", tuple(backend_keys), opt_in, order)
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


class SectionRegistry(Registry):
    """The spec's sections by field name, each the pydantic model of the module that owns it."""

    def register(self, name: str, model: type[BaseModel] | Callable[[], type[BaseModel]]) -> Plugin:  # type: ignore[override]
        """Add the section ``name``: its model, or a function returning it (for a module that
        cannot import the model's own module at its import)."""
        return self._add(Plugin(name, BaseModel, model))

    def model(self, name: str) -> type[BaseModel]:
        """The model of the section ``name``.

        Raises:
            SetupError: no module registered it.
        """
        factory = self.get(name).factory
        return factory if isinstance(factory, type) else factory()


@dataclass(frozen=True)
class _SectionAt:
    """Pydantic metadata: validate with the model the spec section ``name`` registered, looked
    up when the schema is first built."""

    name: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return handler.generate_schema(SPEC_SECTIONS.model(self.name))


def section(name: str) -> Any:
    """A field type validated by the model of the spec section ``name`` (:data:`SPEC_SECTIONS`).

    The spec (this bottom layer) declares its sections this way, so that loading the spec
    module imports no pipeline code: the registry loads the sections' modules when a model
    holding the field builds its schema, which ``defer_build=True`` puts off until the first
    validation. Values are instances of the registered model.
    """
    return Annotated[Any, _SectionAt(name)]


def _qualname(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


#: editor backends: ``factory(options) -> Editor``
EDITORS = EditorRegistry("editor backend", "editor")
#: gates: ``factory(options) -> Gate``; options hold the thresholds (per edit kind in the spec)
GATES = GateRegistry("gate", "gate")
#: trial protocols: ``factory(options) -> protocol`` (:class:`counterfactory.manifests.trials.TrialProtocol`);
#: options from ``trials.options.<name>``
TRIAL_PROTOCOLS = Registry("trial protocol", "trial_protocol")
#: optional release files: ``factory(options) -> release file``
#: (:class:`counterfactory.manifests.release_files.ReleaseFile`); options from ``release.files.<name>``
RELEASE_FILES = Registry("release file", "release_file")
#: answer backends (``counterfactory ask --backend NAME``): ``factory(options) -> backend``
#: (the ``AnswerBackend`` of ``validation/scoring/backends.py``)
ANSWER_BACKENDS = Registry("answer backend", "answer_backend")
#: the spec's sections above this layer, by field name (``sources``, ``design``, ...): the model
#: of the module that owns each (:func:`section`)
SPEC_SECTIONS = SectionRegistry("spec section", "spec_section")
#: what ``verify`` re-derives beyond the release's own files: ``factory(release, info, written
#: spec) -> problems`` (``stats.json`` and ``report.html``, by the code that wrote them)
RELEASE_CHECKS = Registry("release check", "release_check")
#: every registry, in the order ``counterfactory plugins`` lists them
REGISTRIES = (EDITORS, GATES, TRIAL_PROTOCOLS, RELEASE_FILES, ANSWER_BACKENDS)


def plugin_listing() -> list[dict[str, Any]]:
    """Every registered plug-in of every kind (loading the built-ins and the installed
    packages' entry points): ``kind``, ``name``, ``origin`` and what it declares, by kind then name.

    Raises:
        PluginError: an installed plug-in failed to import.
    """
    rows = []
    for registry in REGISTRIES:
        for plugin in registry.plugins():
            rows.append({"kind": registry.kind, "name": plugin.name, "origin": plugin.origin, **plugin.describe()})
    return rows
