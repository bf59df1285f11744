"""YAML with limits: a spec or metadata file cannot make the loader (or what reads its result) explode.

``yaml.safe_load`` shares aliased nodes, so a "billion laughs" file of a few hundred bytes
loads quickly, and then every consumer that walks the result (pydantic validation, JSON
dumps, hashing) expands it: 3 GB of memory for one spec. Here the composed node graph is
measured as it would expand, before anything is constructed, and refused above a limit.
"""

from __future__ import annotations

from typing import Any

import yaml

from counterfactory.manifests.errors import CounterfactoryError

#: a spec or metadata file larger than this is refused unread (bytes)
MAX_YAML_BYTES = 64 * 1024 * 1024
#: scalars, sequences and mappings after expanding every alias
MAX_YAML_NODES = 2_000_000


class YamlLimitError(CounterfactoryError, ValueError):
    """The YAML is over a size limit; the message says which and by how much."""


def expanded_size(node: yaml.Node, memo: dict[int, int] | None = None) -> int:
    """Number of nodes ``node`` becomes once every alias is expanded (linear in the graph's size)."""
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once here; the constructor handles recursion itself
    if isinstance(node, yaml.SequenceNode):
        total = 1 + sum(expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    else:
        total = 1
    memo[key] = total
    return total


def safe_load_limited(text: str, *, max_nodes: int = MAX_YAML_NODES) -> Any:
    """``yaml.safe_load(text)``, refused when aliases would expand it beyond ``max_nodes`` nodes.

    Raises:
        YamlLimitError: over the limit (an "alias bomb", or a file far larger than a spec needs).
        yaml.YAMLError: not valid YAML.
    """
    if len(text) > MAX_YAML_BYTES:
        raise YamlLimitError(f"the file is {len(text):,} characters, over the limit of {MAX_YAML_BYTES:,}")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            size = expanded_size(node)
        except RecursionError:
            raise YamlLimitError("it is nested too deeply to read; flatten it") from None
        if size > max_nodes:
            raise YamlLimitError(
                f"its anchors and aliases expand to {size:,} values, over the limit of {max_nodes:,} "
                "(an alias bomb?); write the values out or use fewer nested aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()
