"""The engine composes what the bottom layer cannot name (issue 46): the spec's upper sections
typed with their owners' models, and the editor registry the ``editor`` section validates against
(``flows/engine/spec.py``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from counterfactory.flows.engine.spec import EditorConfig, NamedEditorConfig, Spec
from counterfactory.generation.align import AlignConfig
from counterfactory.generation.editors import EDITORS
from counterfactory.generation.masks import MaskOptions
from counterfactory.generation.prompts import PromptConfig
from counterfactory.generation.sampling import DesignConfig
from counterfactory.generation.sources import SourcesConfig
from counterfactory.manifests import spec as bottom
from counterfactory.validation.gate_stack import GatesConfig


def test_the_spec_types_its_upper_sections_with_their_owners_models():
    owners = {
        "sources": SourcesConfig,
        "design": DesignConfig,
        "prompts": PromptConfig,
        "masks": MaskOptions,
        "align": AlignConfig,
        "gates": GatesConfig,
    }
    assert {name: Spec.model_fields[name].annotation for name in owners} == owners
    assert Spec.model_fields["editor"].annotation is EditorConfig
    assert EditorConfig.backends is EDITORS and NamedEditorConfig.backends is EDITORS


def test_the_editor_section_validates_backends_only_against_the_registry_it_is_given():
    # the bottom layer's own section knows no backend: it keeps what was written
    assert bottom.EditorConfig.backends is None
    assert bottom.EditorConfig.model_validate({"backend": "nowhere", "nowhere": {"x": 1}}).backend == "nowhere"
    with pytest.raises(ValidationError, match="one of the registered editor backends: "):
        EditorConfig.model_validate({"backend": "nowhere"})
    with pytest.raises(ValidationError, match="not a known field or registered editor backend"):
        EditorConfig.model_validate({"backend": "classical", "nowhere": {}})
    assert type(EditorConfig.model_validate({}).options()) is EDITORS.get("classical").options
