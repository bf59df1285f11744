"""counterfactory: a data factory for counterfactual image stimuli.

The repository keeps the folders the pipeline is made of at its top level (``flows/``,
``generation/``, ``validation/``, ``manifests/``, ``assets/``); installed, they are the
subpackages ``counterfactory.flows``, ``counterfactory.generation``, ... of this one package
(``pyproject.toml`` maps them with ``package-dir``), so nothing generic lands in site-packages.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("counterfactory")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+unknown"

#: The modules whose import registers the package's own plug-ins, by the kind of registry they
#: register into (:mod:`counterfactory.manifests.registry`). The registries are the bottom
#: layer and name no module above them; this root, above every layer, says where the built-ins
#: live, and a registry imports these on first use, then the installed packages' entry points.
BUILT_IN_MODULES: dict[str, tuple[str, ...]] = {
    "editor": ("counterfactory.generation.editors",),
    "gate": ("counterfactory.validation.gates",),
    "trial_protocol": ("counterfactory.manifests.protocols",),
    "release_file": ("counterfactory.manifests.release_files",),
    "answer_backend": (
        "counterfactory.validation.scoring.backends",
        "counterfactory.validation.scoring.fal_backend",
        "counterfactory.validation.scoring.transformers_backend",
    ),
    # each module owning a spec section's model registers it (SPEC_SECTIONS)
    "spec_section": (
        "counterfactory.generation.sources",
        "counterfactory.generation.sampling",
        "counterfactory.generation.prompts",
        "counterfactory.generation.masks",
        "counterfactory.generation.align",
        "counterfactory.validation.gates",
    ),
    "release_check": ("counterfactory.validation.release_derived",),
}
