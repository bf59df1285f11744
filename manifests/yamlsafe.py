"""YAML with limits: a spec or metadata file cannot make the loader (or what reads its result) explode.

``yaml.safe_load`` shares aliased nodes, so a "billion laughs" file of a few hundred bytes
loads quickly, and then every consumer that walks the result (pydantic validation, JSON
dumps, hashing, an error message's ``repr``) expands it: 3 GB of memory for one spec. Here the
composed node graph is measured as it would expand, in nodes and in the characters of its
scalars, before anything is constructed, and refused above either limit: a 2 MB file aliasing
a 1 MB string a million times is a terabyte once expanded, though only a million nodes.

A key written twice in one mapping is an error too (``yaml.safe_load`` keeps the last one
silently, so a spec would run with a value its author overwrote by mistake).
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

from counterfactory.manifests.errors import CounterfactoryError

#: a spec or metadata file larger than this is refused unread (bytes)
MAX_YAML_BYTES = 64 * 1024 * 1024
#: scalars, sequences and mappings after expanding every alias
MAX_YAML_NODES = 2_000_000
#: characters of every scalar (keys included) after expanding every alias: no more than the
#: largest file read, so aliases never make a document larger than one written out
MAX_YAML_EXPANDED_CHARS = MAX_YAML_BYTES
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
#: the most characters a number literal may have (10**39 has 40): no field takes a longer one,
#: and one of more than 4,300 digits would stop Python's int conversion with a ``ValueError``
#: deep in the loader; a shorter one reaches its field, which refuses it with its own limit
MAX_NUMBER_CHARS = 40


#: libyaml's parser where PyYAML was built with it (its wheels are): composing a 1,000-source
#: metadata file took 0.71 s in Python, 0.14 s in C, the same document; it refuses nesting past
#: 1,000 levels itself (a ``yaml.YAMLError``), where Python's would run out of stack
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlLimitError(CounterfactoryError, ValueError):
    """The YAML is over a size limit; the message says which and by how much."""


class YamlDuplicateKeyError(CounterfactoryError, ValueError):
    """A mapping of the YAML names one key twice; the message names the key and both lines.

    Attributes:
        key: the key as written.
        line: the 1-based line of its second occurrence.
        first_line: the 1-based line of its first.
    """

    def __init__(self, key: str, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line
        super().__init__(
            f"line {line}: the key {brief(key, 60)} appears twice in one mapping (first on line {first_line}); "
            "YAML would keep only the last value: remove or rename one"
        )


def brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, computed without building the whole repr
    (a value of a million aliased megabyte strings costs a few hundred characters here)."""
    shorter = reprlib.Repr()
    shorter.maxstring = shorter.maxother = max(limit, 12)
    shorter.maxlist = shorter.maxtuple = shorter.maxdict = shorter.maxset = 6
    shorter.maxlevel = 3
    text = shorter.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expanded_size(node: yaml.Node) -> int:
    """Number of nodes ``node`` becomes once every alias is expanded (linear in the graph's size)."""
    return _expanded(node, {})[0]


def _expanded(node: yaml.Node, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(nodes, scalar characters)`` of ``node`` once every alias is expanded."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = (1, 0)  # a recursive alias counts once here; the constructor handles recursion itself
    nodes, chars = 1, 0
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            n, c = _expanded(child, memo)
            nodes, chars = nodes + n, chars + c
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            kn, kc = _expanded(k, memo)
            vn, vc = _expanded(v, memo)
            nodes, chars = nodes + kn + vn, chars + kc + vc
    else:
        chars = len(str(node.value))
    memo[key] = (nodes, chars)
    return nodes, chars


def number_error(line: int | None, written: str, field: str | None = None) -> YamlLimitError:
    """The refusal of a number literal over :data:`MAX_NUMBER_CHARS`, written ``written`` on
    ``line`` (1-based; None: unknown) at ``field`` (dotted; None: unknown); the message shows
    at most 24 characters of it."""
    shown = f"{written[:12]}...{written[-6:]}" if len(written) > 24 else written
    where = " ".join(
        x for x in (f"line {line}" if line is not None else "", f"(field `{field}`)" if field else "") if x
    )
    return YamlLimitError(
        f"{where + ': ' if where else ''}the number {shown} is {len(written):,} characters long, over the limit "
        f"of {MAX_NUMBER_CHARS}; no field takes a number that large: write the value the field needs"
    )


def check_number(node: yaml.ScalarNode, field: str | None = None) -> None:
    """Refuse a number (int or float) literal over :data:`MAX_NUMBER_CHARS` before it is
    converted.

    Raises:
        YamlLimitError: naming the line, the field and the number, cut short.
    """
    if node.tag in (_INT_TAG, _FLOAT_TAG) and len(str(node.value)) > MAX_NUMBER_CHARS:
        raise number_error(node.start_mark.line + 1, str(node.value), field)


def json_int(text: str) -> int:
    """``int(text)`` for :func:`json.loads`' ``parse_int``, refused over :data:`MAX_NUMBER_CHARS`.

    Raises:
        YamlLimitError: (a ``ValueError``) naming the number, cut short.
    """
    if len(text) > MAX_NUMBER_CHARS:
        raise number_error(None, text)
    return int(text)


def check_duplicate_keys(node: yaml.Node) -> None:
    """Raise :class:`YamlDuplicateKeyError` for the first mapping that writes one scalar key twice
    (merge keys ``<<`` aside: what they bring in may be overridden, as YAML says), and
    :class:`YamlLimitError` for a number literal too long for any field (:func:`check_number`)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(node, "")]
    while stack:
        current, field = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.ScalarNode):
            check_number(current, field or None)
        elif isinstance(current, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for k, v in current.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
                    where = (k.tag, k.value)
                    if where in first:
                        raise YamlDuplicateKeyError(k.value, k.start_mark.line + 1, first[where])
                    first[where] = k.start_mark.line + 1
                name = str(k.value)[:40] if isinstance(k, yaml.ScalarNode) else "?"
                stack += [(k, field), (v, f"{field}.{name}" if field else name)]
        elif isinstance(current, yaml.SequenceNode):
            stack += [(child, f"{field}[{i}]") for i, child in enumerate(current.value)]


def check_node(node: yaml.Node, *, max_nodes: int = MAX_YAML_NODES, max_chars: int = MAX_YAML_EXPANDED_CHARS) -> None:
    """Refuse a composed document over the expanded limits, or with a key written twice.

    Raises:
        YamlLimitError: over a limit, or nested too deeply to measure.
        YamlDuplicateKeyError: a mapping names one key twice.
    """
    try:
        nodes, chars = _expanded(node, {})
    except RecursionError:
        raise YamlLimitError("it is nested too deeply to read; flatten it") from None
    if nodes > max_nodes:
        raise YamlLimitError(
            f"its anchors and aliases expand to {nodes:,} values, over the limit of {max_nodes:,} "
            "(an alias bomb?); write the values out or use fewer nested aliases"
        )
    if chars > max_chars:
        raise YamlLimitError(
            f"its anchors and aliases expand to {chars:,} characters of text, over the limit of {max_chars:,} "
            "(an alias bomb?); write the values out or use fewer aliases of long values"
        )
    check_duplicate_keys(node)


def load_with_node(
    text: str, *, max_nodes: int = MAX_YAML_NODES, max_chars: int = MAX_YAML_EXPANDED_CHARS
) -> tuple[Any, yaml.Node | None]:
    """``(yaml.safe_load(text), its composed node)``, refused over a limit or with a key twice
    (:func:`check_node`); the node gives line numbers.

    Raises:
        YamlLimitError: the text or its expansion is over a limit.
        YamlDuplicateKeyError: a mapping names one key twice.
        yaml.YAMLError: not valid YAML.
    """
    if len(text) > MAX_YAML_BYTES:
        raise YamlLimitError(f"the file is {len(text):,} characters, over the limit of {MAX_YAML_BYTES:,}")
    loader = _LOADER(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlLimitError("it is nested too deeply to read; flatten it") from None
        if node is None:
            return None, None
        check_node(node, max_nodes=max_nodes, max_chars=max_chars)
        return loader.construct_document(node), node
    finally:
        loader.dispose()


def safe_load_limited(text: str, *, max_nodes: int = MAX_YAML_NODES, max_chars: int = MAX_YAML_EXPANDED_CHARS) -> Any:
    """``yaml.safe_load(text)``, refused when aliases would expand it beyond ``max_nodes`` nodes
    or ``max_chars`` characters of scalars, or when a mapping names one key twice.

    Raises:
        YamlLimitError: over the limit (an "alias bomb", or a file far larger than a spec needs).
        YamlDuplicateKeyError: a mapping names one key twice (the message names it and its lines).
        yaml.YAMLError: not valid YAML.
    """
    return load_with_node(text, max_nodes=max_nodes, max_chars=max_chars)[0]
