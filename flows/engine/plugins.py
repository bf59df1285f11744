"""Every registry of plug-ins, where the layers meet: what ``counterfactory plugins`` lists.

Each registry lives with its kind (:mod:`counterfactory.manifests.registry` keeps the generic
class and the entry-point loading); this module, above every layer, is the one place that names
them all.
"""

from __future__ import annotations

from typing import Any

from counterfactory.generation.editors import EDITORS
from counterfactory.manifests.registry import Registry
from counterfactory.manifests.release_files import RELEASE_FILES
from counterfactory.manifests.trials import TRIAL_PROTOCOLS
from counterfactory.validation.gates import GATES
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS

#: every registry, in the order ``counterfactory plugins`` lists them
REGISTRIES: tuple[Registry, ...] = (EDITORS, GATES, TRIAL_PROTOCOLS, RELEASE_FILES, ANSWER_BACKENDS)


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
