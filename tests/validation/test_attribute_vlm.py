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
from tests.validation.pairs import make_pair  # noqa: E402

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
        **{"estimated_usd_per_question": ESTIMATE, "poll_interval_s": 0.02, "backoff_s": 0.01, **fal},
    )


def _pair(image: np.ndarray) -> PairContext:
    return make_pair(image, image, extras={"condition": dict(ASKED)})


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
    assert config.answer_backend == "fal" and config.temperature == 0
    assert config.answer_options.endpoint == ENDPOINT and config.answer_options.reasoning is False
    assert config.answer_options.estimated_usd_per_question > PRICE  # conservative by default
    with pytest.raises(ValueError, match="needs model"):
        AttributeGateConfig(backend="vlm", labels=LABELS)
    with pytest.raises(ValueError, match="deprecated.*openrouter/router/vision"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", endpoint="fal-ai/any-llm/vision")
    with pytest.raises(ValueError, match="estimated_usd_per_question"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", estimated_usd_per_question=-1)
    with pytest.raises(ValueError, match=r"labels.race lacks \['Latino'\]"):
        check_label_map(_config(), {"race": ["White", "Latino"], "gender": ["female"]})


class _ChatServer:
    """An OpenAI-compatible chat endpoint on 127.0.0.1: scripted replies per image (by its
    pixels, as the fal stand-in keys them), the default answer otherwise, ``usage`` token counts."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answers: dict[str, str] = {}
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                import base64
                import io
                import json

                from PIL import Image

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                parts = body["messages"][0]["content"]
                url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
                pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
                text = server.answers.get(_pixels_key(pixels), '{"race": "White", "gender": "male"}')
                reply = {
                    "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 20},
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def answer(self, pixels: np.ndarray, text: str) -> None:
        self.answers[_pixels_key(pixels)] = text

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _pixels_key(pixels: np.ndarray) -> str:
    import hashlib

    a = np.ascontiguousarray(pixels, dtype=np.uint8)
    return hashlib.sha256(repr(a.shape).encode() + a.tobytes()).hexdigest()


def test_the_same_verdicts_through_an_openai_compatible_server(server):
    """The gate asks through ``ask``'s answer backends by name: the scripted answers give the
    same reviews through the fal stand-in and through an OpenAI-compatible server, whose
    token counts at the configured price (1000 in at 0.5 USD/Mtok + 20 out at 2 USD/Mtok =
    0.00054 USD) are what the journal records."""
    pytest.importorskip("openai")
    images = {name: _image(i) for i, name in enumerate(ANSWERS)}
    chat = _ChatServer()
    try:
        for name, image in images.items():
            server.answer(image, ANSWERS[name])
            chat.answer(image, ANSWERS[name])
        on_fal = AttributeGate(_config(), journal=MemoryJournal())
        journal = MemoryJournal()
        config = AttributeGateConfig(
            backend="vlm",
            answer_backend="openai",
            labels=LABELS,
            model="local-vlm",
            base_url=chat.base_url,
            usd_per_mtok_in=0.5,
            usd_per_mtok_out=2.0,
            backoff_s=0.01,
        )
        on_openai = AttributeGate(config, journal=journal)
        fal_reviews = {name: on_fal(_pair(image)).review for name, image in images.items()}
        results = {name: on_openai(_pair(image)) for name, image in images.items()}
        assert {name: r.review for name, r in results.items()} == fal_reviews
        assert fal_reviews["wrong"] == ("attribute_mismatch",) and fal_reviews["correct"] == ()
        assert all(r.metrics["vlm_raw"] == ANSWERS[name] for name, r in results.items())
        assert results["correct"].metrics["vlm_cost_usd"] == pytest.approx(0.00054)
        assert journal.spent_usd() == pytest.approx(0.00054 * len(ANSWERS))
        sent = chat.bodies[0]
        assert sent["model"] == "local-vlm" and sent["temperature"] == 0
        assert '"race": <label>' in sent["messages"][0]["content"][-1]["text"]
        # asked again with the same journal: read back, nothing sent
        again = AttributeGate(config, journal=journal)
        assert {n: again(_pair(im)).review for n, im in images.items()} == fal_reviews
        assert len(chat.bodies) == len(ANSWERS)
        on_openai.classifier.close()
    finally:
        chat.close()


def test_a_bad_answer_backend_is_one_error_naming_the_field(tmp_path, specs_dir):
    import yaml

    from counterfactory.flows.engine.spec import SpecError, load_spec

    with pytest.raises(ValueError, match=r"answer_backend: unknown answer backend 'fall'; valid: .*fal.*openai"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", answer_backend="fall")
    with pytest.raises(ValueError, match=r"answer_backend 'openai' options: base_ur: Extra inputs"):
        AttributeGateConfig(backend="vlm", labels=LABELS, model="m", answer_backend="openai", base_ur="x")
    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    data["gates"]["face"]["attribute"] = {"backend": "vlm", "labels": LABELS, "model": "m", "answer_backend": "fall"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    problems = [line for line in str(caught.value).splitlines() if "gates.face.attribute" in line]
    assert len(problems) == 1 and "answer_backend: unknown answer backend 'fall'; valid: fal, openai" in problems[0]
