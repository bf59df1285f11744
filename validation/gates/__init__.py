"""Gates, built by name from the spec.

Each gate is one module that owns its thresholds model and ends with one registration line
(``GATES.register(name, ConfigModel, GateClass, order=...)``, :mod:`.registry`); the spec
validates ``gates.<kind>.<name>`` against that model and
:class:`~counterfactory.validation.gate_stack.GateStack` builds the configured gates in registry
order. Importing this package registers the built-in gates (the imports below).
"""

from __future__ import annotations

from counterfactory.validation.gates import attribute, expression, face, identity, locality, skin  # noqa: F401
from counterfactory.validation.gates.registry import GATES, GatePlugin, GateRegistry

__all__ = ["GATES", "GatePlugin", "GateRegistry"]
