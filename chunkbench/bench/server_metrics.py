"""What a run added to a server's Prometheus /metrics (vLLM's names), read honestly: a histogram's mean from its
_sum/_count, a percentile from its buckets only when the buckets resolve it, each statistic's source named.

vLLM's vllm:request_queue_time_seconds starts at le=0.3: at light load every request lies in that first bucket,
and interpolating in it reports 150 ms for a median that is really ~1 ms. Such a percentile is reported as the
bound it lies under instead (tightened by the same percentile of the client's TTFT: a request's queue time is
part of its TTFT), and the source says so.
"""

from __future__ import annotations

import math

import httpx
import numpy as np

from chunkbench.bench.metrics import PERCENTILES, pct_key

QUEUE_TIME = "vllm:request_queue_time_seconds"
RESOLVING_RATIO = 2.0  # a bucket (lower, upper] resolves a percentile when 0 < lower and upper <= 2 x lower
SUCCESS_REASONS = ("stop", "length")  # vLLM's finished_reason labels of a request that completed normally


def scrape_metrics(endpoint: str) -> dict:
    """The server's Prometheus /metrics as {sample name: [(labels, value)]}; {} when it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(endpoint.rstrip("/").removesuffix("/v1") + "/metrics", timeout=5.0)
        if response.status_code != 200:
            return {}
        samples: dict = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        return samples
    except (httpx.HTTPError, ValueError):
        return {}


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


def queue_time_figures(before: dict, after: dict, ttfts_s: list[float] | None = None) -> dict:
    """The scheduling delay (vLLM's queue time) of the run: every statistic of the key with its source in
    scheduling_delay_sources. `ttfts_s`: the completed requests' TTFTs, whose percentiles bound the delay's."""
    count = _delta(before, after, QUEUE_TIME + "_count")
    buckets = _run_buckets(before, after, QUEUE_TIME)
    if count <= 0 or not buckets or buckets[max(buckets)] <= 0:
        return {}
    figures = {
        "mean_scheduling_delay_ms": 1000.0 * _delta(before, after, QUEUE_TIME + "_sum") / count,
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
    """What the run added to the server's vLLM-named metrics: the scheduling delay (queue_time_figures), the
    mean tokens per engine step, and the requests it finished by vLLM's finished_reason label (server_requests:
    those that finished normally, stop or length). {} when the server exposes none of them."""
    figures = queue_time_figures(before, after, ttfts_s)
    steps = _delta(before, after, "vllm:iteration_tokens_total_count")
    if steps > 0:  # the engine's mean tokens per step (its iteration-tokens histogram's sum over its count)
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
    tokens = kv_cache_tokens(after)
    if tokens:
        figures["server_kv_cache_tokens"] = tokens
    return figures


def kv_cache_tokens(samples: dict) -> int | None:
    """The tokens the server's KV cache holds for requests, from vLLM's vllm:cache_config_info gauge (its
    CacheConfig as labels): num_gpu_blocks less the null block (block 0, which vLLM 0.32's block pool takes for
    itself) times block_size. The tier's vLLM 0.32 CPU server (1 GiB, the tiny Llama in fp32) logs "CPU KV
    cache size: 524,288 tokens" (the null block counted) and says 4,096 blocks of 128: 524,160 here. None when
    the server does not say."""
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit() and int(blocks) > 1:
            return (int(blocks) - 1) * int(size)
    return None
