"""``counterfactory plugins``' listing (``flows/engine/plugins.py``): every registry once, each
row naming its kind, name and origin, kinds in the registries' order."""

from __future__ import annotations

from counterfactory.flows.engine.plugins import REGISTRIES, plugin_listing
from counterfactory.generation.editors import EDITORS
from counterfactory.manifests.release_files import RELEASE_FILES
from counterfactory.manifests.trials import TRIAL_PROTOCOLS
from counterfactory.validation.gates import GATES
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS


def test_the_listing_names_every_kind_once_in_order():
    rows = plugin_listing()
    kinds = [r.kind for r in REGISTRIES]
    assert len(set(kinds)) == len(kinds) == 5
    seen = list(dict.fromkeys(row["kind"] for row in rows))
    assert seen == [k for k in kinds if k in seen]  # grouped by kind, in the registries' order
    by_kind = {}
    for row in rows:
        assert row["name"] and row["origin"]
        by_kind.setdefault(row["kind"], set()).add(row["name"])
    assert {"fal", "openai", "transformers"} <= by_kind["answer_backend"]
    assert "attribute" in by_kind[REGISTRIES[1].kind]  # the gates' registry holds the attribute gate


def test_every_registry_is_listed_once():
    assert REGISTRIES == (EDITORS, GATES, TRIAL_PROTOCOLS, RELEASE_FILES, ANSWER_BACKENDS)
    assert {"classical", "qwen", "fal", "import"} <= set(EDITORS.names())
    assert {"openai", "fal", "transformers"} <= set(ANSWER_BACKENDS.names())
    assert {"2afc", "salary"} <= set(TRIAL_PROTOCOLS.names())
