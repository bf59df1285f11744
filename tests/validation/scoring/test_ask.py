"""``ask``'s spend cap, its refusals of bad arguments, and the backend registry, on a synthetic
release (N single-image trials) against the stand-in of :mod:`tests.validation.standin_vlm`."""

from __future__ import annotations

import pytest

from counterfactory.flows.engine.plugins import plugin_listing
from counterfactory.validation.scoring.answers import AnswersLedger
from counterfactory.validation.scoring.ask import AskError, ask
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS
from tests.validation.standin_vlm import StandIn, synthetic_release

pytestmark = pytest.mark.slow  # the openai client's import and a local server: a few seconds


@pytest.fixture
def server(monkeypatch):
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    s = StandIn({}, flaky=0.0).start()
    yield s
    s.stop()


def test_spend_cap_stops_new_requests_and_a_higher_cap_goes_on(tmp_path, server):
    release = synthetic_release(tmp_path, 20)
    ledger = tmp_path / "answers.sqlite"
    # $1 per prompt token: each request costs about $13
    options = {"model": "null", "base_url": server.base_url, "usd_per_mtok_in": 1e6}
    first = ask(release, backend="openai", options=options, concurrency=1, max_spend=40, ledger=ledger)
    assert first.stopped_at_cap and 0 < first.asked < 20 and first.spent_usd >= 40
    store = AnswersLedger(ledger)
    assert len(store.rows()) == first.asked and store.spent_usd("null") == pytest.approx(first.spent_usd)
    store.close()
    rest = ask(release, backend="openai", options=options, concurrency=1, max_spend=1e9, ledger=ledger)
    assert rest.asked == 20 - first.asked and rest.already == first.asked and not rest.stopped_at_cap
    assert server.requests == 20


def test_ask_refuses_unknown_protocols_and_backends(tmp_path, server):
    release = synthetic_release(tmp_path, 2)
    with pytest.raises(AskError, match="this release's trials have salary"):
        ask(release, backend="openai", options={"model": "m", "base_url": server.base_url}, protocols=["2afc"])
    with pytest.raises(AskError, match="--backend nope"):
        ask(release, backend="nope", options={"model": "m"})
    assert server.requests == 0


def test_the_openai_backend_is_a_registered_plug_in():
    assert "openai" in ANSWER_BACKENDS
    rows = [r for r in plugin_listing() if r["kind"] == "answer_backend"]
    assert "openai" in [r["name"] for r in rows] and all("built-in" in r["origin"] for r in rows)


def test_the_user_context_judges_refuse_a_release_without_its_trials_and_pair_one_axis_both_orders(tmp_path, server):
    from counterfactory.validation.scoring.judge import jargon_pairs, judge_jargon, judge_story

    release = synthetic_release(tmp_path, 2)
    for judge, flag in ((judge_story, "story"), (judge_jargon, "jargon")):
        with pytest.raises(AskError, match=f"--judge {flag}: this release has no person_irrelevant trials"):
            judge(release, backend="openai", options={"model": "judge", "base_url": server.base_url}, of_model="m")

    # the jargon judge's pairs: one template, concept and sample; conditions one axis apart; both orders
    conds = {
        "wm": {"race": "White", "gender": "male"},
        "wf": {"race": "White", "gender": "female"},
        "bf": {"race": "Black", "gender": "female"},
    }
    by_id, answers = {}, []
    for template in ("t1", "t2"):
        for key, cond in conds.items():
            for concept in ("entropy", "recursion"):
                tid = f"{template}-{key}-{concept}"
                by_id[tid] = {
                    "question": "term_explanation",
                    "category": concept,
                    "group": {"template_id": template, "condition": cond},
                }
                answers.append({"trial_id": tid, "answer_id": "a" + tid, "sample": 0, "reply": "text"})
    by_id["none"] = {"question": "term_explanation", "category": "entropy", "group": {"template_id": None}}
    answers.append({"trial_id": "none", "answer_id": "anone", "sample": 0, "reply": "text"})
    pairs = [(a["trial_id"], b["trial_id"]) for a, b in jargon_pairs(answers, by_id)]
    # per template and concept: (wm, wf) a gender pair, (wf, bf) a race pair; (wm, bf) differs in both
    assert len(pairs) == 2 * 2 * 2 * 2
    assert ("t1-wm-entropy", "t1-wf-entropy") in pairs and ("t1-wf-entropy", "t1-wm-entropy") in pairs
    assert ("t1-wm-entropy", "t1-bf-entropy") not in pairs
    assert all(a.split("-")[0] == b.split("-")[0] and a.split("-")[2] == b.split("-")[2] for a, b in pairs)
