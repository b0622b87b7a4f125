"""`chunkbench serve` end to end on loopback, `bench --endpoint` against it, and tuning a launched server."""

import asyncio
import json
import threading
import time

import httpx
import pytest
import uvicorn
from chunkbench.engine.config import EngineConfig

from chunkbench.bench.client import bench_endpoint
from chunkbench.serving.server import create_app
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import free_port, run_cli


@pytest.fixture(scope="module")
def server():
    config = EngineConfig.create(
        "tiny", policy="chunked", max_num_batched_tokens=128, max_model_len=1024, num_blocks=512
    )
    app = create_app(config)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", app.state.engine
    uv.should_exit = True
    thread.join(timeout=10)


def idle(engine, timeout=30.0):
    deadline = time.monotonic() + timeout
    while engine.engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.engine.block_manager.num_used_blocks


def test_bench_50_requests_client_ttft_never_below_server_ttft(server):
    url, engine = server
    workload = build_workload(
        WorkloadSpec(
            name="synthetic", num_requests=50, rate=10.0, prompt_len="uniform:8:200", output_len="uniform:4:24"
        ),
        1024,
    )
    result = asyncio.run(bench_endpoint(url, workload, 4096, max_concurrency=8))
    assert all(e is None for e in result.errors), [e for e in result.errors if e]
    for record, response_id, w in zip(result.records, result.response_ids, workload):
        assert len(record.token_times) == w.output_len
        served = engine.finished[response_id]
        server_ttft = served.token_times[0] - served.arrival_time
        assert record.ttft >= server_ttft > 0
    assert idle(engine) == 0


def test_a_request_is_recorded_before_its_caller_hears_it_finished(server, monkeypatch):
    """A reply may be read the moment its last event is sent, so the finished request (its server-side timings)
    and its success counter must be in place by then: CI once read engine.finished between the two."""
    url, engine = server
    seen = []
    emit = engine._emit

    def checking_emit(request_id, event):
        if event.finished and event.finish_reason in ("stop", "length"):
            seen.append(request_id in engine.finished)
        emit(request_id, event)

    monkeypatch.setattr(engine, "_emit", checking_emit)
    for _ in range(3):
        assert httpx.post(f"{url}/completions", json={"prompt": "hello", "max_tokens": 3}).status_code == 200
    assert seen == [True, True, True]


def test_the_server_serves_with_its_heap_frozen(server):
    """As vLLM after its warm-up: the model and imports stay out of the collector's walks
    (chunkbench/bench/gc_pause.py)."""
    import gc

    assert gc.get_freeze_count() > 10_000


def test_openai_shapes(server):
    url, _ = server
    r = httpx.post(f"{url}/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0}).json()
    assert r["object"] == "text_completion" and r["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 5,
        "total_tokens": 10,
    }
    chat = httpx.post(
        f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    ).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream(
        "POST",
        f"{url}/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 4
    assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "tiny"
    assert httpx.get(url.removesuffix("/v1") + "/health").text == "ok"
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert "vllm:num_requests_running" in metrics and "chunkbench:step_seconds_bucket" in metrics


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "JSON"),
        (json.dumps({"prompt": "x", "max_tokens": 4, "frequency_penalty": 1}).encode(), "frequency_penalty"),
        (json.dumps({"prompt": list(range(2000)), "max_tokens": 4}).encode(), "max_model_len"),
        (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"prompt": [1, 99999], "max_tokens": 4}).encode(), "token ids"),
    ],
)
def test_bad_requests_get_400_and_the_server_goes_on(server, content, message):
    url, _ = server
    response = httpx.post(f"{url}/completions", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["type"] == "invalid_request_error" and message in body["message"] + str(body["param"])
    ok = httpx.post(f"{url}/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
    assert ok.status_code == 200


def test_disconnecting_clients_free_their_blocks(server):
    url, engine = server
    workload = build_workload(
        WorkloadSpec(
            name="synthetic", num_requests=200, rate=400.0, prompt_len="uniform:8:300", output_len="uniform:20:60"
        ),
        1024,
    )
    hang_up = {i: 3 for i in range(0, 200, 10)}  # 20 clients leave after 3 tokens
    result = asyncio.run(bench_endpoint(url, workload, 4096, max_concurrency=32, disconnect=hang_up))
    errors = {i: e for i, e in enumerate(result.errors) if e}
    assert set(errors) == set(hang_up) and all(e == "disconnected by the client" for e in errors.values())
    assert idle(engine) == 0
    aborted = [r for r in engine.finished.values() if r.finish_reason == "abort"]
    assert len(aborted) >= 1  # the engine saw the hang-ups (the rest had already finished)


def test_bench_command_against_the_server(server, tmp_path, capsys):
    url, _ = server
    code, _, err = run_cli(
        [
            "bench",
            "--endpoint",
            url,
            "--workload",
            "synthetic",
            "--num-requests",
            "10",
            "--rate",
            "20",
            "--output-len",
            "fixed:4",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["completed"] == 10 and summary["failed_requests"] == []


@pytest.mark.slow
def test_tune_with_launched_chunkbench_servers(tmp_path, capsys):
    import sys

    port = free_port()
    launch = (
        f"{sys.executable} -m chunkbench.cli serve --model tiny --port {port} --max-model-len 1024 "
        "--num-blocks 256 --max-num-batched-tokens {max_num_batched_tokens} --max-num-seqs {max_num_seqs}"
    )
    code, stdout, err = run_cli(
        [
            "tune",
            "--model",
            "tiny",
            "--backend",
            "launch",
            "--launch",
            launch,
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--launch-timeout",
            "120",
            "--sla-ttft",
            "10s",
            "--n-trials",
            "2",
            "--num-requests",
            "6",
            "--rate",
            "20",
            "--workload",
            "chat",
            "--objective",
            "goodput",
            "--verify-top",
            "1",
            "--verify-repeats",
            "2",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, err
    for name in ("recommended.toml", "vllm.yaml", "sglang.txt", "trials.csv", "report.html", "verified.json"):
        assert (tmp_path / name).exists()
    import optuna

    name = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'study.db'}")[0]
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 2
    (row,) = json.loads((tmp_path / "verified.json").read_text())["verified"].values()  # the best, relaunched
    assert [run["completed"] for run in row["repeats"]] == [6, 6]
    assert "the best re-measured on a launched server" in (tmp_path / "recommended.toml").read_text()


@pytest.mark.slow
def test_capacity_over_a_launched_server_bisects_against_that_server(tmp_path, capsys):
    """The arrival rates go to the launched process (its own request counter counts them) and the median
    scheduling delay comes from its vllm:request_queue_time_seconds histogram, not from a local engine."""
    import sys

    port = free_port()
    launch = (
        f"{sys.executable} -m chunkbench.cli serve --model tiny --port {port} --max-model-len 1024 "
        "--num-blocks 256 --max-num-batched-tokens {max_num_batched_tokens} --max-num-seqs {max_num_seqs}"
    )
    code, stdout, err = run_cli(
        [
            "tune",
            "--model",
            "tiny",
            "--backend",
            "launch",
            "--launch",
            launch,
            "--endpoint",
            f"http://127.0.0.1:{port}/v1",
            "--launch-timeout",
            "120",
            "--objective",
            "capacity",
            "--sla-ttft",
            "p50:2s",
            "--n-trials",
            "1",
            "--num-requests",
            "8",
            "--rate",
            "4",
            "--workload",
            "chat",
            "--space",
            "latency",
            "--verify-top",
            "0",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0, err
    import optuna

    name = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'study.db'}")[0]
    trial = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study.db'}").trials[0]
    metrics = trial.user_attrs["metrics"]
    assert trial.values[0] == metrics["capacity_rps"] > 0
    assert metrics["scheduling_delay_source"] == "server"
    # the best probe's requests (no warm-up, as vLLM): its whole run's, of which its steady window measured some
    assert metrics["server_requests"] == metrics["run_requests"] > metrics["steady_requests"] == metrics["completed"]
    assert not (tmp_path / "verified.json").exists()  # --verify-top 0: the best single run wins
    assert "re-measured" not in (tmp_path / "recommended.toml").read_text()


def test_a_server_that_cannot_start_is_a_failed_trial(tmp_path, capsys):
    code, stdout, err = run_cli(
        [
            "tune",
            "--model",
            "tiny",
            "--backend",
            "launch",
            "--launch",
            "false",
            "--endpoint",
            f"http://127.0.0.1:{free_port()}/v1",
            "--launch-timeout",
            "5",
            "--n-trials",
            "1",
            "--num-requests",
            "4",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--workload",
            "chat",
        ],
        capsys,
    )
    assert code == 1 and "never became healthy" in err, err  # each a failed trial; three in a row end the study
    import optuna

    name = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'study.db'}")[0]
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 3
    assert "exited with code 1" in trials[0].user_attrs["error"]
