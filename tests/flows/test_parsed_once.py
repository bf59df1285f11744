"""A run parses its spec once and checks its release version once, whoever starts it.

Counted by behaviour, not by grep: the spec module's YAML parse and every binding of
:func:`~counterfactory.manifests.release.existing_release_conflict` in the loaded package are
wrapped, then ``counterfactory run --publish`` (in this process) and one scheduled run
(:func:`~counterfactory.flows.schedule.regenerate_flow`) go end to end.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.flows.review_setup import write_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """``{"spec parses": n, "version checks": n}`` while the test runs."""
    # every module that could parse a spec or check a version, loaded before the wrappers go in
    import counterfactory.flows.cli  # noqa: F401
    import counterfactory.flows.engine.release  # noqa: F401
    import counterfactory.flows.resume  # noqa: F401
    import counterfactory.flows.run  # noqa: F401
    import counterfactory.flows.schedule  # noqa: F401
    import counterfactory.manifests.release as release
    import counterfactory.manifests.spec as spec_module

    calls: Counter = Counter()
    parse = spec_module.safe_load_limited

    def counting_parse(*args, **kwargs):
        calls["spec parses"] += 1
        return parse(*args, **kwargs)

    monkeypatch.setattr(spec_module, "safe_load_limited", counting_parse)
    check = release.existing_release_conflict

    def counting_check(*args, **kwargs):
        calls["version checks"] += 1
        return check(*args, **kwargs)

    bound = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("counterfactory") and getattr(module, "existing_release_conflict", None) is check
    ]
    assert release in bound
    for module in bound:
        monkeypatch.setattr(module, "existing_release_conflict", counting_check)
    # the command line's stop handlers would end this test process on a signal
    monkeypatch.setattr("counterfactory.flows.cli.install_stop_handlers", lambda: None)
    return calls


def test_counterfactory_run_parses_the_spec_once_and_checks_the_version_once(counted, tmp_path):
    from counterfactory.flows.cli import main

    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    args = ["run", str(spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert (out / "releases" / "review-test" / "0.1.0" / "release.json").is_file()
    assert counted == {"spec parses": 1, "version checks": 1}

    # a settled re-run (no Prefect) is held to the same rule
    counted.clear()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "nothing to run" in result.output
    assert counted == {"spec parses": 1, "version checks": 1}


def test_one_scheduled_run_parses_the_spec_once_and_checks_the_version_once(counted, tmp_path, monkeypatch):
    import counterfactory.flows.engine.sources as sources
    from counterfactory.flows.engine.run_folder import SCHEDULE_LOG
    from counterfactory.flows.schedule import regenerate_flow

    # and checks each source once: the publish step reads back the checks the run kept
    checked: Counter = Counter()
    check = sources._check_source

    def counting_check(spec, item, landmarker):
        checked[item.record.id] += 1
        return check(spec, item, landmarker)

    monkeypatch.setattr(sources, "_check_source", counting_check)
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    result = regenerate_flow.fn(str(spec), str(out), allow_incomplete=True)
    assert result["published"] == "0.1.0"
    (line,) = [json.loads(x) for x in Path(out, SCHEDULE_LOG).read_text().splitlines()]
    assert line["published"] == "0.1.0"
    assert counted == {"spec parses": 1, "version checks": 1}
    assert checked and set(checked.values()) == {1}, checked
