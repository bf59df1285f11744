"""The ``vlm`` attribute backend end to end against the local fake fal queue (real HTTPS, the
shared fal queue transport): scripted answers per image, the router's documented input and
output, the real ``usage.cost`` in the journal, the journal on resume, the spend cap."""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.manifests.paid import MemoryJournal
from counterfactory.validation.backends.vlm import load_prompt, parse_answer, render_prompt
from counterfactory.validation.gates.attribute import AttributeGate, AttributeGateConfig, check_label_map
from counterfactory.validation.gates.base import PairContext

pytest.importorskip("fal_client")
pytest.importorskip("trustme")
from tests.generation.fal_server import FalServer  # noqa: E402

ENDPOINT = "openrouter/router/vision"
PRICE = 0.0005595  # usage.cost of the example answer in fal's documentation of the router
ESTIMATE = 0.002
LABELS = {"race": ["White", "Black", "East Asian"], "gender": ["female", "male"]}
ASKED = {"race": "Black", "gender": "female"}
ANSWERS = {
    "correct": '{"race": "Black", "gender": "female"}',
    "fenced": '```json\n{"race": "Black", "gender": "female"}\n```',
    "wrong": '{"race": "White", "gender": "female"}',
    "malformed": "race: Black, gender: female",
    "refusal": "I can't help with identifying the race of real people.",
    "outside": '{"race": "Martian", "gender": "female"}',
}


@pytest.fixture(scope="module")
def server():
    with FalServer(latency_s=0.05, price_usd=PRICE) as fake, fake.patch_environment():
        yield fake


@pytest.fixture(autouse=True)
def _fresh(server):
    server.reset()


def _image(i: int) -> np.ndarray:
    return np.random.default_rng(100 + i).integers(0, 256, (40, 32, 3), dtype=np.uint8)


def _config(**fal) -> AttributeGateConfig:
    return AttributeGateConfig(
        backend="vlm",
        labels=LABELS,
        model="google/gemini-2.5-flash",
        fal={"estimated_usd_per_question": ESTIMATE, "poll_interval_s": 0.02, "backoff_s": 0.01, **fal},
    )


def _pair(image: np.ndarray) -> PairContext:
    return PairContext(
        source=image,
        candidate=image,
        kind="face",
        face_mask=None,
        edit_mask=None,
        source_faces=[],
        candidate_faces=[],
        extras={"condition": dict(ASKED)},
    )


def test_scripted_answers_and_resume_without_paying_again(server):
    images = {name: _image(i) for i, name in enumerate(ANSWERS)}
    for name, image in images.items():
        server.answer(image, ANSWERS[name])
    journal = MemoryJournal()
    gate = AttributeGate(_config(), journal=journal)
    results = {name: gate(_pair(image)) for name, image in images.items()}

    assert results["correct"].review == () and results["correct"].metrics["match_race"] is True
    assert results["fenced"].review == ()
    assert results["wrong"].review == ("attribute_mismatch",)
    assert results["wrong"].metrics["perceived_race"] == "White" and results["wrong"].metrics["match_gender"] is True
    assert results["malformed"].review == ("attribute_vlm_malformed",)
    assert results["refusal"].review == ("attribute_vlm_refused",)
    assert results["outside"].review == ("attribute_vlm_label_invalid",)
    assert "Martian" in results["outside"].metrics["vlm_reason"]
    for name, result in results.items():
        assert result.passed  # a doubt goes to people, never a silent accept or a rejection
        assert result.metrics["vlm_raw"] == ANSWERS[name]  # the raw answer is kept
        assert result.metrics["vlm_cost_usd"] == pytest.approx(PRICE)
    coverage = sum(r.metrics["vlm_status"] == "ok" for r in results.values()) / len(results)
    assert coverage == pytest.approx(3 / 6)
    assert server.stats()["paid_submits"] == len(ANSWERS)
    assert journal.spent_usd() == pytest.approx(PRICE * len(ANSWERS))

    # a new process with the same journal: every question is fetched by its journaled id
    again = AttributeGate(_config(), journal=journal)
    resumed = {name: again(_pair(image)) for name, image in images.items()}
    assert server.stats()["paid_submits"] == len(ANSWERS)
    assert server.stats()["max_paid_per_payload"] == 1
    assert all(r.metrics["vlm_resumed"] for r in resumed.values())
    assert {n: r.review for n, r in resumed.items()} == {n: r.review for n, r in results.items()}


def test_spend_cap_checks_the_estimate_and_counts_the_real_cost(server):
    # By hand: the pre-check adds ESTIMATE (0.002) to what the journal holds, and an answered
    # question journals its usage.cost (PRICE, 0.00056). With a cap of 0.0035 questions 1-3 fit
    # (0 / 0.00056 / 0.00112 spent + 0.002 <= 0.0035) and the 4th does not (0.00168 + 0.002).
    # Counting estimates only, a second question would already be refused (0.004 > 0.0035).
    journal = MemoryJournal()
    gate = AttributeGate(_config(spend_cap_usd=0.0035), journal=journal)
    results = [gate(_pair(_image(i))) for i in range(5)]

    assert [r.metrics["vlm_status"] for r in results] == ["ok"] * 3 + ["failed"] * 2
    assert results[0].review == ("attribute_mismatch",)  # unscripted: the fake's default, White / male
    assert results[3].review == ("attribute_vlm_unanswered",)
    assert "fal_spend_cap_reached" in results[3].metrics["vlm_reason"]
    assert server.stats()["paid_submits"] == 3
    assert journal.spent_usd() == pytest.approx(3 * PRICE) == pytest.approx(server.billed_usd())


def test_questions_follow_the_routers_schema_and_its_cost(server):
    image, odd = _image(7), _image(8)
    server.answer(odd, '{"race": "Black", "gender": "female"}', cost_usd=0.0123)
    journal = MemoryJournal()
    gate = AttributeGate(_config(), journal=journal)
    first, second = gate(_pair(image)), gate(_pair(odd))

    sent = server.jobs[first.metrics["vlm_request_id"]].arguments
    assert sent["model"] == "google/gemini-2.5-flash" and sent["temperature"] == 0
    assert sent["reasoning"] is False and '"race": <label>' in sent["prompt"]
    assert second.metrics["vlm_cost_usd"] == pytest.approx(0.0123)  # usage.cost, not the estimate
    assert journal.spent_usd() == pytest.approx(PRICE + 0.0123)
    # the temperature decides the answer, so it is part of the question's id
    hot = AttributeGate(_config(temperature=1.0), journal=journal)
    assert hot(_pair(image)).metrics["vlm_request_id"] != first.metrics["vlm_request_id"]
    assert server.stats()["paid_submits"] == 3


def test_parse_answer_and_prompt():
    assert parse_answer('{"race": "Black", "gender": "male"}', LABELS) == (
        "ok",
        {"race": "Black", "gender": "male"},
        None,
    )
    assert parse_answer('{"race": "Black"}', LABELS)[0] == "malformed"
    assert parse_answer('["Black", "male"]', LABELS)[0] == "malformed"
    assert parse_answer("", LABELS)[0] == "malformed"
    assert parse_answer('{"race": "black", "gender": "male"}', LABELS)[0] == "invalid_label"
    text = render_prompt(load_prompt("attribute_vlm_v1"), LABELS)
    assert '- race: one of "White", "Black", "East Asian"' in text
    assert '{ "race": <label>, "gender": <label> }' in text and "{LABELS}" not in text
    with pytest.raises(ValueError, match="not found"):
        load_prompt("attribute_vlm_v0")


def test_vlm_config_errors_say_what_to_set():
    config = AttributeGateConfig(backend="vlm", labels=LABELS, model="m")
    assert config.fal.endpoint == ENDPOINT and config.fal.temperature == 0
    assert config.fal.estimated_usd_per_question > PRICE  # conservative by default
    with pytest.raises(ValueError, match="needs model"):
        AttributeGateConfig(backend="vlm", labels=LABELS)
    with pytest.raises(ValueError, match="deprecated.*openrouter/router/vision"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", fal={"endpoint": "fal-ai/any-llm/vision"})
    with pytest.raises(ValueError, match="estimated_usd_per_question"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", fal={"estimated_usd_per_question": -1})
    with pytest.raises(ValueError, match=r"labels.race lacks \['Latino'\]"):
        check_label_map(_config(), {"race": ["White", "Latino"], "gender": ["female"]})
