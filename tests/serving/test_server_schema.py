"""schemathesis against `chunkbench serve`'s own OpenAPI document: the document says what the server
does. Schema-valid requests (positive) and schema-violating ones (negative) for every operation, bounded: no 5xx,
no status code or content type the document does not list, responses that match their schemas, no schema-valid
request refused except by the limits a schema cannot state (prompt + max_tokens under max_model_len, counted in
tokens), every schema-violating body refused, and an engine that is idle and healthy after."""

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from chunkbench.serving.limits import ServerLimits
from tests.serving.test_server import idle
from tests.serving.test_server_hardening import running_server

EXAMPLES = int(os.environ.get("CHUNKBENCH_SCHEMA_EXAMPLES", "150"))  # bounded in the suite; raise it to hunt
MAX_MODEL_LEN = 64  # short requests, whatever max_tokens they ask for
# What a schema cannot state, so a schema-valid request may still get it (each message names both numbers).
CROSS_FIELD = (
    "maximum context length",
    "more than this server takes",
    "more than max_model_len",
    "min_tokens must be an integer from 0 to max_tokens",
)


@pytest.fixture(scope="module")
def server():
    with running_server(ServerLimits(max_prompt_chars=512), max_model_len=MAX_MODEL_LEN) as (url, app, _, _):
        yield url, app


def test_the_document_states_the_limits_and_answers(server):
    url, _ = server
    doc = httpx.get(url + "/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]
    assert set(completions["responses"]) == {"200", "400", "408", "413", "500", "503"}
    assert set(completions["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(doc["paths"]["/health"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    body = doc["components"]["schemas"]["CompletionBody"]["properties"]
    ids, vocab = body["prompt"]["anyOf"][1], httpx.get(url + "/v1/models").json()["data"][0]["vocab_size"]
    assert ids["maxItems"] == MAX_MODEL_LEN - 1 and ids["items"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": vocab - 1,
    }
    assert body["prompt"]["anyOf"][0]["minLength"] == 1 and body["prompt"]["anyOf"][0]["maxLength"] == 512
    assert body["top_p"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert body["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}
    assert body["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": MAX_MODEL_LEN - 1}
    assert body["repetition_penalty"]["anyOf"] == [{"const": 1.0}, {"type": "null"}]
    seed = body["seed"]["anyOf"][0]  # 2**63 - 1 reached FastAPI's document as the float 2**63, which is refused
    assert -(2**63) <= seed["minimum"] and seed["maximum"] <= 2**63 - 1, seed
    assert "422" not in str(doc) and "2.0 is refused" in doc["info"]["description"]


def has_whole_float(value) -> bool:
    """2.0 for an integer: JSON Schema admits it, the server's strict models do not (its document says so)."""
    if isinstance(value, dict):
        return any(has_whole_float(v) for v in value.values())
    if isinstance(value, list):
        return any(has_whole_float(v) for v in value)
    return isinstance(value, float) and value.is_integer()


def cases(url: str):
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [op.ok() for op in schema.get_all_operations()]
    return st.one_of(
        [
            op.as_strategy(generation_mode=mode)
            for op in operations
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )


def test_schemathesis_finds_the_server_doing_what_its_document_says(server):
    url, app = server
    seen = {"positive 200": 0, "negative 400": 0}

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=cases(url))
    def check(case):
        response = case.call(base_url=url, timeout=30)
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
        positive = case.meta.generation.mode.is_positive
        if positive and response.status_code == 400:  # refused only for what the schema cannot state
            message = response.json()["error"]["message"]
            whole_float = "valid integer" in message and has_whole_float(case.body)  # the document says so
            assert whole_float or any(reason in message for reason in CROSS_FIELD), (case.body, message)
        if positive and response.status_code == 200:
            seen["positive 200"] += 1
        if not positive and response.status_code == 400:
            seen["negative 400"] += 1

    check()
    print(f"\nschemathesis: {seen}")
    assert seen["positive 200"] > 10 and seen["negative 400"] > 10  # both kinds were really exercised
    assert idle(app.state.engine) == 0 and app.state.engine.healthy
    assert httpx.get(url + "/health").text == "ok"
