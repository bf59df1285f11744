"""Gates, built by name from the spec.

Each gate is one module that owns its thresholds model and ends with one registration line
(``GATES.register(name, ConfigModel, GateClass, order=...)``, see
:mod:`counterfactory.manifests.registry`); the spec validates ``gates.<kind>.<name>`` against
that model and :class:`~counterfactory.validation.gate_stack.GateStack` builds the configured gates
in registry order. Importing this package registers the built-in gates.
"""

from __future__ import annotations

from pydantic import BaseModel

from counterfactory.manifests.registry import SPEC_SECTIONS
from counterfactory.validation.gates import attribute, expression, face, identity, locality, skin  # noqa: F401


def _gates_section() -> type[BaseModel]:
    """The spec's ``gates``: :class:`~counterfactory.validation.gate_stack.GatesConfig`, the gate
    stack's settings (its module imports this package, so it is looked up when first needed)."""
    from counterfactory.validation.gate_stack import GatesConfig

    return GatesConfig


SPEC_SECTIONS.register("gates", _gates_section)
