"""The editor backends' registry, kept with the editors: :data:`EDITORS`, each backend with the
:class:`EditorCapabilities` it declares where it registers.

A backend is one module ending in ``EDITORS.register(name, OptionsModel, EditorClass,
capabilities=...)``. The built-in ones (``classical``, ``fal``, ``imported``, ``qwen``) are
imported by this package's ``__init__``, which Python runs before this module, so whoever
imports :data:`EDITORS` finds them; another package's come by its ``counterfactory.plugins``
entry point (:mod:`counterfactory.manifests.registry`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel

from counterfactory.manifests.registry import Plugin, Registry, qualname


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
            out["resources"] = qualname(caps.resources)
        if caps.cancel_in_flight is not None:
            out["cancel_in_flight"] = qualname(caps.cancel_in_flight)
        return out


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


#: editor backends: ``factory(options) -> Editor``
EDITORS = EditorRegistry("editor backend", "editor")
