"""`chunkbench serve` under bad input and engine failures: a bad request is a 4xx naming its
field, never a dead engine; a failing step fails only its requests; a dead engine says so on /health."""

import asyncio
import contextlib
import json
import math
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.request import SamplingError, SamplingParams
from prometheus_client.parser import text_string_to_metric_families

from chunkbench import LLM
from chunkbench.serving.limits import ServerLimits
from chunkbench.serving.server import create_app
from tests.conftest import free_port, run_cli
from tests.serving.test_server import idle


@contextlib.contextmanager
def running_server(limits: ServerLimits | None = None, max_model_len: int = 1024):
    """A real uvicorn server on loopback, with the limits' uvicorn settings, as `serve` should run it."""
    limits = limits or ServerLimits()
    config = EngineConfig.create(
        "tiny", policy="chunked", max_num_batched_tokens=128, max_model_len=max_model_len, num_blocks=512
    )
    app = create_app(config, limits=limits)
    uv = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical", **limits.uvicorn_kwargs())
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{uv.config.port}", app, uv, thread
    finally:
        uv.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def server():
    with running_server(ServerLimits(header_timeout_s=1.0, body_timeout_s=1.0)) as (url, app, _, _):
        yield url, app


def post(url: str, content: bytes, path: str = "/v1/completions", **kw) -> httpx.Response:
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=30, **kw)


# ---- 1a: sampling parameters are checked where requests enter ----


@pytest.mark.parametrize(
    "raw, param",
    [
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": NaN}', "temperature"),
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": Infinity}', "temperature"),
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": -0.5}', "temperature"),
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": 2.5}', "temperature"),
        (b'{"prompt": "hi", "max_tokens": 4, "top_p": NaN}', "top_p"),
        (b'{"prompt": "hi", "max_tokens": 4, "top_p": 0}', "top_p"),
    ],
)
def test_bad_sampling_numbers_get_400_naming_the_field(server, raw, param):
    url, app = server
    response = post(url, raw)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert param in response.json()["error"]["message"]
    assert post(url, b'{"prompt": "hi", "max_tokens": 2}').status_code == 200


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 1e-3])
def test_tiny_temperatures_are_raised_to_vllms_floor_and_served(server, temperature):
    url, app = server
    response = post(url, json.dumps({"prompt": "hi", "max_tokens": 4, "temperature": temperature}).encode())
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert app.state.engine.healthy and httpx.get(url + "/health").text == "ok"


def test_sampling_params_checks_reach_llm_and_the_cli(capsys):
    assert SamplingParams(temperature=1e-300).temperature == 0.01  # as vLLM's _MAX_TEMP clamp
    tokens = LLM("tiny", max_model_len=256, num_blocks=64).generate([[1, 2, 3]], max_tokens=3, temperature=1e-45)
    assert len(tokens[0]) == 3
    for kwargs, field in [
        ({"temperature": math.nan}, "temperature"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"seed": 1.5}, "seed"),
    ]:
        with pytest.raises(SamplingError, match=field) as info:
            SamplingParams(**kwargs)
        assert info.value.param == field
    code, _, err = run_cli(["generate", "--model", "tiny", "--prompt-lens", "4", "--temperature", "nan"], capsys)
    assert code == 2 and "temperature" in err


# ---- 2 and 5: strict types, field-named 400s, lone surrogates ----


@pytest.mark.parametrize(
    "path, raw, param",
    [
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}',
            "max_completion_tokens",
        ),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "stream": "yes"}', "stream"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": true}', "max_tokens"),
        ("/v1/completions", b'{"prompt": [1.0, 2.0], "max_tokens": 2}', "prompt.0"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": "1"}', "temperature"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "seed": 1.5}', "seed"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "n": 2}', "n"),
        (
            "/v1/completions",
            b'{"prompt": "hi", "stream": true, "stream_options": {"include_usage": "yes"}}',
            "stream_options.include_usage",
        ),
        ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a\\udfffb"}], "max_tokens": 2}',
            "messages.0.content",
        ),
        ("/v1/completions", b'{"prompt": "hi", "\\ud800": 1}', None),
        ("/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}', None),
    ],
)
def test_every_bad_field_is_a_400_naming_it(server, path, raw, param):
    url, _ = server
    response = post(url, raw, path)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert post(url, b'{"prompt": "hi", "max_tokens": 2}').status_code == 200


# ---- 3: request size and time limits ----


def test_a_body_over_the_limit_is_413_whether_declared_or_chunked(server):
    url, _ = server
    big = b'{"prompt": "' + b"a" * (10 * 2**20) + b'", "max_tokens": 2}'
    assert post(url, big).status_code == 413

    def chunks():
        for _ in range(80):
            yield b"a" * 2**16

    response = httpx.post(url + "/v1/completions", content=chunks(), timeout=30)  # no Content-Length
    assert response.status_code == 413
    assert post(url, b'{"prompt": "hi", "max_tokens": 2}').status_code == 200


def test_a_long_prompt_is_refused_before_tokenizing_and_tokenizing_is_off_the_event_loop(server, monkeypatch):
    url, app = server
    threads = []
    encode = app.state.tokenizer.encode
    monkeypatch.setattr(
        app.state.tokenizer, "encode", lambda text: threads.append(threading.current_thread()) or encode(text)
    )
    response = post(url, json.dumps({"prompt": "a" * (32 * 1024 + 1), "max_tokens": 2}).encode())
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt" and not threads
    assert post(url, b'{"prompt": "hi", "max_tokens": 2}').status_code == 200
    assert threads and all("AnyIO worker" in t.name for t in threads), [t.name for t in threads]


def test_a_request_head_or_body_that_never_finishes_is_cut_off(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest of the head
        started = time.monotonic()
        assert s.recv(1024) == b"" and time.monotonic() - started < 8  # closed by the 1 s head timeout
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"prompt":'
        )  # 90 bytes short
        assert s.recv(1024).startswith(b"HTTP/1.1 408")


# ---- 4: a non-streaming client that leaves aborts its request ----


def test_non_streaming_request_is_aborted_when_its_client_leaves(server):
    url, app = server
    engine = app.state.engine
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1000, "ignore_eos": True}, timeout=0.5
        )
    assert idle(engine, timeout=20) == 0
    latest = list(engine.finished.values())[-1]
    assert latest.finish_reason == "abort" and latest.num_output_tokens < 1000


# ---- 6 and 7: metrics ----


def test_metrics_use_vllm_names_and_need_no_scrape_to_stay_bounded(server):
    url, app = server
    engine = app.state.engine
    labels = {"model_name": "tiny", "engine": "0"}

    def steps_seen(name):
        return engine.stats.registry.get_sample_value(name, labels) or 0

    before = steps_seen("chunkbench:step_seconds_count")
    for stream in (False, True):
        response = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "stream": stream})
        assert response.status_code == 200
    assert idle(engine) == 0
    # Every step is already in the histograms, with nothing queued for the next scrape to drain: two requests
    # of 3 tokens took at least 3 steps, and both per-step histograms saw each of them.
    deadline = time.monotonic() + 5  # the engine thread observes a step just after it returns
    while (
        steps_seen("chunkbench:step_seconds_count") != steps_seen("vllm:iteration_tokens_total_count")
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert steps_seen("chunkbench:step_seconds_count") >= before + 3
    assert steps_seen("chunkbench:step_seconds_count") == steps_seen("vllm:iteration_tokens_total_count")
    assert len(getattr(engine, "step_seconds", ())) == 0
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:num_preemptions",
        "vllm:request_success",
        "chunkbench:step_seconds",
    ):
        assert name in families, name
        assert all(s.labels["model_name"] == "tiny" for s in families[name].samples)
    success = sum(s.value for s in families["vllm:request_success"].samples if s.name.endswith("_total"))
    queued = next(s.value for s in families["vllm:request_queue_time_seconds"].samples if s.name.endswith("_count"))
    assert success >= 2 and queued == success
    ttft_bounds = {s.labels["le"] for s in families["vllm:time_to_first_token_seconds"].samples if "le" in s.labels}
    assert {"0.001", "0.04", "2560.0"} <= ttft_bounds  # vLLM's buckets


# ---- 1b: a failing step fails its own requests; a dead loop says so ----


def test_a_step_that_raises_fails_exactly_its_requests_and_the_engine_goes_on(monkeypatch):
    with running_server() as (url, app, _, _):
        engine = app.state.engine
        executor = engine.engine.executor
        execute, failed, armed = executor.execute, [], threading.Event()

        def execute_once_failing(output):
            if armed.is_set():
                armed.clear()
                failed.extend(c.request_id for c in output.chunks)
                raise RuntimeError("injected step failure")
            return execute(output)

        monkeypatch.setattr(executor, "execute", execute_once_failing)

        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                return await asyncio.gather(
                    *(
                        client.post("/v1/completions", json={"prompt": f"request {i}", "max_tokens": 3})
                        for i in range(6)
                    )
                )

        armed.set()
        responses = asyncio.run(burst())
        assert failed and sum(r.status_code == 500 for r in responses) == len(failed)
        assert sum(r.status_code == 200 for r in responses) == 6 - len(failed)
        assert all("injected step failure" in r.json()["error"]["message"] for r in responses if r.status_code == 500)
        assert all(engine.finished[i].finish_reason == "abort" for i in failed)
        assert idle(engine) == 0 and engine.healthy

        # Mid-stream: the stream ends with an error event, and the engine still serves.
        failed.clear()
        with httpx.stream(
            "POST", url + "/v1/completions", json={"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
        ) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            armed.set()
            rest = [line for line in lines if line.startswith("data: ")]
        assert failed and "injected step failure" in json.loads(rest[-2][6:])["error"]["message"]
        assert rest[-1] == "data: [DONE]"
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert idle(engine) == 0 and httpx.get(url + "/health").text == "ok"


def test_a_dead_engine_loop_fails_its_callers_says_503_and_the_server_still_stops(monkeypatch):
    with running_server() as (url, app, uv, thread):
        engine = app.state.engine
        result = {}

        def long_request():
            result["response"] = httpx.post(
                url + "/v1/completions", json={"prompt": "x", "max_tokens": 900, "ignore_eos": True}, timeout=60
            )

        caller = threading.Thread(target=long_request)
        caller.start()
        while not engine.engine.scheduler.running:
            time.sleep(0.01)

        def broken_schedule(now=0.0):
            raise RuntimeError("scheduler state corrupted")

        monkeypatch.setattr(engine.engine.scheduler, "schedule", broken_schedule)
        caller.join(timeout=30)
        assert result["response"].status_code == 503
        assert "scheduler state corrupted" in result["response"].json()["error"]["message"]
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "scheduler state corrupted" in health.text
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 503
        assert engine.engine.block_manager.num_used_blocks == 0
        uv.should_exit = True  # what uvicorn's SIGTERM handler does
        thread.join(timeout=15)
        assert not thread.is_alive()
