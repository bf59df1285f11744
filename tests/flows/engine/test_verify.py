"""Every verifying command goes through the engine (``flows/engine/verify.py``), which hands the
derived-file check to ``verify``, ``release export``, ``push`` and ``pull`` (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest

from counterfactory.flows.engine import verify as engine_verify
from counterfactory.manifests import hub
from counterfactory.manifests.release_verify import verify_release
from counterfactory.validation.release_derived import check_derived
from tests.manifests.hub_release import make_release


@pytest.mark.slow  # a release built and verified three times: ~3 s
def test_verify_runs_the_checks_it_is_handed_and_the_engine_hands_it_the_derived_one(tmp_path, monkeypatch):
    release = make_release(tmp_path)
    seen: list[tuple[Path, str]] = []

    def spy(path: Path, info: dict, written: dict) -> list[str]:
        seen.append((Path(path), str(info["name"])))
        return ["spy: a problem"]

    assert "spy: a problem" in verify_release(release, checks=[spy])
    assert seen == [(release, "study")]
    assert "spy: a problem" not in verify_release(release)
    assert engine_verify.DERIVED_CHECKS == (check_derived,)
    assert engine_verify.verify_release(release) == []
    # export, push and pull pass the same checks (and the card its editors' caveats)
    handed: dict[str, dict] = {}
    for name in ("export_release", "push_release", "pull_release"):
        monkeypatch.setattr(hub, name, lambda *a, _n=name, **kw: handed.setdefault(_n, kw))
    engine_verify.export_release(release, tmp_path / "x", repo_id="o/n")
    engine_verify.push_release(release, "o/n")
    engine_verify.pull_release("o/n@1.0.0", tmp_path / "y")
    assert {n: kw["checks"] for n, kw in handed.items()} == dict.fromkeys(handed, (check_derived,))
    assert len(handed) == 3
    assert handed["export_release"]["caveat_of"] is engine_verify.editor_caveat
    assert handed["push_release"]["caveat_of"] is engine_verify.editor_caveat


def test_an_editor_caveat_comes_from_its_options_and_an_unknown_backend_has_none():
    assert engine_verify.editor_caveat("no-such-editor") is None
    # the demo editor declares its caveat in its own words; a real editor declares none
    assert "NO real demographic change" in engine_verify.editor_caveat("classical")
    assert engine_verify.editor_caveat("qwen") is None
