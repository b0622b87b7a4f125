"""The fake SGLang server (tests/tune/fake_sglang.py) starts as SGLang does (503 until its warm-up ran, then 200),
streams as SGLang's OpenAI adapter does, serves SGLang's /metrics that chunkbench reads, refuses a flag SGLang has
not got with exit 2, and its timing follows the chunk size."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from chunkbench.bench.client import bench_endpoint, wait_healthy
from chunkbench.bench.server_metrics import scrape_metrics, server_figures
from chunkbench.launch.process import stop_server
from chunkbench.workloads.spec import WorkloadRequest
from tests.conftest import free_port
from tests.tune.fake_sglang import Server, build_parser, create_app
from tests.tune.fake_sglang_engine import Engine, Metrics, Req

FAKE = Path(__file__).with_name("fake_sglang.py")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """One fake SGLang on a free port, as a --launch template would start it: (base URL, /health codes seen)."""
    port = free_port()
    log = tmp_path_factory.mktemp("fake_sglang") / "server.log"
    args = [sys.executable, str(FAKE), "--model-path", "tiny", "--chunked-prefill-size", "64", "--enable-mixed-chunk"]
    args += ["--context-length", "2048", "--port", str(port), "--enable-metrics"]
    with open(log, "w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base, codes = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 60
        while not codes or codes[-1] != 200:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                codes.append(httpx.get(base + "/health", timeout=5).status_code)
            except httpx.TransportError:  # the port is not open yet
                time.sleep(0.05)
        yield base, codes
    finally:
        stop_server(process, grace_s=10)


def test_it_answers_503_until_its_warm_up_ran_then_200(fake):
    base, codes = fake
    assert codes[0] == 503 and codes[-1] == 200 and set(codes) == {503, 200}
    wait_healthy(base + "/v1", 10)  # chunkbench's own wait: /health takes SGLang's ~1 s, within its 2 s timeout
    info = httpx.get(base + "/server_info").json()
    assert info["chunked_prefill_size"] == 64 and info["enable_mixed_chunk"] is True and info["version"] == "0.5.23"
    assert httpx.get(base + "/get_model_info").json()["model_path"] == "tiny"
    assert httpx.get(base + "/v1/models").json()["data"][0]["max_model_len"] == 2048


def test_a_chat_stream_has_sglang_s_role_content_finish_and_usage_chunks(fake):
    body = {"messages": [{"role": "user", "content": "one two three"}], "max_completion_tokens": 3}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", fake[0] + "/v1/chat/completions", json=body, timeout=10) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    deltas = [e["choices"][0]["delta"] if e["choices"] else None for e in events]
    assert deltas == [
        {"reasoning_content": None, "role": "assistant", "content": ""},
        *[{"reasoning_content": None, "content": " x"}] * 3,
        {"reasoning_content": None},
        None,
    ]
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None] * 4 + ["length"]
    assert events[-1]["usage"] | {"prompt_tokens_details": 0} == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "reasoning_tokens": 0,
        "prompt_tokens_details": 0,
        "completion_tokens_details": None,
    }
    assert len({e["id"] for e in events}) == 1 and events[0]["object"] == "chat.completion.chunk"


def test_chunkbench_measures_it_and_reads_its_metrics(fake):
    endpoint = fake[0] + "/v1"
    workload = [WorkloadRequest(prompt_len=100 + 50 * i, output_len=4, arrival_time=i * 0.01) for i in range(4)]
    before = scrape_metrics(endpoint)
    result = asyncio.run(bench_endpoint(endpoint, workload, 32000, "tiny"))
    figures = server_figures(before, scrape_metrics(endpoint), [r.ttft for r in result.records])
    assert [r.error for r in result.records] == [None] * 4
    assert [r.num_output_tokens for r in result.records] == [4] * 4 and result.records[0].output_token_source == "usage"
    assert figures["server_metrics"] == "sglang" and figures["server_requests"] == 4
    assert figures["server_prompt_tokens"] == 100 + 150 + 200 + 250 and figures["server_generation_tokens"] == 16
    assert figures["scheduling_delay_source"] == "server" and figures["server_kv_cache_tokens"] == 500_000


def test_a_flag_sglang_has_not_got_exits_2():
    done = subprocess.run(
        [sys.executable, str(FAKE), "--model-path", "m", "--port", "1", "--max-num-seqs", "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "sglang serve: error: unrecognized arguments: --max-num-seqs 8" in done.stderr


def test_without_enable_metrics_there_is_no_metrics_and_it_is_not_up_before_its_warm_up():
    client = TestClient(create_app(Server(build_parser().parse_args(["--model-path", "m"]), [])))
    assert client.get("/metrics").status_code == 404  # SGLang mounts /metrics only with --enable-metrics
    assert client.get("/health").status_code == 503 and client.get("/health_generate").status_code == 503


def passes(*flags: str, decoder: bool = False) -> tuple[int, int]:
    """The forward passes from a 512-token request's arrival to its first token, and the tokens a request that
    was decoding when it arrived got meanwhile."""
    args = build_parser().parse_args(["--model-path", "m", "--fake-step-ms", "0.2", "--fake-token-us", "0", *flags])

    async def scenario():
        engine = Engine(args, Metrics("m", 1000, 4096))
        loop = asyncio.create_task(engine.run())
        other = engine.submit(Req(prompt=1, max_new=100)) if decoder else Req(prompt=1, max_new=0)
        if decoder:
            await other.outputs.get()  # its prefill ran; a decode pass is under way
        start, generated = engine.passes, other.generated
        await engine.submit(Req(prompt=512, max_new=2)).outputs.get()
        loop.cancel()
        return engine.passes - start, other.generated - generated

    return asyncio.run(scenario())


def test_a_smaller_chunk_takes_more_passes_and_a_mixed_chunk_keeps_decoding():
    assert passes("--chunked-prefill-size", "64") == (8, 0)  # 512 tokens in chunks of 64
    assert passes("--chunked-prefill-size", "512") == (1, 0)
    assert passes("--chunked-prefill-size", "-1") == (1, 0)  # no chunking: the whole prompt
    # the prefill budget never cuts a prompt (the chunk does): it only keeps more requests out of the pass
    assert passes("--chunked-prefill-size", "64", "--max-prefill-tokens", "32") == (8, 0)
    # a running decode: the pass under way, then stalled through the 8 prefill passes, or one token in each of
    # them with --enable-mixed-chunk
    assert passes("--chunked-prefill-size", "64", decoder=True) == (9, 1)
    assert passes("--chunked-prefill-size", "64", "--enable-mixed-chunk", decoder=True) == (9, 9)


def test_the_prefill_budget_keeps_a_second_prompt_out_of_a_full_pass():
    def batch(*flags: str) -> list[int]:
        engine = Engine(build_parser().parse_args(["--model-path", "m", *flags]), Metrics("m", 1000, 4096))
        engine.waiting.extend([Req(prompt=200, max_new=1), Req(prompt=200, max_new=1)])
        return [take for _, take in engine.prefill_batch()]

    assert batch("--chunked-prefill-size", "512") == [200, 200]
    assert batch("--chunked-prefill-size", "512", "--max-prefill-tokens", "256") == [200]
    assert batch("--chunked-prefill-size", "300") == [200, 100]  # the second is cut at the chunk and ends the pass
    assert batch("--chunked-prefill-size", "512", "--max-running-requests", "1") == [200]
