"""Publishing under another version (``flows/engine/release.py``): ``with_version`` gives a spec
that differs in its release version only, and leaves the spec it was given as it was."""

from __future__ import annotations

from counterfactory.flows.engine.release import with_version
from counterfactory.flows.engine.spec import load_spec


def test_a_release_under_another_version(specs_dir):
    spec = load_spec(specs_dir / "demo-face.yaml")
    own = spec.release.version
    assert with_version(spec, None) is spec and with_version(spec, own) is spec
    other = with_version(spec, "9.9.9")
    assert other.release.version == "9.9.9" and spec.release.version == own
    assert other.release.model_dump(exclude={"version"}) == spec.release.model_dump(exclude={"version"})
    assert other.model_dump(exclude={"release"}) == spec.model_dump(exclude={"release"})
