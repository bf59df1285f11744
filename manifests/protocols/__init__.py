"""The built-in trial protocols, one module each, registered as a plug-in registers its own
(``TRIAL_PROTOCOLS.register(name, OptionsModel, ProtocolClass)`` at the end of its module; the
framework they plug into is :mod:`counterfactory.manifests.trials`). Importing this package
registers them, in the order listed here, which is the order ``left_out.jsonl`` and the
spec's messages list them in.
"""

from __future__ import annotations

# isort: off
from counterfactory.manifests.protocols import focus_2afc  # noqa: F401
from counterfactory.manifests.protocols import focus_mcq  # noqa: F401
from counterfactory.manifests.protocols import focus_salary  # noqa: F401
from counterfactory.manifests.protocols import disability_context  # noqa: F401
from counterfactory.manifests.protocols import limb_pair  # noqa: F401
from counterfactory.manifests.protocols import person_irrelevant  # noqa: F401

# isort: on
