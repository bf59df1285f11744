"""Optional release files a plug-in adds: one registered :class:`ReleaseFile` each.

A release file is registered in :data:`RELEASE_FILES` under
its file name (a JSON-lines table at the release's top level)::

    RELEASE_FILES.register("warmth.jsonl", WarmthFileOptions, WarmthFile)

A spec asks for it by name in ``release.files`` (``release.files: {warmth.jsonl: {...}}``, the
value validated by the options model). Publishing builds its rows from the release's other
tables (:class:`ReleaseContext`), validates them against the file's JSON Schema, writes them
with the release's other tables, lists the file in ``release.json``'s ``files`` and ``tables``
and ships the schema in ``schemas/``; ``verify`` checks the rows against the registered schema.
A release whose spec names no such file is written exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from counterfactory.manifests.registry import Registry

#: a release file's name: a top-level JSON-lines table
#: optional release files: ``factory(options) -> release file`` (:class:`ReleaseFile`); options
#: from ``release.files.<name>``; none is built in
RELEASE_FILES = Registry("release file", "release_file")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*\.jsonl$")


@dataclass(frozen=True)
class ReleaseContext:
    """What a release file is built from, once every built-in table is built.

    Attributes:
        spec: the run's spec.
        items: ``items.jsonl`` rows (every cell with its final status and gate results).
        manifest: ``manifest.jsonl`` rows (the accepted items).
        derived: ``derived.jsonl`` rows.
        trials: ``trials.jsonl`` rows.
        stats: ``stats.json`` as it will be written.
    """

    spec: Any
    items: Sequence[dict[str, Any]]
    manifest: Sequence[dict[str, Any]]
    derived: Sequence[dict[str, Any]]
    trials: Sequence[dict[str, Any]]
    stats: dict[str, Any]


class ReleaseFile:
    """One optional release file (built with its options from ``release.files.<name>``).

    Attributes:
        description: one line for ``release.json``'s ``files``.
        schema: the JSON Schema (draft 2020-12) of one row.
    """

    description: str = ""
    schema: dict[str, Any] = {}

    def __init__(self, options: BaseModel) -> None:
        self.options = options

    def build(self, ctx: ReleaseContext) -> list[dict[str, Any]]:
        """The file's rows, in a deterministic order."""
        raise NotImplementedError


def schema_file_name(name: str) -> str:
    """Where a release ships the schema of the release file ``name`` (``schemas/<this>``)."""
    return f"{name.removesuffix('.jsonl')}.schema.json"


def check_name(name: str) -> str:
    """``name`` if it can be a plug-in release file.

    Raises:
        ValueError: not a top-level ``.jsonl`` name.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"release file {name!r}: a plug-in adds a top-level JSON-lines table, named like 'mine.jsonl'")
    return name


def release_file(name: str, options: dict[str, Any] | None = None) -> ReleaseFile:
    """The registered release file ``name`` built with ``options`` (validated by its model).

    Raises:
        SetupError: no release file of that name is registered.
    """
    plugin = RELEASE_FILES.get(name)
    return plugin.factory(plugin.options.model_validate(options or {}))


def registered_schema(name: str) -> dict[str, Any] | None:
    """The row schema of the registered release file ``name`` (None when there is none)."""
    if name not in RELEASE_FILES:
        return None
    return dict(getattr(RELEASE_FILES.get(name).factory, "schema", {}) or {})


def build_release_files(ctx: ReleaseContext) -> dict[str, tuple[list[dict[str, Any]], ReleaseFile]]:
    """``{file name: (rows, release file)}`` for each file the spec's ``release.files`` names,
    in name order (empty when it names none)."""
    out = {}
    for name in sorted(ctx.spec.release.files):
        made = release_file(name, ctx.spec.release.files[name])
        out[name] = (list(made.build(ctx)), made)
    return out


def release_file_entries(built: dict[str, tuple[list[dict[str, Any]], ReleaseFile]]) -> dict[str, str]:
    """``release.json`` ``files`` entries of the built plug-in files and of their schemas."""
    out = {}
    for name, (_, made) in built.items():
        out[name] = made.description or f"{name}: a plug-in's table (schemas/{schema_file_name(name)})"
        out[f"schemas/{schema_file_name(name)}"] = f"the JSON Schema of one {name} row"
    return out
