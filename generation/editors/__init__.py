"""Editor backends, chosen by name from the spec.

Each backend is one module that imports its heavy dependency inside, once. ``make_editor``
raises for an unknown name and lists the valid ones.
"""

from __future__ import annotations

import importlib
from typing import Any

from counterfactory.generation.editors.base import (
    EditJournal,
    Editor,
    EditorSetupError,
    EditRequest,
    EditResult,
    MemoryJournal,
)

#: backend name -> "module:Class"
BACKENDS: dict[str, str] = {
    "classical": "counterfactory.generation.editors.classical:ClassicalEditor",
    "qwen": "counterfactory.generation.editors.qwen:QwenEditor",
    "fal": "counterfactory.generation.editors.fal:FalEditor",
}


def make_editor(name: str, options: Any) -> Editor:
    """Build the backend called ``name`` with its options model (not yet prepared)."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise EditorSetupError(
            f"unknown editor backend {name!r}; valid backends: {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(options)


__all__ = [
    "BACKENDS",
    "EditJournal",
    "EditRequest",
    "EditResult",
    "Editor",
    "EditorSetupError",
    "MemoryJournal",
    "make_editor",
]
