"""What a run added to a server's Prometheus /metrics, under vLLM's names or SGLang's, read honestly: a histogram's
mean from its _sum/_count, a percentile from its buckets only when the buckets resolve it, each statistic's source
named.

vLLM's vllm:request_queue_time_seconds starts at le=0.3: at light load every request lies in that first bucket,
and interpolating in it reports 150 ms for a median that is really ~1 ms. Such a percentile is reported as the
bound it lies under instead (tightened by the same percentile of the client's TTFT: a request's queue time is
part of its TTFT), and the source says so.

SGLang (0.5.23, --enable-metrics; sglang/srt/observability/metrics_collector.py) gives the same queue time
(sglang:queue_time_seconds: each request's wait before its first forward pass), token totals, running and queued
requests, and its KV pool's size; what its names cannot give is listed under server_unavailable.
"""

from __future__ import annotations

import math

import httpx
import numpy as np

from chunkbench import web
from chunkbench.bench.metrics import PERCENTILES, pct_key

QUEUE_TIME = "vllm:request_queue_time_seconds"
# The figures both servers give, under each one's names: the queue-time histogram, counters of the prompt and
# generated tokens of finished requests, and gauges of the requests in a batch and waiting.
NAMES = {
    "vllm": {
        "queue_time": QUEUE_TIME,
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
    },
    "sglang": {
        "queue_time": "sglang:queue_time_seconds",
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
    },
}
SGLANG_UNAVAILABLE = {
    "server_requests_by_finished_reason": "SGLang counts finished requests (sglang:num_requests_total) without "
    "their finish reason",
    "server_mean_step_tokens": "SGLang has no tokens-per-step histogram, and its sglang:realtime_tokens_total "
    "leaves a mixed chunk's decode tokens out",
}
RESOLVING_RATIO = 2.0  # a bucket (lower, upper] resolves a percentile when 0 < lower and upper <= 2 x lower
SUCCESS_REASONS = ("stop", "length")  # vLLM's finished_reason labels of a request that completed normally


def scrape_metrics(endpoint: str) -> dict:
    """The server's Prometheus /metrics as {sample name: [(labels, value)]}; {} when it has none."""
    try:
        response = web.get(endpoint.rstrip("/").removesuffix("/v1") + "/metrics", timeout=5.0)
        return parse_metrics(response.text) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def parse_metrics(text: str) -> dict:
    """Prometheus text as {sample name: [(labels, value)]}; raises ValueError on text that is not."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def metrics_kind(samples: dict) -> str | None:
    """Whose names a scrape has: "sglang" or "vllm" (chunkbench serve's are vLLM's), None for neither."""
    prefixes = {name.split(":", 1)[0] for name in samples if ":" in name}
    return next((kind for kind in NAMES if kind in prefixes), None)


def _total(samples: dict, name: str, **labels) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def _delta(before: dict, after: dict, name: str) -> float:
    return _total(after, name) - _total(before, name)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's histogram_quantile: the q-quantile of cumulative bucket counts {upper bound: count},
    linear within the bucket it falls in."""
    lower, upper = quantile_bucket(q, buckets)
    if upper == math.inf:
        return lower
    below = buckets.get(lower, 0.0)
    inside = buckets[upper] - below
    rank = q * buckets[max(buckets)]
    return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)


def quantile_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float]:
    """(lower, upper] of the bucket the q-quantile falls in (lower 0 for the first bucket)."""
    rank, lower = q * buckets[max(buckets)], 0.0
    for upper in sorted(buckets):
        if buckets[upper] >= rank:
            return lower, upper
        lower = upper
    return lower, math.inf


def _run_buckets(before: dict, after: dict, name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for labels, value in after.get(name + "_bucket", []):
        buckets[float(labels["le"])] = buckets.get(float(labels["le"]), 0.0) + value
    for labels, value in before.get(name + "_bucket", []):
        if float(labels["le"]) not in buckets:  # not the same server's histogram before and after: no figures
            return {}
        buckets[float(labels["le"])] -= value
    return buckets


def percentile_from_buckets(q: float, buckets: dict[float, float], ceiling_s: float | None) -> tuple[float, str]:
    """(value in s, its source): interpolated when the bucket resolves it, else the bound it lies under (the
    smaller of the bucket's upper bound and `ceiling_s`), or above (an open last bucket)."""
    lower, upper = quantile_bucket(q, buckets)
    if upper == math.inf:
        return lower, f"lower bound: above the server's last bucket le={lower:g} s"
    if lower > 0 and upper <= RESOLVING_RATIO * lower:
        return histogram_quantile(q, buckets), f"server: bucket ({lower:g}, {upper:g}] s, interpolated"
    if ceiling_s is not None and ceiling_s < upper:
        return ceiling_s, (
            f"upper bound: the client's TTFT (the server's bucket ({lower:g}, {upper:g}] s does not resolve it)"
        )
    return upper, f"upper bound: the server's bucket ({lower:g}, {upper:g}] s does not resolve it"


def queue_time_figures(before: dict, after: dict, ttfts_s: list[float] | None = None, name: str = QUEUE_TIME) -> dict:
    """The scheduling delay (the server's queue time, histogram `name`) of the run: every statistic of the key
    with its source in scheduling_delay_sources. `ttfts_s`: the completed requests' TTFTs, whose percentiles
    bound the delay's."""
    count = _delta(before, after, name + "_count")
    buckets = _run_buckets(before, after, name)
    if count <= 0 or not buckets or buckets[max(buckets)] <= 0:
        return {}
    figures = {
        "mean_scheduling_delay_ms": 1000.0 * _delta(before, after, name + "_sum") / count,
        "std_scheduling_delay_ms": None,
        "scheduling_delay_source": "server",
    }
    sources = {"mean": "server: _sum/_count", "std": "unavailable: a histogram has no spread"}
    ttfts = np.asarray(ttfts_s or [], dtype=float)
    for name, p in [("median", 50)] + [(pct_key(p), p) for p in PERCENTILES]:
        ceiling = float(np.percentile(ttfts, p)) if ttfts.size else None
        value, sources[name] = percentile_from_buckets(p / 100.0, buckets, ceiling)
        figures[f"{name}_scheduling_delay_ms"] = 1000.0 * value
    return figures | {"scheduling_delay_sources": sources}


def server_figures(before: dict, after: dict, ttfts_s: list[float] | None = None) -> dict:
    """What the run added to the server's metrics, under vLLM's names or SGLang's: the scheduling delay
    (queue_time_figures), the prompt and generated tokens of the requests it finished, the requests still in a
    batch and waiting when it ended, the KV cache's size, and (vLLM) the mean tokens per engine step and the
    requests it finished by finished_reason, or (SGLang) those it finished less those aborted. server_metrics
    names whose names they are. {} when the server exposes none of them."""
    kind = metrics_kind(after)
    if kind is None:
        return {}
    names = NAMES[kind]
    figures = queue_time_figures(before, after, ttfts_s, names["queue_time"])
    for figure in ("prompt_tokens", "generation_tokens"):
        if names[figure] in after:
            figures[f"server_{figure}"] = int(_delta(before, after, names[figure]))
    for figure in ("running", "waiting"):
        if names[figure] in after:
            figures[f"server_{figure}_requests_after"] = int(_total(after, names[figure]))
    figures |= _vllm_figures(before, after) if kind == "vllm" else _sglang_figures(before, after)
    tokens = kv_cache_tokens(after)
    if tokens:
        figures["server_kv_cache_tokens"] = tokens
    return figures | {"server_metrics": kind} if figures else {}


def _vllm_figures(before: dict, after: dict) -> dict:
    """The mean tokens per engine step (vllm:iteration_tokens_total's sum over its count) and the requests
    finished by vLLM's finished_reason label (server_requests: those that finished normally, stop or length)."""
    figures: dict = {}
    steps = _delta(before, after, "vllm:iteration_tokens_total_count")
    if steps > 0:
        figures["server_mean_step_tokens"] = _delta(before, after, "vllm:iteration_tokens_total_sum") / steps
    if "vllm:request_success_total" in after:
        reasons = sorted({labels.get("finished_reason", "") for labels, _ in after["vllm:request_success_total"]})
        by_reason = {
            r: int(
                _total(after, "vllm:request_success_total", finished_reason=r)
                - _total(before, "vllm:request_success_total", finished_reason=r)
            )
            for r in reasons
        }
        figures["server_requests_by_finished_reason"] = by_reason
        figures["server_requests"] = sum(n for r, n in by_reason.items() if r in SUCCESS_REASONS or r == "")
    return figures


def _sglang_figures(before: dict, after: dict) -> dict:
    """The requests SGLang finished less those it aborted: sglang:num_requests_total counts an aborted request
    as finished, and sglang:num_aborted_requests_total counts the aborts (a client gone 2 s)."""
    figures: dict = {"server_unavailable": dict(SGLANG_UNAVAILABLE)}
    if "sglang:num_requests_total" in after:
        aborted = int(_delta(before, after, "sglang:num_aborted_requests_total"))
        figures["server_requests"] = int(_delta(before, after, "sglang:num_requests_total")) - aborted
        figures["server_requests_aborted"] = aborted
    return figures


def kv_cache_tokens(samples: dict) -> int | None:
    """The tokens the server's KV cache holds for requests, from vLLM's vllm:cache_config_info gauge (its
    CacheConfig as labels): num_gpu_blocks less the null block (block 0, which vLLM 0.32's block pool takes for
    itself) times block_size. The tier's vLLM 0.32 CPU server (1 GiB, the tiny Llama in fp32) logs "CPU KV
    cache size: 524,288 tokens" (the null block counted) and says 4,096 blocks of 128: 524,160 here. SGLang's
    pool size is its sglang:max_total_num_tokens gauge. None when the server does not say."""
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit() and int(blocks) > 1:
            return (int(blocks) - 1) * int(size)
    pool = _total(samples, "sglang:max_total_num_tokens")
    return int(pool) if pool > 0 else None
