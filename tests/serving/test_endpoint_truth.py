"""`bench --endpoint` against a scripted server whose send times are known: every summary key equals its
definition (vLLM's, see metric_table.METRIC_TABLE) computed from the server's own timestamps.

Tolerance: TOL_S = 40 ms per time. The client and the server share time.perf_counter() (one process), so
the differences are loopback delivery (a chunk reached the client within 2 ms of its send here), the server
thread waiting for the GIL (the switch interval is set to 0.5 ms here) and the OS descheduling either thread
on a busy 2-core machine. The collector does not walk the pytest process's objects mid-request: the client
freezes the heap it inherits (test_requests_are_timed_with_the_inherited_heap_out_of_the_collector). The send
times come from the schedule and the slots (client_view), not from the server's receipt, which lags the send
by a new connection's setup (10-50 ms seen here). The scripted gaps are 80 ms or more, so every mistake these
tests look for (a latency measured from the due time instead of the send, a chunk missed or double counted)
moves a value by 80 ms or more; the 1 s buckets are kept 250 ms or more away from their edges.
"""

import asyncio
import json

import numpy as np
import pandas as pd
import pytest

from chunkbench.bench.client import bench_endpoint
from chunkbench.bench.harness import RunResult
from chunkbench.bench.metrics import PERCENTILES, pct_key, summarize
from chunkbench.bench.runs import requests_frame
from chunkbench.files import write_json, write_parquet
from chunkbench.workloads.spec import WorkloadRequest
from tests.serving.scripted_server import DONE, DROP, ScriptedServer, chat_tok, is_choice, tok, usage

TOL_S = 0.040


# Times a scripted server to a few ms (tests/conftest.py says why): alone (timing), with fine GIL switching.
pytestmark = [pytest.mark.timing, pytest.mark.usefixtures("fine_gil_switching")]


def bench(scripts: dict[int, list], arrivals: dict[int, float] | None = None, **kwargs):
    """Run one request per script key (its output_len is the key) and summarize it."""
    workload = [
        WorkloadRequest(prompt_len=8, output_len=key, arrival_time=(arrivals or {}).get(key, 0.0)) for key in scripts
    ]
    with ScriptedServer(scripts) as server:
        result = asyncio.run(bench_endpoint(server.url, workload, 1000, **kwargs))  # vLLM's defaults: no warm-up
    return workload, result, summarize(result.records, [], result.duration), server


def stats(prefix: str, values_s: list[float]) -> dict:
    ms = np.asarray(values_s or [0.0]) * 1000.0
    out = {f"mean_{prefix}_ms": ms.mean(), f"median_{prefix}_ms": np.median(ms), f"std_{prefix}_ms": ms.std()}
    return out | {f"{pct_key(p)}_{prefix}_ms": np.percentile(ms, p) for p in PERCENTILES}


def client_view(workload, result, server, max_concurrency: int | None, timeout_s: float | None) -> list:
    """(send, end) per request from the server's times, relative to the clock start. The client sends a
    request when it is due and a slot is free (slots go in workload order, FIFO): a slot frees when the
    request holding it ends for the client, at its [DONE], its last byte, or its timeout. A new connection's
    setup is the client's (vLLM's TTFT counts it too), so the server's receipt is not the send."""
    served = server.by_key()
    free = [0.0] * (max_concurrency or len(workload))
    view = []
    for w in workload:
        s = served[w.output_len]
        send = max(w.arrival_time, min(free))
        done_at = [t for t, item in s.sent if item == DONE]
        end = done_at[0] - result.start if done_at else s.ended - result.start if s.ended else send + timeout_s
        free[free.index(min(free))] = end
        view.append((send, end))
    return view


def expected(workload, result, server, ok_keys, max_concurrency=None, timeout_s=None) -> dict:
    """Every summary key from the server's times and the scripts, as vLLM defines it."""
    served = server.by_key()
    start = result.start
    view = client_view(workload, result, server, max_concurrency, timeout_s)
    done = []
    for w, (send, _) in zip(workload, view):
        if w.output_len in ok_keys:
            s = served[w.output_len]
            script = server.scripts[w.output_len]
            counts = [i["usage"]["completion_tokens"] for i in script if isinstance(i, dict) and "usage" in i]
            texts = sum(
                bool(i["choices"][0].get("text") or i["choices"][0].get("delta", {}).get("content"))
                for i in script
                if is_choice(i)
            )
            done.append((send, [t - start for t in s.choice_times], counts[-1] if counts else texts, w.arrival_time))
    duration = max(end for _, end in view)
    tokens = sum(n for _, _, n, _ in done)
    itls = [g for _, times, _, _ in done for g in np.diff(times)]
    out = {
        "completed": len(done),
        "failed": len(workload) - len(done),
        "duration": duration,
        "total_input_tokens": 8 * len(done),
        "total_output_tokens": tokens,
        "request_throughput": len(done) / duration,
        "request_goodput": len(done) / duration,
        "output_throughput": tokens / duration,
        "total_token_throughput": (tokens + 8 * len(done)) / duration,
        "sla_attainment_pct": 100.0 if done else 0.0,
        "num_preemptions": 0,
        "peak_kv_blocks": 0,
        "cached_prompt_tokens": 0,
        "computed_prompt_tokens": 8 * len(done),
        "prefix_cache_hit_rate_pct": 0.0,
        "prefix_cache_request_hit_rate_pct": 0.0,
        "num_steps": 0,
    }
    origin = min((send for send, *_ in done), default=0.0)
    buckets = np.zeros(int(duration) + 2)
    active = np.zeros(int(duration) + 2)
    for send, times, _, _ in done:
        np.add.at(buckets, np.floor(np.subtract(times, origin)).astype(int), 1)
        active[int(send - origin) : int(times[-1] - origin) + 1] += 1
    out |= {"max_output_tokens_per_s": int(buckets.max()), "max_concurrent_requests": int(active.max())}
    out |= stats("ttft", [times[0] - send for send, times, _, _ in done])
    out |= stats("tpot", [(times[-1] - times[0]) / (n - 1) for send, times, n, _ in done if n > 1])
    out |= stats("itl", itls)
    out |= stats("e2el", [times[-1] - send for send, times, _, _ in done])
    out |= stats("client_queue_time", [send - arrival for send, _, _, arrival in done])
    # Every request, failed ones too, leaves the loop at its due time (the wait for a slot comes after).
    out |= stats("send_lag", [0.0] * len(workload)) | {"max_send_lag_ms": 0.0}
    out |= stats("scheduling_delay", [times[0] - send for send, times, _, _ in done])  # TTFT, the proxy
    out["scheduling_delay_source"] = "ttft-proxy"
    if done:
        out["output_token_source"] = (
            "usage" if any("usage" in i for i in server.scripts[min(ok_keys)] if isinstance(i, dict)) else "chunks"
        )
    threshold = 5 * np.median(itls) if itls else None
    stalls = [g for g in itls if threshold and g > threshold]
    out |= {"num_stalls": len(stalls), "longest_stall_ms": 1000.0 * max(stalls, default=0.0)}
    if threshold:
        out["stall_threshold_ms"] = 1000.0 * threshold
    return out


def assert_matches(summary: dict, truth: dict) -> None:
    assert set(summary) == set(truth)
    duration = truth["duration"]
    for key, value in truth.items():
        if key.endswith("_ms"):
            assert summary[key] == pytest.approx(value, abs=1000 * TOL_S), key
        elif key == "duration":
            assert summary[key] == pytest.approx(value, abs=TOL_S), key
        elif key.endswith("throughput") or key == "request_goodput":  # n / duration: duration's error, relative
            assert summary[key] == pytest.approx(value, rel=1.5 * TOL_S / max(duration, TOL_S)), key
        else:
            assert summary[key] == value, key


def endpoint_requests_frame(result):
    return requests_frame(RunResult(result.records, [], result.duration, 0))


def save_endpoint_run(result, payload, out_dir):
    """What `chunkbench bench` writes: requests.parquet, then summary.json (NaN/Infinity refused)."""
    write_parquet(endpoint_requests_frame(result), out_dir / "requests.parquet")
    write_json(payload, out_dir / "summary.json")


def test_max_concurrency_latencies_start_at_the_send_and_the_wait_is_client_queue_time():
    # Three requests due at once, one slot: each is 80 ms to a first chunk, then an empty chunk and a
    # two-token chunk 80 ms apart; the server's usage says 4 tokens. The last chunk comes at 0.72 s.
    script = [0.08, tok("ab"), 0.08, tok(""), 0.08, tok("cd"), usage(4), DONE]
    workload, result, summary, server = bench({11: script, 12: script, 13: script}, max_concurrency=1)
    assert result.errors == [None] * 3
    assert_matches(summary, expected(workload, result, server, {11, 12, 13}, max_concurrency=1))
    assert summary["median_ttft_ms"] == pytest.approx(80, abs=1000 * TOL_S)  # not 80, 320, 560
    assert summary["p99_client_queue_time_ms"] > 400  # the third waited for two requests (480 ms)
    assert summary["output_token_source"] == "usage" and summary["total_output_tokens"] == 12
    assert [len(r.token_times) for r in result.records] == [3, 3, 3]  # the empty chunk is an event


def test_without_usage_the_text_chunks_are_counted():
    workload, result, summary, server = bench({5: [0.08, tok("a"), 0.08, tok(""), 0.08, tok("b"), DONE]})
    assert_matches(summary, expected(workload, result, server, {5}))
    assert summary["output_token_source"] == "chunks" and summary["total_output_tokens"] == 2


def test_failures_are_counted_and_kept_and_the_run_goes_on(tmp_path):
    scripts = {
        21: [0.08, tok(), 0.08, tok(), usage(2), DONE],
        22: [0.08, tok(), 0.08, {"error": {"message": "boom", "code": 500}}, DONE],
        23: [0.08, tok(), "data: {not json", 0.08, tok(), DONE],
        24: [("status", 500, "internal trouble")],
        25: [0.08, tok(), 0.08, DROP],
        26: [0.08, tok(), 1.0, tok(), DONE],  # past the 0.4 s timeout
        27: [0.08, tok()],
    }  # a complete body without [DONE]
    workload, result, summary, server = bench(scripts, timeout_s=0.4)
    errors = dict(zip(scripts, result.errors))
    assert errors[21] is None and "boom" in errors[22] and "not JSON" in errors[23]
    assert errors[24].startswith("HTTP 500") and "internal trouble" in errors[24]
    assert "ClientPayloadError" in errors[25] and "timed out after 0.4 s" in errors[26]
    assert "before [DONE]" in errors[27]
    assert_matches(summary, expected(workload, result, server, {21}, timeout_s=0.4))
    assert summary["duration"] == pytest.approx(0.4, abs=TOL_S)  # the timed-out request ended last
    save_endpoint_run(result, {**summary, "failed_requests": result.errors}, tmp_path)
    frame = pd.read_parquet(tmp_path / "requests.parquet")
    assert list(frame["error"].isna()) == [True] + [False] * 6
    assert len(frame.loc[5, "token_times"]) == 1 and frame.loc[0, "num_output_tokens"] == 2  # kept, not counted
    assert frame.loc[0, "send_time"] == pytest.approx(0.0, abs=TOL_S)
    assert frame.loc[0, "send_time"] < server.by_key()[21].received - result.start
    assert json.loads((tmp_path / "summary.json").read_text())["completed"] == 1


def test_an_all_failed_run_lasts_until_its_last_failure_and_writes_valid_json(tmp_path):
    workload, result, summary, server = bench({31: [("status", 500, "no")], 32: [0.15, DROP]})
    assert_matches(summary, expected(workload, result, server, set()))
    assert summary["duration"] == pytest.approx(0.15, abs=TOL_S) and summary["request_throughput"] == 0.0
    save_endpoint_run(result, summary, tmp_path)  # allow_nan=False: raises on NaN or Infinity
    assert json.loads((tmp_path / "summary.json").read_text())["failed"] == 2


def test_a_one_token_output_has_no_tpot_and_no_itl():
    workload, result, summary, server = bench({1: [0.08, tok("a"), usage(1), DONE]})
    assert_matches(summary, expected(workload, result, server, {1}))
    assert summary["mean_tpot_ms"] == 0 and summary["mean_itl_ms"] == 0
    assert summary["mean_e2el_ms"] == pytest.approx(summary["mean_ttft_ms"])


def test_endpoint_stalls_are_gaps_above_five_times_the_median_itl():
    script = [0.03, tok()] + [0.08, tok()] * 5 + [0.75, tok()] + [0.08, tok()] * 4 + [usage(11), DONE]
    workload, result, summary, server = bench({11: script})
    assert_matches(summary, expected(workload, result, server, {11}))
    assert summary["num_stalls"] == 1 and summary["longest_stall_ms"] == pytest.approx(750, abs=1000 * TOL_S)
    assert summary["stall_threshold_ms"] == pytest.approx(400, abs=5 * 1000 * TOL_S)


def test_chat_with_an_api_key_and_headers(monkeypatch):
    # vLLM's chat server sends a role chunk with empty content first: it is the first event.
    script = [
        0.08,
        chat_tok("", role="assistant"),
        0.08,
        chat_tok("hi"),
        0.08,
        chat_tok(" there"),
        usage(2, prompt_tokens=30),
        DONE,
    ]
    workload, result, summary, server = bench({7: script}, api="chat", api_key="sk-test", headers={"X-Trace": "t1"})
    served = server.served[0]
    assert served.path == "/v1/chat/completions" and served.headers["authorization"] == "Bearer sk-test"
    assert served.headers["x-trace"] == "t1" and served.body["stream_options"] == {"include_usage": True}
    assert len(served.body["messages"][0]["content"].split()) == 8 and served.body["max_completion_tokens"] == 7
    truth = expected(workload, result, server, {7})
    truth |= {
        "total_input_tokens": 30,
        "computed_prompt_tokens": 30,  # the server's prompt count, as vLLM
        "total_token_throughput": 32 / truth["duration"],
    }
    assert_matches(summary, truth)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    _, _, _, server = bench({7: script})
    assert server.served[0].headers["authorization"] == "Bearer env-key"
    assert server.served[0].path == "/v1/completions" and server.served[0].body["prompt"]


def test_by_default_no_warm_up_and_no_sampling_parameter_is_sent():
    """vllm bench serve 0.32: --num-warmups defaults to 0, and no temperature (or any sampling field) is sent
    unless given: the server's defaults apply."""
    _, result, summary, server = bench({3: [0.08, tok(), 0.08, tok(), DONE]})
    (timed,) = server.served
    assert not {"temperature", "top_p", "top_k", "min_p"} & set(timed.body)
    assert timed.body["ignore_eos"] is True and summary["completed"] == 1 and result.warmup_error is None


def test_sampling_fields_are_sent_when_given():
    _, _, _, server = bench({3: [0.08, tok(), DONE]}, sampling={"temperature": 0.0, "top_k": 5})
    assert server.served[0].body["temperature"] == 0.0 and server.served[0].body["top_k"] == 5


def test_one_warm_up_is_request_0_untimed_before_the_clock():
    """--num-warmups 1: vLLM sends its first request's input once, untimed, before the run starts."""
    workload, result, summary, server = bench({3: [0.08, tok(), 0.08, tok(), DONE]}, num_warmups=1)
    warm, timed = server.served  # the client is done with the warm-up at its [DONE]
    # The server stamps a chunk after its write drains, and the client may already hold it: a 2 ms race
    # failed this once without the loopback tolerance.
    assert warm.sent[-1][0] < result.start + TOL_S and result.start < timed.received
    assert warm.body == timed.body  # vLLM's test_input is input_requests[0]
    assert summary["completed"] == 1 and result.warmup_error is None
    assert_matches(summary, expected(workload, result, server, {3}))
    frame = endpoint_requests_frame(result)
    assert frame.loc[0, "client_queue_time"] == pytest.approx(0.0, abs=TOL_S)


def test_sends_follow_the_schedule_and_their_lag_is_reported():
    """Ten requests due 30 ms apart: each leaves within the tolerance of its due time, and the summary's
    send lag is the dispatch minus the due time."""
    scripts = {k: [0.08, tok(), 0.08, tok(), DONE] for k in range(2, 12)}
    arrivals = {k: 0.03 * (k - 2) for k in scripts}
    workload, result, summary, server = bench(scripts, arrivals)
    lags = [r.dispatch_time - r.arrival_time for r in result.records]
    assert min(lags) >= 0 and max(lags) < TOL_S
    assert summary["max_send_lag_ms"] == pytest.approx(1000 * max(lags))
    assert summary["mean_send_lag_ms"] == pytest.approx(1000 * float(np.mean(lags)))
    assert [r.send_time for r in result.records] == sorted(r.send_time for r in result.records)


def test_requests_are_timed_with_the_inherited_heap_out_of_the_collector(monkeypatch):
    """A full collection of this process's imports landing inside a request adds to its latencies
    (docs/measurements/client.md, "Python's collector"), so the client freezes the heap it inherits
    (gc_pause.frozen_heap)."""
    import gc

    import chunkbench.bench.client as client

    gc.unfreeze()  # another test's in-process server may have left its freeze in place (CPython has one, shared)
    frozen_while_timed = []
    request = client._request

    async def watched(*args, **kwargs):
        frozen_while_timed.append(gc.get_freeze_count())
        return await request(*args, **kwargs)

    monkeypatch.setattr(client, "_request", watched)
    bench({3: [0.08, tok(), DONE]}, num_warmups=1)
    assert len(frozen_while_timed) == 2 and min(frozen_while_timed) > 10_000  # the imports, and the warm-up
    assert gc.get_freeze_count() == 0  # back in the collector's sight after the run
