"""What every summary key means, and whether it matches `vllm bench serve`: the README's metric table is
generated from METRIC_TABLE (tests/runs/test_metric_table.py keeps them equal)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    name: str
    definition: str
    unit: str
    vllm: str  # how the key compares with `vllm bench serve --save-result` (for an endpoint run)


SAME = "same"
METRIC_TABLE: list[MetricInfo] = [
    MetricInfo(
        "completed / failed",
        "requests that produced all their tokens / that were rejected, aborted, or "
        "(endpoint) got an HTTP error, an error event, a bad stream, a timeout",
        "requests",
        "same, except that vLLM counts an `error` event or a stream cut before `[DONE]` as a success",
    ),
    MetricInfo(
        "duration",
        "engine: first arrival to last token; endpoint: clock start (after any --num-warmups) "
        "to the end of the last request, failed ones too; 0 when nothing ran",
        "s",
        SAME,
    ),
    MetricInfo(
        "total_input_tokens / total_output_tokens",
        "prompt / output tokens of the completed requests (endpoint: the server's usage counts when it sends them)",
        "tokens",
        SAME,
    ),
    MetricInfo("request_throughput", "completed / duration (0 when duration is 0)", "req/s", SAME),
    MetricInfo("request_goodput", "requests meeting every --goodput SLO / duration (DistServe)", "req/s", SAME),
    MetricInfo(
        "output_throughput",
        "output tokens / duration; endpoint: the server's usage.completion_tokens, else chunks with text",
        "tok/s",
        "same with usage; without it vLLM re-tokenizes the text, chunkbench counts text chunks",
    ),
    MetricInfo(
        "total_token_throughput",
        "(prompt + output tokens) / duration; endpoint: prompt tokens from "
        "usage.prompt_tokens when the server sends it",
        "tok/s",
        SAME,
    ),
    MetricInfo(
        "max_output_tokens_per_s / max_concurrent_requests",
        "most output events (tokens; chunks over "
        "HTTP) / requests active in one fixed 1 s bucket counted from the first request's start",
        "tok / req",
        SAME,
    ),
    MetricInfo(
        "{mean,median,std,p50,p90,p95,p99}_ttft_ms",
        "time to first token: arrival (endpoint: the "
        "send, after any --max-concurrency wait) to the first event (chunk with a choice, even empty)",
        "ms",
        SAME,
    ),
    MetricInfo(
        "..._tpot_ms",
        "time per output token: (E2EL - TTFT) / (output tokens - 1), requests with more than one output token",
        "ms",
        SAME,
    ),
    MetricInfo(
        "..._itl_ms",
        "inter-token latency: every gap between consecutive events of a request (a "
        "multi-token chunk is one gap), pooled over requests",
        "ms",
        SAME,
    ),
    MetricInfo("..._e2el_ms", "end-to-end latency: arrival (endpoint: the send) to the last event", "ms", SAME),
    MetricInfo(
        "..._client_queue_time_ms",
        "endpoint only: the client's dispatch of the request to its send, the wait for a --max-concurrency slot",
        "ms",
        "same (vLLM lists it under --percentile-metrics)",
    ),
    MetricInfo(
        "..._send_lag_ms / max_send_lag_ms",
        "endpoint only: how late the client's loop dispatched each request (failed ones too) after its due time",
        "ms",
        "chunkbench only",
    ),
    MetricInfo(
        "output_token_source",
        "endpoint only: usage (the server's completion_tokens), chunks (text chunks counted), or mixed",
        "text",
        "chunkbench only",
    ),
    MetricInfo(
        "..._scheduling_delay_ms",
        "arrival to the first step that computes any of the request; "
        "endpoint: from the server's vllm:request_queue_time_seconds histogram when it has one "
        "(scheduling_delay_source 'server': mean from _sum/_count; a percentile interpolated only in a "
        "bucket (lo, hi] with 0 < lo and hi <= 2 lo, else the bound it lies under, the smaller of the "
        "bucket's top and the same percentile of TTFT; std null), else TTFT as an upper bound "
        "('ttft-proxy')",
        "ms",
        "chunkbench only",
    ),
    MetricInfo(
        "scheduling_delay_source / scheduling_delay_sources / server_requests / "
        "server_requests_by_finished_reason / server_mean_step_tokens",
        "endpoint only: where the "
        "scheduling delay came from (server or ttft-proxy), and each statistic's source; requests the "
        "server's vllm:request_success_total counted during the run that finished normally (stop, "
        "length), and every finished_reason's count; the server's mean tokens per engine step during the "
        "run (its vllm:iteration_tokens_total histogram, sum over count)",
        "text / count / tokens",
        "chunkbench only",
    ),
    MetricInfo(
        "sla_attainment_pct",
        "share of completed requests meeting every SLO given; sla_attainment_<metric>_pct for each SLO alone",
        "%",
        "chunkbench only",
    ),
    MetricInfo(
        "num_paused_decodes",
        "engine only: steps that left a running decode out, summed over requests, as the scheduler decided them",
        "count",
        "chunkbench only",
    ),
    MetricInfo(
        "num_stalls / longest_stall_ms / stall_threshold_ms",
        "engine: token gaps during which the "
        "request was a paused decode, their count and the longest; endpoint: ITL gaps above "
        "stall_threshold_ms (5x the run's median ITL)",
        "count / ms",
        "chunkbench only",
    ),
    MetricInfo(
        "num_slow_steps / slow_step_threshold_ms",
        "engine only: steps longer than 5x the run's median "
        "decode-only step (the key is absent without a decode-only step)",
        "count / ms",
        "chunkbench only",
    ),
    MetricInfo(
        "num_preemptions", "requests evicted from the KV cache and recomputed; endpoint: 0", "count", "chunkbench only"
    ),
    MetricInfo(
        "peak_kv_blocks / peak_kv_usage_pct",
        "most KV blocks in use at once, and as a share of the cache; endpoint: 0",
        "blocks / %",
        "chunkbench only",
    ),
    MetricInfo(
        "prefix_cache_hit_rate_pct / prefix_cache_request_hit_rate_pct",
        "prompt tokens served from the prefix cache / requests that found any cached prefix (first admission)",
        "%",
        "chunkbench only",
    ),
    MetricInfo(
        "cached_prompt_tokens / computed_prompt_tokens",
        "prompt tokens taken from the prefix cache / prompt tokens computed",
        "tokens",
        "chunkbench only",
    ),
    MetricInfo("num_steps", "engine steps in the run; endpoint: 0", "count", "chunkbench only"),
    MetricInfo(
        "median_step_ms / p99_step_ms / max_step_ms",
        "engine only: step durations (what --step-time-target holds steps to)",
        "ms",
        "chunkbench only",
    ),
    MetricInfo(
        "peak_activation_bytes",
        "engine only: largest activation peak of any step, per GPU: measured on CUDA "
        "(allocator peak minus what was allocated before the step), else engine/activation.py's formula",
        "bytes",
        "chunkbench only",
    ),
]


def metric_table_markdown() -> str:
    """The README's metric table, generated from METRIC_TABLE (a test keeps the two equal)."""
    lines = ["| metric | definition | unit | vs `vllm bench serve` |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {m.definition} | {m.unit} | {m.vllm} |" for m in METRIC_TABLE]
    return "\n".join(lines)
