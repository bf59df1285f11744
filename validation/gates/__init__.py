"""Gates, built by name from the spec.

Each gate is one module that owns its thresholds model and ends with one registration line
(``GATES.register(name, ConfigModel, GateClass, order=...)``, see
:mod:`counterfactory.manifests.registry`); the spec validates ``gates.<kind>.<name>`` against
that model and :class:`~counterfactory.validation.judge.GateStack` builds the configured gates
in registry order. Importing this package registers the built-in gates.
"""

from __future__ import annotations

from counterfactory.validation.gates import attribute, expression, face, identity, locality, skin  # noqa: F401
