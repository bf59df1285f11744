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
