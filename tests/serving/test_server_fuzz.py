"""Adversarial traffic against a real `chunkbench serve` on loopback: poisoned requests mixed into normal
load, and property-based fuzzing of the request bodies. The server must answer every request (a bad one
with a 4xx, never a 500), keep serving, and hold no KV blocks once idle."""

import asyncio
import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from chunkbench.serving.limits import ServerLimits
from tests.serving.test_server import idle
from tests.serving.test_server_hardening import running_server

NORMAL_OK = 200


@pytest.fixture(scope="module")
def server():
    # max_model_len 64 keeps every fuzzed request short, whatever max_tokens it asks for.
    with running_server(ServerLimits(), max_model_len=64) as (url, app, _, _):
        yield url, app


def normal_request(i: int) -> tuple[str, bytes]:
    stream = i % 3 == 0
    if i % 2:
        body = {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 2 + i % 3, "stream": stream}
        return "/v1/chat/completions", json.dumps(body).encode()
    body = {"prompt": f"request {i}", "max_tokens": 2 + i % 3, "stream": stream}
    if i % 20 == 4:  # tiny temperatures crashed the engine before: now raised to 0.01 and served
        body["temperature"] = 1e-300 if i % 40 == 4 else 1e-45
    return "/v1/completions", json.dumps(body).encode()


BIG = b'{"prompt": "' + b"a" * (10 * 2**20) + b'", "max_tokens": 2}'  # 10 MB
POISON = [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "temperature": Infinity}'),
    ("/v1/completions", b'{"prompt": "\\ud800 hi", "max_tokens": 4}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}], "max_tokens": 4}'),
    ("/v1/completions", BIG),
] * 4


def test_poisoned_requests_among_normal_load(server):
    url, app = server
    requests = [(False, *normal_request(i)) for i in range(200)]
    for k, poison in enumerate(POISON):  # spread through the load
        requests.insert(10 * k + 5, (True, *poison))

    async def run():
        gate = asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=32)) as client:

            async def one(path, content):
                async with gate:
                    response = await client.post(path, content=content, headers={"content-type": "application/json"})
                    return response.status_code, response.text

            return await asyncio.gather(*(one(path, content) for _, path, content in requests))

    started = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - started
    normal = [r for (poisoned, *_), r in zip(requests, results) if not poisoned]
    poisoned = [r for (poisoned, *_), r in zip(requests, results) if poisoned]
    assert len(normal) == 200 and len(poisoned) == 20
    assert all(status == NORMAL_OK and "error" not in text for status, text in normal), [
        r for r in normal if r[0] != NORMAL_OK
    ][:3]
    assert all(400 <= status < 500 for status, _ in poisoned), [s for s, _ in poisoned]
    assert idle(app.state.engine) == 0 and app.state.engine.healthy
    print(f"\n220 requests (20 poisoned) at concurrency 32: {elapsed:.1f} s")


CHARS = st.characters(exclude_categories=()) | st.sampled_from("\ud800\udfff\x00")  # lone surrogates often
TEXT = st.text(CHARS, max_size=30)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | TEXT
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(CHARS, max_size=6), inner, max_size=4),
    max_leaves=12,
)


def field(plausible):
    """A plausible value (often a valid one) three times in four, else any JSON at all."""
    return st.integers(0, 3).flatmap(lambda k: JSON if k == 0 else plausible)


COMMON = {
    "model": field(TEXT),
    "max_tokens": field(st.integers(-3, 6)),
    "temperature": field(st.floats(-1, 3)),
    "top_p": field(st.floats(-0.5, 1.5)),
    "seed": field(st.integers()),
    "ignore_eos": field(st.booleans()),
    "stream": field(st.booleans()),
    "n": field(st.just(1)),
    "user": field(TEXT),
    "stream_options": field(st.fixed_dictionaries({"include_usage": field(st.booleans())})),
}
MESSAGE = st.fixed_dictionaries({"role": field(st.sampled_from(["user", "system"])), "content": field(TEXT)})
FIELDS = {
    "/v1/completions": ("prompt", {**COMMON, "prompt": field(TEXT | st.lists(st.integers(-5, 600), max_size=20))}),
    "/v1/chat/completions": (
        "messages",
        {
            **COMMON,
            "messages": field(st.lists(MESSAGE, min_size=1, max_size=3)),
            "max_completion_tokens": field(st.integers(-2, 6)),
        },
    ),
}


@st.composite
def bodies(draw):
    path = draw(st.sampled_from(sorted(FIELDS)))
    required, fields = FIELDS[path]
    keys = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=4))
    body = {k: draw(fields[k]) for k in [required, *keys]}
    if draw(st.integers(0, 3)) == 0:  # an unknown field now and then
        body[draw(st.text(CHARS, max_size=8))] = draw(JSON)
    return path, json.dumps(body).encode()  # NaN/Infinity and lone surrogates written as Python's json does


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=bodies())
def test_fuzzed_bodies_get_200_or_400_never_500(server, request):
    url, _ = server
    path, content = request
    response = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    event(f"HTTP {response.status_code}")
    assert response.status_code in (200, 400), (response.status_code, response.text[:300], content[:300])
    if response.status_code == 400:
        assert response.json()["error"]["type"] == "invalid_request_error"


@settings(max_examples=30, deadline=None)
@given(content=st.binary(max_size=200))
def test_fuzzed_raw_bytes_get_400_never_500(server, content):
    url, _ = server
    response = httpx.post(
        url + "/v1/completions", content=content, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code in (200, 400), (response.status_code, response.text[:300], content)


def test_the_engine_still_serves_after_the_fuzzing(server):
    url, app = server
    response = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert idle(app.state.engine) == 0 and httpx.get(url + "/health").text == "ok"
