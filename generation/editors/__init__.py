"""Editor backends, chosen by name from the spec.

Each backend is one module that imports its heavy dependency inside, once, and ends with one
registration line (``EDITORS.register(name, OptionsModel, EditorClass)``, see
:mod:`.registry`); the spec validates ``editor.<name>`` against that
options model. ``make_editor`` raises :class:`SetupError` for an unknown name and lists the
valid ones.
"""

from __future__ import annotations

from typing import Any

from counterfactory.generation.editors.base import EditJournal, Editor, EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import MemoryJournal


def make_editor(name: str, options: Any) -> Editor:
    """Build the backend called ``name`` with its options model (not yet prepared).

    Raises:
        SetupError: no backend of that name is registered; the message lists the valid ones.
    """
    return EDITORS.get(name).factory(options)


# the built-in backends register themselves (one line at the end of each module); their heavy
# dependencies are imported inside, on prepare()
from counterfactory.generation.editors import classical, fal, imported, qwen  # noqa: E402, F401

__all__ = [
    "EDITORS",
    "EditJournal",
    "EditRequest",
    "EditResult",
    "Editor",
    "MemoryJournal",
    "SetupError",
    "make_editor",
]
