"""The one exception type for "this run cannot start here".

Every setup failure (a missing model file or optional dependency, no GPU, a bad or missing API
key, an unknown backend or gate name, a missing prompt template or calibration) raises
:class:`SetupError` before any work is done or paid for, with a message that says what is
wrong and how to fix it. The command line catches this one type.
"""

from __future__ import annotations


class SetupError(RuntimeError):
    """A run cannot start on this machine or with this spec; the message names the fix."""
