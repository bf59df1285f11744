"""The gates' registry, kept with the gates: :data:`GATES`, each gate with its stack order.

A gate is one module ending in ``GATES.register(name, ThresholdsModel, GateClass, order=...)``.
The built-in ones are imported by this package's ``__init__``, which Python runs before this
module, so whoever imports :data:`GATES` finds them; another package's come by its
``counterfactory.plugins`` entry point (:mod:`counterfactory.manifests.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel

from counterfactory.manifests.registry import Plugin, Registry


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


#: gates: ``factory(options) -> Gate``; options hold the thresholds (per edit kind in the spec)
GATES = GateRegistry("gate", "gate")
