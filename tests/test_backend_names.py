"""Editor-specific behaviour comes from what a backend declares, never from its name.

Read with ``ast``: outside a built-in backend's own module (``generation/editors/``), no module
compares a backend with a built-in backend's name (``spec.editor.backend != "import"``,
``"classical" in backends``). A backend says what the pipeline needs of it where it registers
(:class:`~counterfactory.generation.editors.registry.EditorCapabilities`) or on its options model
(``plan_grid``, ``named_files``, ``release_caveat``, ``audits_imported_set``, ...).
"""

from __future__ import annotations

import ast

from tests.test_imports import modules

BUILT_IN_BACKENDS = {"classical", "import", "fal", "qwen"}
#: the built-in backends' own modules
OWN = "counterfactory.generation.editors."


def _mentions_backend(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        if "backend" in name:
            return True
    return False


def _named_backends(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not _mentions_backend(node):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and sub.value in BUILT_IN_BACKENDS:
                found.append((node.lineno, sub.value))
    return found


def test_no_module_compares_a_backend_with_a_built_in_name():
    found = {
        name: hits
        for name, (path, _) in modules().items()
        if not name.startswith(OWN)
        for hits in [_named_backends(ast.parse(path.read_text(), str(path)))]
        if hits
    }
    assert not found, f"declare it as a capability of the backend instead: {found}"


def test_the_detector_sees_a_backend_named():
    assert _named_backends(ast.parse('if spec.editor.backend != "import":\n    pass\n')) == [(1, "import")]
    assert _named_backends(ast.parse('caveat = "classical" in backends\n')) == [(1, "classical")]
    assert _named_backends(ast.parse('limit = capabilities.limit not in (None, "gpu", "fal")\n')) == []


def test_the_card_says_what_the_backends_that_made_the_items_declare():
    from counterfactory.flows.engine.verify import editor_caveat
    from counterfactory.manifests.hub_card import release_caveats

    (caveat,) = release_caveats(["classical", "qwen", None, "not-installed"], editor_caveat)
    assert "NO real demographic change" in caveat
    assert release_caveats(["qwen", "fal", "import"], editor_caveat) == []
    assert release_caveats(["classical"], None) == []
