"""Metrics on hand-built timestamps, every key checked against a value worked out by hand."""

import numpy as np
import pytest
from chunkbench.engine.outputs import StepRecord

from chunkbench.bench.metrics import RequestRecord, summarize
from chunkbench.bench.slo import parse_goodput
from chunkbench.bench.token_gaps import peak_per_second
from chunkbench.errors import UserError

# r1: arrives at 0, first scheduled at 0.1, tokens at 0.5, 0.7, 1.0. r2: arrives at 1.0, one token at 1.2.
R1 = RequestRecord(
    prompt_len=10,
    output_len=3,
    arrival_time=0.0,
    token_times=[0.5, 0.7, 1.0],
    first_scheduled_time=0.1,
    num_paused_decodes=2,
    paused_gaps=(2,),
)  # paused twice before 1.0
R2 = RequestRecord(prompt_len=20, output_len=1, arrival_time=1.0, token_times=[1.2], first_scheduled_time=1.05)
FAILED = RequestRecord(prompt_len=5000, output_len=4, arrival_time=0.3, token_times=[], error="too long")
STEPS = [
    StepRecord(0.0, 0.05, 0, 2, 2, 0, 3),
    StepRecord(0.1, 0.05, 0, 1, 1, 0, 5, num_preempted=1),
    StepRecord(0.2, 0.10, 0, 1, 1, 0, 4, num_paused_decodes=1),
    StepRecord(0.3, 0.40, 30, 1, 2, 0, 4, num_paused_decodes=1),
]


def approx(value):
    return pytest.approx(value, rel=1e-9, abs=1e-9)


@pytest.fixture
def summary():
    return summarize([R1, R2, FAILED], STEPS, duration_s=1.2, goodput_ms={"ttft": 400, "tpot": 300}, num_kv_blocks=10)


def test_throughput_keys(summary):
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_input_tokens"] == 30 and summary["total_output_tokens"] == 4
    assert summary["duration"] == approx(1.2)
    assert summary["request_throughput"] == approx(2 / 1.2)
    assert summary["output_throughput"] == approx(4 / 1.2)
    assert summary["total_token_throughput"] == approx(34 / 1.2)
    # vLLM's fixed buckets from the first start (0): [0, 1) holds 0.5, 0.7; [1, 2) holds 1.0, 1.2.
    assert summary["max_output_tokens_per_s"] == 2
    assert summary["max_concurrent_requests"] == 2  # r1 (0 to 1.0) and r2 (1.0 to 1.2) both touch [1, 2)


def test_ttft(summary):  # 500 ms and 200 ms
    assert summary["mean_ttft_ms"] == approx(350) and summary["median_ttft_ms"] == approx(350)
    assert summary["std_ttft_ms"] == approx(150)
    assert summary["p50_ttft_ms"] == approx(350) and summary["p90_ttft_ms"] == approx(470)
    assert summary["p95_ttft_ms"] == approx(485) and summary["p99_ttft_ms"] == approx(497)


def test_tpot_excludes_the_first_token_and_single_token_requests(summary):
    # r1: (1000 - 500) / (3 - 1) = 250 ms; r2 has one token and no TPOT.
    for key in ("mean", "median", "p50", "p90", "p95", "p99"):
        assert summary[f"{key}_tpot_ms"] == approx(250)
    assert summary["std_tpot_ms"] == approx(0)


def test_itl_pools_every_gap(summary):  # r1's gaps 200 and 300 ms; r2 has none
    assert summary["mean_itl_ms"] == approx(250) and summary["median_itl_ms"] == approx(250)
    assert summary["std_itl_ms"] == approx(50)
    assert summary["p90_itl_ms"] == approx(290) and summary["p99_itl_ms"] == approx(299)


def test_e2el_and_scheduling_delay(summary):
    assert summary["mean_e2el_ms"] == approx(600) and summary["std_e2el_ms"] == approx(400)
    assert summary["p90_e2el_ms"] == approx(920) and summary["p99_e2el_ms"] == approx(992)
    assert summary["mean_scheduling_delay_ms"] == approx(75)
    assert summary["p99_scheduling_delay_ms"] == approx(50 + 0.99 * 50)


def test_goodput_needs_every_slo(summary):
    # ttft <= 400 and tpot <= 300: r1 misses TTFT (500); r2 meets both (its TPOT counts as 0).
    assert summary["request_goodput"] == approx(1 / 1.2)
    assert summary["sla_attainment_pct"] == approx(50)
    assert summary["sla_attainment_ttft_pct"] == approx(50)
    assert summary["sla_attainment_tpot_pct"] == approx(100)
    tight = summarize([R1, R2], STEPS, 1.2, {"ttft": 600, "tpot": 200})  # r1 meets TTFT, misses TPOT
    assert tight["request_goodput"] == approx(1 / 1.2)
    assert summarize([R1, R2], STEPS, 1.2, {})["request_goodput"] == approx(2 / 1.2)


def test_stalls_preemptions_and_kv(summary):
    # Two steps paused a decode, both in r1's 300 ms gap: one stall. The 200 ms gap had no pause.
    assert summary["num_paused_decodes"] == 2
    assert summary["num_stalls"] == 1 and summary["longest_stall_ms"] == approx(300)
    # decode-only steps: 50, 50, 100 ms -> median 50 ms -> slow above 250 ms: the 400 ms step.
    assert summary["slow_step_threshold_ms"] == approx(250) and summary["num_slow_steps"] == 1
    assert "stall_threshold_ms" not in summary and "client_queue_time" not in str(summary)
    assert summary["num_preemptions"] == 1
    assert summary["peak_kv_blocks"] == 5 and summary["peak_kv_usage_pct"] == approx(50)
    assert summary["num_steps"] == 4


def test_window_and_goodput_parsing():
    late = RequestRecord(1, 5, 0.2, [0.3, 0.999, 1.0, 1.5, 1.6])
    assert peak_per_second([late]) == (3, 1)  # buckets from 0.2: [0.2, 1.2) holds 0.3, 0.999, 1.0
    assert peak_per_second([]) == (0, 0)
    assert parse_goodput("ttft:300 tpot:50 e2el:2000") == {"ttft": 300.0, "tpot": 50.0, "e2el": 2000.0}
    assert parse_goodput(None) == {}
    for bad in ("ttft", "ttft:abc", "itl:30", "ttft:-5"):
        with pytest.raises(UserError, match="--goodput"):
            parse_goodput(bad)


def test_pooled_itls_are_each_requests_gaps_in_order():
    from chunkbench.bench.token_gaps import pooled_itls, token_times

    done = [
        RequestRecord(prompt_len=1, output_len=3, arrival_time=0.0, token_times=[0.1, 0.3, 0.6]),
        RequestRecord(prompt_len=1, output_len=1, arrival_time=0.0, token_times=[5.0]),
        RequestRecord(prompt_len=1, output_len=2, arrival_time=0.0, token_times=[0.2, 0.25]),
    ]
    expected = np.concatenate([np.diff(r.token_times) for r in done])
    assert pooled_itls(done, token_times(done)).tolist() == expected.tolist()
    empty = RequestRecord(prompt_len=1, output_len=1, arrival_time=0.0, token_times=[])
    with pytest.raises(ValueError, match="every record needs token times"):
        pooled_itls([empty] + done, token_times([empty] + done))


def test_peaks_of_requests_far_apart_need_no_dense_array():
    # --rate 1e-12 put arrivals 1e12 s apart: one bucket per second of the run asked for 24.8 TiB
    far = [
        RequestRecord(prompt_len=1, output_len=2, arrival_time=t, token_times=[t + 0.1, t + 0.2])
        for t in (0.0, 1e12, 3e20)
    ]
    assert peak_per_second(far) == (2, 1)


def test_peak_tokens_per_second_dense_and_sparse_counts_agree():
    """Dense bucket counts (most runs) and the occupied-buckets count (sparse runs) give what counting each
    bucket by hand gives."""
    rng = np.random.default_rng(0)
    for span in (5.0, 500.0, 5e6):  # dense, dense, sparse (far more seconds than tokens)
        done = []
        for _ in range(40):
            arrival = float(rng.uniform(0, span))
            done.append(RequestRecord(1, 8, arrival, sorted((arrival + rng.uniform(0, 3, size=8)).tolist())))
        origin = min(r.arrival_time for r in done)
        counts: dict[int, int] = {}
        for r in done:
            for t in r.token_times:
                counts[int(t - origin)] = counts.get(int(t - origin), 0) + 1
        assert peak_per_second(done)[0] == max(counts.values())


def test_the_collector_is_restored_after_a_paused_block():
    """gc_pause: off inside, back to its state after, on an error or a Ctrl-C too, and nested; a frozen heap
    is unfrozen after its block."""
    import gc

    from chunkbench.bench.gc_pause import frozen_heap, gc_paused, paused_gc

    assert gc.isenabled()
    for error in (RuntimeError, KeyboardInterrupt):
        with pytest.raises(error):
            with paused_gc():
                assert not gc.isenabled()
                raise error
        assert gc.isenabled()
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()  # the inner block leaves the outer one's pause in place
    assert gc.isenabled()
    with paused_gc(False):
        assert gc.isenabled()
    assert gc_paused(gc.isenabled)() is False
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
    with pytest.raises(KeyboardInterrupt):
        with frozen_heap():
            assert gc.get_freeze_count() > 0 and gc.isenabled()  # frozen, and still collecting new objects
            raise KeyboardInterrupt
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0  # the inner block leaves the outer one's freeze in place
    assert gc.get_freeze_count() == 0


# # ---------- the server's /metrics (chunkbench/bench/server_metrics.py) against histograms whose answer is known
# ----------

VLLM_QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, float("inf"))  # vLLM's first ones, le in s


def queue_samples(per_bucket: dict[float, int], total_s: float, success: dict[str, int] | None = None) -> dict:
    """A /metrics scrape: vllm:request_queue_time_seconds with `per_bucket` requests in each bucket (cumulated
    as Prometheus does) and _sum `total_s`, plus vllm:request_success_total by finished_reason."""
    running, buckets = 0, []
    for bound in VLLM_QUEUE_BUCKETS:
        running += per_bucket.get(bound, 0)
        buckets.append(({"le": str(bound) if bound != float("inf") else "+Inf"}, float(running)))
    return {
        "vllm:request_queue_time_seconds_bucket": buckets,
        "vllm:request_queue_time_seconds_count": [({}, float(running))],
        "vllm:request_queue_time_seconds_sum": [({}, total_s)],
        "vllm:request_success_total": [({"finished_reason": r}, float(n)) for r, n in (success or {}).items()],
    }


def test_a_light_load_queue_time_is_its_mean_and_bounds_not_the_first_bucket_s_middle():
    from chunkbench.bench.server_metrics import server_figures

    before = queue_samples({0.3: 5}, 2.0, {"stop": 1, "length": 4, "abort": 0})
    after = queue_samples({0.3: 15}, 2.03, {"stop": 1, "length": 12, "abort": 2})  # 10 requests, 30 ms in all
    figures = server_figures(before, after, ttfts_s=[0.020] * 9 + [0.040])
    assert figures["mean_scheduling_delay_ms"] == approx(3.0)  # _sum/_count: 0.03 s / 10
    assert figures["median_scheduling_delay_ms"] == approx(20.0)  # the median TTFT bounds it, not 150 ms
    assert figures["p99_scheduling_delay_ms"] == approx(np.percentile([20] * 9 + [40], 99))
    assert figures["std_scheduling_delay_ms"] is None
    sources = figures["scheduling_delay_sources"]
    assert sources["mean"] == "server: _sum/_count" and sources["median"].startswith("upper bound: the client's TTFT")
    assert figures["server_requests"] == 8 and figures["server_requests_by_finished_reason"] == {
        "abort": 2,
        "length": 8,
        "stop": 0,
    }
    no_ttft = server_figures(before, after)
    assert (
        no_ttft["median_scheduling_delay_ms"] == approx(300.0)
        and "(0, 0.3]" in no_ttft["scheduling_delay_sources"]["median"]
    )


def test_a_percentile_in_a_resolving_bucket_is_interpolated_and_one_past_the_last_is_a_lower_bound():
    from chunkbench.bench.server_metrics import server_figures

    after = queue_samples({0.3: 10, 1.5: 80, float("inf"): 10}, 100.0)
    figures = server_figures({}, after, ttfts_s=[5.0] * 100)
    # rank 50 of 100: 40 of the 80 in (1.0, 1.5] -> 1.0 + 0.5 * 40 / 80 = 1.25 s
    assert figures["median_scheduling_delay_ms"] == approx(1250.0)
    assert figures["p90_scheduling_delay_ms"] == approx(1500.0)  # rank 90: the bucket's top
    assert figures["p99_scheduling_delay_ms"] == approx(10000.0)  # above le=10: at least 10 s
    assert figures["scheduling_delay_sources"]["p99"].startswith("lower bound")
    assert figures["scheduling_delay_sources"]["median"] == "server: bucket (1, 1.5] s, interpolated"
    assert figures["mean_scheduling_delay_ms"] == approx(1000.0)


def test_the_kv_cache_a_vllm_server_holds_is_read_from_its_cache_config_gauge():
    """vllm:cache_config_info carries vLLM's CacheConfig as labels; num_gpu_blocks counts the null block."""
    from chunkbench.bench.server_metrics import kv_cache_tokens, server_figures

    gauge = {"vllm:cache_config_info": [({"block_size": "128", "num_gpu_blocks": "4096", "engine": "0"}, 1.0)]}
    assert kv_cache_tokens(gauge) == 524160  # the tier's vLLM 0.32: 4,096 blocks of 128, one the null block
    assert server_figures({}, queue_samples({0.3: 1}, 0.01) | gauge)["server_kv_cache_tokens"] == 524160
    assert "server_kv_cache_tokens" not in server_figures({}, queue_samples({0.3: 1}, 0.01))
    for labels in (
        {"block_size": "16", "num_gpu_blocks": "None"},
        {"num_gpu_blocks": "9"},
        {"block_size": "16", "num_gpu_blocks": "1"},
    ):  # not yet sized, half said, only the null block
        assert kv_cache_tokens({"vllm:cache_config_info": [(labels, 1.0)]}) is None
