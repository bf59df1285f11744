"""One vocabulary of verdicts and statuses (issue 46): ``manifests/vocabulary.py`` spells each word
once; every other package module compares through its names, and the words stored are unchanged."""

from __future__ import annotations

import ast
import subprocess

from counterfactory.manifests import lifecycle, review, vocabulary
from counterfactory.validation.gates import base
from tests.conftest import REPO

PACKAGE_DIRS = ("flows/", "generation/", "validation/", "manifests/", "counterfactory/")
#: modules allowed a literal comparison for now, with how many (none left; a new entry needs a reason)
NOT_YET: dict[str, int] = {}


def _literals(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def spelled_in_comparisons(source: str) -> list[str]:
    """``line: code`` of every comparison (``==``, ``!=``, ``in``, ``not in``, SQL ``.in_()``) that
    spells one of :data:`~counterfactory.manifests.vocabulary.WORDS` as a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        sides: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("in_", "notin_")
        ):
            sides = list(node.args)
        if any(c.value in vocabulary.WORDS for side in sides for c in _literals(side)):
            found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def _package_modules() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if p.startswith(PACKAGE_DIRS) and p != "manifests/vocabulary.py"]


def test_no_module_spells_a_verdict_or_status_in_a_comparison():
    modules = _package_modules()
    assert len(modules) > 100, "the walk found too few modules: the rule would be vacuous"
    found = {p: spelled_in_comparisons((REPO / p).read_text()) for p in modules}
    found = {p: lines for p, lines in found.items() if lines}
    late = {p: lines for p, lines in found.items() if len(lines) > NOT_YET.get(p, 0)}
    assert not late, f"compare with counterfactory.manifests.vocabulary's names, not literals: {late}"
    # an entry that is gone leaves the list
    assert not set(NOT_YET) - set(found), sorted(set(NOT_YET) - set(found))


def test_the_check_sees_each_way_of_spelling_a_word():
    seen = spelled_in_comparisons(
        "a = v == 'accepted'\n"
        "b = s in ('ok', 'refused')\n"
        "c = select(R).where(R.verdict.in_(['accepted', 'needs_review']))\n"
        "d = 'failed' != s\n"
        "e = v == ACCEPTED\n"
        "f = x == 'accept'\n"
    )
    assert sorted(line.split(":")[0] for line in seen) == ["1", "2", "3", "4"]


def test_the_words_are_the_stored_strings_and_one_object_everywhere():
    # what ledgers, releases and schemas hold: byte-identical to the strings written before
    assert vocabulary.VERDICTS == ("accepted", "needs_review", "rejected", "failed")
    assert vocabulary.FILLING_VERDICTS == ("accepted", "needs_review")
    assert vocabulary.FINISHED_ATTEMPT == ("ok", "refused")
    assert vocabulary.OUTCOME == {"accept": "accepted", "reject": "rejected"}
    assert all(type(w) is str for w in vocabulary.WORDS)
    # the lifecycle's filling rule, the review queue's and the gates' are the vocabulary's own
    assert lifecycle.FILLING_VERDICTS is vocabulary.FILLING_VERDICTS is base.FILLING_VERDICTS
    assert review.OUTCOME is vocabulary.OUTCOME and base.VERDICTS is vocabulary.VERDICTS
