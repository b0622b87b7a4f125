"""A run against SGLang reads its /metrics under SGLang 0.5.23's names (chunkbench/bench/server_metrics.py): known
scrapes before and after, in the text its Prometheus multiprocess collector writes, give known figures."""

from pytest import approx

from chunkbench.bench.server_metrics import metrics_kind, parse_metrics, server_figures

SCHED = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
TOK = 'engine_type="unified",model_name="m"'
QUEUE_BOUNDS = ("0.0", "0.001", "0.005", "0.01", "0.05", "0.1", "0.2", "0.5", "1.0", "2.0", "+Inf")


def sglang_text(
    queue: dict[str, int], queue_sum: float, prompt: int, generated: int, requests: int, aborted: int, waiting: int
) -> str:
    """SGLang's /metrics after the warm-up (one request, 6 prompt tokens, 8 generated, not streamed) and
    `requests` streamed ones; `queue`: requests per queue-time bucket (its upper bound)."""
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{SCHED}}} 0.0",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{SCHED}}} {waiting}.0",
        "# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.",
        "# TYPE sglang:max_total_num_tokens gauge",
        f"sglang:max_total_num_tokens{{{SCHED}}} 480000.0",
        "# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.",
        "# TYPE sglang:queue_time_seconds histogram",
    ]
    total = 0
    for bound in QUEUE_BOUNDS:
        total += queue.get(bound, 0)
        lines.append(f'sglang:queue_time_seconds_bucket{{{SCHED},le="{bound}"}} {total}.0')
    lines += [
        f"sglang:queue_time_seconds_count{{{SCHED}}} {total}.0",
        f"sglang:queue_time_seconds_sum{{{SCHED}}} {queue_sum}",
    ]
    for name, warm, run in (
        ("prompt_tokens", 6, prompt),
        ("generation_tokens", 8, generated),
        ("num_requests", 1, requests),
    ):
        lines += [f"# HELP sglang:{name}_total Number of {name}.", f"# TYPE sglang:{name}_total counter"]
        lines += [f'sglang:{name}_total{{{TOK},is_streaming="false"}} {warm}.0']
        lines += [f'sglang:{name}_total{{{TOK},is_streaming="true"}} {run}.0'] if requests else []
    lines += [
        "# HELP sglang:num_aborted_requests_total Number of requests aborted.",
        "# TYPE sglang:num_aborted_requests_total counter",
    ]
    return "\n".join(lines + [f"sglang:num_aborted_requests_total{{{TOK}}} {aborted}.0", ""])


BEFORE = parse_metrics(sglang_text({"0.001": 1}, 0.0004, 0, 0, 0, 0, 0))
# The run: 12 streamed requests, 2 of them aborted, 10 waited 0.1 to 0.2 s (1.5 s in all), 3 still waiting.
AFTER = parse_metrics(sglang_text({"0.001": 1, "0.2": 10}, 1.5004, 5120, 640, 12, 2, 3))


def test_an_sglang_run_reports_its_queue_time_tokens_requests_and_kv_pool():
    figures = server_figures(BEFORE, AFTER, ttfts_s=[0.5] * 10)
    assert metrics_kind(AFTER) == "sglang" and figures["server_metrics"] == "sglang"
    assert figures["mean_scheduling_delay_ms"] == approx(150.0)  # 1.5 s over 10 requests
    # rank 5 of the 10 in (0.1, 0.2] s: 0.1 + 0.1 * 5 / 10, interpolated (the bucket resolves it)
    assert figures["median_scheduling_delay_ms"] == approx(150.0)
    assert figures["scheduling_delay_sources"]["median"] == "server: bucket (0.1, 0.2] s, interpolated"
    assert figures["server_prompt_tokens"] == 5120 and figures["server_generation_tokens"] == 640
    assert figures["server_requests"] == 10 and figures["server_requests_aborted"] == 2  # finished less aborted
    assert figures["server_running_requests_after"] == 0 and figures["server_waiting_requests_after"] == 3
    assert figures["server_kv_cache_tokens"] == 480000
    assert set(figures["server_unavailable"]) == {"server_requests_by_finished_reason", "server_mean_step_tokens"}
    assert "server_requests_by_finished_reason" not in figures and "server_mean_step_tokens" not in figures


def test_a_queue_time_in_a_bucket_too_wide_is_bounded_by_the_ttft():
    after = parse_metrics(sglang_text({"0.001": 1, "0.05": 10}, 0.2004, 10, 10, 10, 0, 0))  # (0.01, 0.05]: 5x wide
    figures = server_figures(BEFORE, after, ttfts_s=[0.03] * 10)
    assert figures["median_scheduling_delay_ms"] == approx(30.0)
    assert figures["scheduling_delay_sources"]["median"].startswith("upper bound: the client's TTFT")


def test_an_sglang_server_without_enable_metrics_gives_no_figures():
    assert server_figures({}, {}) == {} and metrics_kind({}) is None  # /metrics answers 404: scrape_metrics {}


def test_vllm_names_give_the_same_common_figures():
    text = "\n".join(
        [
            "# TYPE vllm:prompt_tokens_total counter",
            'vllm:prompt_tokens_total{model_name="m"} 300.0',
            "# TYPE vllm:generation_tokens_total counter",
            'vllm:generation_tokens_total{model_name="m"} 40.0',
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{model_name="m"} 2.0',
            "",
        ]
    )
    before = {"vllm:prompt_tokens_total": [({"model_name": "m"}, 100.0)]}
    figures = server_figures(before, parse_metrics(text))
    assert figures["server_metrics"] == "vllm" and "server_unavailable" not in figures
    assert figures["server_prompt_tokens"] == 200 and figures["server_generation_tokens"] == 40
    assert figures["server_running_requests_after"] == 2 and "server_waiting_requests_after" not in figures
