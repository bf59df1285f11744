"""The answer backends' registry (``counterfactory ask --backend NAME``), kept with them.

A backend is one module ending in ``ANSWER_BACKENDS.register(name, OptionsModel, BackendClass)``
(the ``AnswerBackend`` of :mod:`counterfactory.validation.scoring.backends`). The built-in ones
are the modules named below, imported on first use; another package's come by its
``counterfactory.plugins`` entry point (:mod:`counterfactory.manifests.registry`).
"""

from __future__ import annotations

from counterfactory.manifests.registry import Registry

#: answer backends: ``factory(options) -> backend``
ANSWER_BACKENDS = Registry(
    "answer backend",
    "answer_backend",
    built_ins=(
        "counterfactory.validation.scoring.backends",
        "counterfactory.validation.scoring.fal_backend",
        "counterfactory.validation.scoring.transformers_backend",
    ),
)
