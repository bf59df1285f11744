"""What can go wrong with a study's inputs, as exception types (no I/O, no parsing here).

:class:`SourceError` is one photo's problem (it becomes a ``FailedSource`` value);
:class:`MetadataError` makes a whole metadata file unusable and lists every
:class:`MetadataProblem` in it, naming entry, field, expected and received value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from counterfactory.manifests.errors import CounterfactoryError


class SourceError(CounterfactoryError):
    """One photo cannot be used. ``str(error)`` is ``"<path>: <reason>"``.

    Attributes:
        path: the photo's path as given.
        reason: what is wrong and, where one exists, how to fix it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(str(path), reason)
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class MetadataProblem:
    """One thing wrong in a metadata file.

    Attributes:
        index: 0-based position of the entry (data row for CSV, non-blank line for JSONL);
            ``None`` for problems with the file as a whole.
        id: the entry's ``id`` as written, if it had one.
        line: 1-based line in the file where the entry starts, when known.
        field: dotted path of the field (``"limb_mask.rle.counts"``), or ``None``.
        expected: what the field or file should hold.
        received: what it held, abbreviated.
    """

    index: int | None
    id: str | None
    line: int | None
    field: str | None
    expected: str
    received: str

    def __str__(self) -> str:
        where = []
        if self.index is not None:
            detail = []
            if self.id is not None:
                detail.append(f"id {self.id!r}")
            if self.line is not None:
                detail.append(f"line {self.line}")
            where.append(f"entry {self.index}" + (f" ({', '.join(detail)})" if detail else ""))
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        prefix = ": ".join(where)
        text = f"expected {self.expected}, received {self.received}"
        return f"{prefix}: {text}" if prefix else text


class MetadataError(CounterfactoryError, ValueError):
    """A metadata file cannot be used as a whole.

    The message names the file and, for each problem, the entry (index, id, line), the field,
    what was expected and what was received. ``problems`` holds the same facts as values.
    """

    def __init__(self, path: str | Path, problems: list[MetadataProblem] | tuple[MetadataProblem, ...]):
        super().__init__(str(path), tuple(problems))
        self.path = Path(path)
        self.problems = tuple(problems)

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return f"{self.path}: {self.problems[0]}"
        lines = [f"{self.path}: {len(self.problems)} problems"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)
