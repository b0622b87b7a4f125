"""`bench` measures as the vLLM release it measures: 0.32's client or 0.33+'s (chunkbench/bench/client_rules.py),
chosen from the server's /version or --vllm-version, against a scripted server whose timing is known.

The stream is vLLM 0.33+'s chat stream: a role-only first chunk, three text chunks, a finish chunk with an
empty delta, then the usage chunk with the server's per-request `metrics`. Its gaps are 80 ms or more and the
two releases' figures differ by 100 ms or more, so TOL_S = 40 ms (a busy 2-core machine: loopback delivery,
the server thread waiting for the GIL, descheduling) tells them apart. The expected figures are worked out by
hand from the script's delays, by each release's rules (vllm/benchmarks/lib/endpoint_request_func.py):

- 0.34: TTFT at the first text chunk, one ITL per later text chunk, the latency ends at the last text chunk.
- 0.32: TTFT at the role chunk, an ITL for every later chunk with a choice (text or finish), the latency ends
  at the finish chunk.
TPOT is (latency - TTFT) / (completion_tokens - 1) in both.
"""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest
from chunkbench.engine.knobs import VLLM_VERSION

from chunkbench.bench.client import bench_endpoint
from chunkbench.bench.client_rules import NEWEST, OLDEST, choose_timing, known_version, rules_for
from chunkbench.bench.openai_stream import carries_output
from chunkbench.errors import UserError
from chunkbench.workloads.spec import WorkloadRequest
from tests.conftest import run_cli
from tests.serving.scripted_server import DONE, ScriptedServer, chat_finish, chat_tok, tok, usage

TOL_S = 0.040
ROLE, A, B, C, FINISH, USAGE = 0.10, 0.15, 0.10, 0.20, 0.12, 0.08  # the delay before each event (s)
METRICS = {"queue_time_ms": 25.0, "time_to_first_token_ms": 140.0, "generation_time_ms": 300.0}
STREAM = [
    ROLE,
    chat_tok("", role="assistant"),
    A,
    chat_tok("a"),
    B,
    chat_tok("b"),
    C,
    chat_tok("c"),
    FINISH,
    chat_finish(),
    USAGE,
    usage(3, metrics=METRICS),
    DONE,
]
# By hand, from the delays: (TTFT less the server's start, the ITLs, latency - TTFT), each release's rules.
V034 = (ROLE + A, [B, C], B + C)
V032 = (ROLE, [A, B, C, FINISH], A + B + C + FINISH)
CARD = {"id": "m", "vocab_size": 1000}


# Times a scripted server to a few ms (tests/conftest.py says why): alone (timing), with fine GIL switching.
pytestmark = [pytest.mark.timing, pytest.mark.usefixtures("fine_gil_switching")]


def test_a_chat_chunk_counts_under_0_33_when_its_delta_carries_output():
    assert not carries_output({"role": "assistant", "content": ""})  # vLLM's opening chunk
    assert not carries_output({}) and not carries_output({"content": None}) and not carries_output(None)
    assert carries_output({"content": ""})  # a token that decodes to nothing: no role
    assert carries_output({"role": "assistant", "content": "hi"})
    assert carries_output({"reasoning": "hm"}) and carries_output({"reasoning_content": "hm"})
    assert carries_output({"tool_calls": [{"index": 0}]})


@pytest.mark.parametrize("rules, hand", [(NEWEST, V034), (OLDEST, V032)], ids=["0.34", "0.32"])
def test_a_vllm_chat_stream_is_timed_by_each_releases_rules(rules, hand):
    """The client's figures equal the release's, from the server's own send times and by hand from the delays."""
    with ScriptedServer({3: STREAM}) as server:
        result = asyncio.run(bench_endpoint(server.url, [WorkloadRequest(8, 3, 0.0)], 1000, api="chat", rules=rules))
    (record,), (served,) = result.records, server.served
    assert record.ok and record.output_tokens == 3, record.error
    send = result.start + record.send_time
    counted = [t for t, item in served.sent if isinstance(item, dict) and item.get("choices")]
    counted = counted[1:4] if rules.chat_output_only else counted  # 0.34: the three text chunks
    assert record.ttft == pytest.approx(counted[0] - send, abs=TOL_S)
    assert record.e2el == pytest.approx(counted[-1] - send, abs=TOL_S)
    first_event = served.sent[0][0] - send  # the server's start (its first delay) and the connection's setup
    ttft, itls, decode = hand
    assert record.ttft - first_event == pytest.approx(ttft - ROLE, abs=TOL_S)
    assert record.itls == pytest.approx(itls, abs=TOL_S)
    assert record.e2el - record.ttft == pytest.approx(decode, abs=TOL_S)
    assert record.tpot == pytest.approx(decode / 2, abs=TOL_S / 2)
    if rules.server_metrics:  # ms on the wire, s kept
        assert (record.server_queue_time, record.server_ttft) == (0.025, 0.140)
    else:
        assert (record.server_queue_time, record.server_ttft) == (None, None)


def bench_chat(tmp_path, capsys, version: str | None, *extra: str):
    """`chunkbench bench` of one chat request against a server saying `version` at /version (None: no /version),
    with --save-result --save-detailed; (the result file, summary.json, stdout)."""
    with ScriptedServer({3: STREAM}, card=CARD, version=version) as server:
        code, stdout, err = run_cli(
            [
                "bench",
                "--endpoint",
                server.url,
                "--api",
                "chat",
                "--workload",
                "synthetic",
                "--prompt-len",
                "fixed:8",
                "--output-len",
                "fixed:3",
                "--num-requests",
                "1",
                "--request-rate",
                "inf",
                "--out",
                str(tmp_path / "o"),
                "--save-result",
                "--save-detailed",
                "--result-dir",
                str(tmp_path),
                "--result-filename",
                "r.json",
                *extra,
            ],
            capsys,
        )
    assert code == 0, err
    return (
        json.loads((tmp_path / "r.json").read_text()),
        json.loads((tmp_path / "o" / "summary.json").read_text()),
        stdout,
    )


def assert_figures(result: dict, hand: tuple) -> None:
    """The result file's per-request figures (s) and TPOT (ms) against the hand-worked ones."""
    _, itls, decode = hand
    (ttft,), (latency,), (got_itls,) = result["ttfts"], result["latencies"], result["itls"]
    assert got_itls == pytest.approx(itls, abs=TOL_S)
    assert latency - ttft == pytest.approx(decode, abs=TOL_S)
    assert result["mean_tpot_ms"] == pytest.approx(1000 * decode / 2, abs=1000 * TOL_S / 2)


def test_bench_measures_a_0_34_server_as_0_34s_client_and_keeps_its_metrics(tmp_path, capsys):
    result, summary, stdout = bench_chat(tmp_path, capsys, "0.34.0")
    assert "timing: vLLM 0.34.0's client rules (server /version)" in stdout
    assert_figures(result, V034)
    assert result["server_queue_times"] == [0.025] and result["server_ttfts"] == [0.14]
    assert summary["vllm_version"] == "0.34.0" and summary["vllm_version_source"] == "server /version"
    assert summary["client_rules_since"] == "0.33.0"


def test_bench_measures_a_0_32_server_as_0_32s_client(tmp_path, capsys):
    result, summary, stdout = bench_chat(tmp_path, capsys, "0.32.0+cpu")
    assert "timing: vLLM 0.32.0+cpu's client rules (server /version)" in stdout
    assert_figures(result, V032)
    assert "server_queue_times" not in result and "server_ttfts" not in result  # 0.32's client drops them
    assert summary["vllm_version"] == "0.32.0+cpu" and summary["client_rules_since"] == "0.32.0"


def test_vllm_version_overrides_the_servers_and_no_version_is_the_newest(tmp_path, capsys):
    result, summary, stdout = bench_chat(tmp_path / "a", capsys, "0.34.0", "--vllm-version", "0.32.0")
    assert "timing: vLLM 0.32.0's client rules (--vllm-version)" in stdout
    assert_figures(result, V032)
    result, summary, stdout = bench_chat(tmp_path / "b", capsys, None)
    assert f"timing: vLLM {VLLM_VERSION}'s client rules (the newest: the server has no /version)" in stdout
    assert_figures(result, V034)
    assert summary["vllm_version"] == VLLM_VERSION


def test_without_save_detailed_the_servers_metrics_are_left_out(tmp_path, capsys):
    with ScriptedServer({3: STREAM}, card=CARD, version="0.34.0") as server:
        code, _, err = run_cli(
            ["bench", "--endpoint", server.url, "--api", "chat", "--workload", "synthetic", "--prompt-len", "fixed:8"]
            + ["--output-len", "fixed:3", "--num-requests", "1", "--request-rate", "inf", "--out", str(tmp_path / "o")]
            + ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"],
            capsys,
        )
    assert code == 0, err
    assert not {"server_queue_times", "server_ttfts", "ttfts"} & set(json.loads((tmp_path / "r.json").read_text()))


@pytest.mark.parametrize(
    "reported, version, rules, source",
    [
        ("0.33.2", "0.33.2", "0.33.0", "server /version"),
        ("0.36.0", VLLM_VERSION, NEWEST.since, "the newest: the server's /version 0.36.0 is newer"),
        ("dev", VLLM_VERSION, NEWEST.since, "the newest: the server's /version 'dev' names no release"),
        ("0.20.1", "0.32.0", "0.32.0", "the oldest: the server's /version 0.20.1 is older"),
        (None, VLLM_VERSION, NEWEST.since, "the newest: the server has no /version"),
    ],
)
def test_the_servers_version_picks_the_rules(reported, version, rules, source):
    with ScriptedServer({}, version=reported) as server:
        timing = choose_timing(server.url, None)
    assert (timing.version, timing.rules.since, timing.source) == (version, rules, source)


def test_vllm_version_names_a_release_chunkbench_knows(capsys):
    assert known_version("0.34") == known_version("v0.34.0") == known_version("0.34.1") == "0.34.0"
    assert rules_for("0.34.0") is NEWEST
    for bad in ("0.31.0", "1.0.0", "banana", ""):
        with pytest.raises(UserError, match="--vllm-version must be one of 0.32.0, 0.33.0, 0.34.0"):
            known_version(bad)
    code, _, err = run_cli(["bench", "--endpoint", "http://127.0.0.1:1/v1", "--vllm-version", "0.35.0"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--vllm-version must be one of" in err, err


@pytest.mark.parametrize("rules", [NEWEST, OLDEST], ids=["0.34", "0.32"])
def test_probes_have_their_own_connection_from_0_33(rules):
    """--max-concurrency 1 and one request that holds its connection for 1 s, probes at 5/s (a 0.2 s pause
    after each). 0.34: the probes have a connection of their own, each takes its ~20 ms, and the duration ends
    with the request. 0.32: a probe waits for the pool's one connection until the request ends, and the
    duration holds the last probe and its pause."""
    scripts = {5: [1.0] + [0.02, tok()] * 5 + [usage(5), DONE], 1: [0.02, tok(), usage(1), DONE]}
    with ScriptedServer(scripts) as server:
        result = asyncio.run(
            bench_endpoint(
                server.url, [WorkloadRequest(8, 5, 0.0)], 1000, max_concurrency=1, probe_rate=5.0, rules=rules
            )
        )
    (record,) = result.records
    assert record.ok and all(error is None for _, error in result.probes) and result.probes
    longest = max(e2el for e2el, _ in result.probes)
    if rules.probes_own_connection:
        assert (
            len(result.probes) >= 3
            and longest < 0.2
            and result.duration == pytest.approx(result.end_times[0], abs=1e-9)
        )
    else:
        assert longest > 0.6  # behind the load
        assert result.duration >= result.end_times[0] + 0.2 - TOL_S  # the last probe and its pause


def test_bench_request_rate_inf_sends_every_request_at_once(tmp_path, capsys):
    """Six requests whose first token comes 0.4 s after each is received: sent at once, all reach the server
    before any ends, and every send time is ~0 (vllm bench serve's default --request-rate inf)."""
    script = [0.4, tok(), 0.05, tok(), 0.05, tok(), usage(3), DONE]
    with ScriptedServer({3: script}, card=CARD, version="0.34.0") as server:
        code, _, err = run_cli(
            ["bench", "--endpoint", server.url, "--workload", "synthetic", "--prompt-len", "fixed:8"]
            + ["--output-len", "fixed:3", "--num-requests", "6", "--request-rate", "inf", "--out", str(tmp_path / "o")]
            + ["--save-result", "--save-detailed", "--result-dir", str(tmp_path / "r")],
            capsys,
        )
    assert code == 0, err
    assert len(server.served) == 6 and max(s.received for s in server.served) < min(s.ended for s in server.served)
    (path,) = (tmp_path / "r").iterdir()
    result = json.loads(path.read_text())
    assert path.name.startswith("openai-infqps-m-") and result["request_rate"] == "inf"
    assert result["completed"] == 6 and max(result["start_times"]) < 0.1


def test_run_rate_inf_gives_every_request_the_arrival_zero(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        ["run", "--model", "tiny", "--backend", "sim", "--workload", "synthetic", "--num-requests", "6"]
        + ["--rate", "inf", "--out", str(out), "--no-progress"],
        capsys,
    )
    assert code == 0, err
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 6 and (requests["arrival_time"] == 0.0).all()


@pytest.mark.parametrize("rate, message", [("nan", "--rate must be a finite number"), ("-1", "--rate must be > 0")])
def test_a_rate_that_is_no_rate_is_still_refused(rate, message, capsys):
    code, _, err = run_cli(["run", "--model", "tiny", "--rate", rate, "--no-progress"], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
