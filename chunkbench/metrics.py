"""Serving metrics as pure functions of recorded events, named as `vllm bench serve --save-result` names them.

Per request: TTFT (arrival to first token), TPOT ((E2EL - TTFT) / (output_len - 1), for output_len > 1),
ITL (every gap between consecutive tokens, pooled), E2EL (arrival to last token), scheduling delay
(arrival to first scheduled step). Percentiles are numpy's linear ones. Times in the summary are ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """What the harness saw of one request. Times are seconds on the run's clock."""

    prompt_len: int
    output_len: int
    arrival_time: float
    token_times: list[float]
    first_scheduled_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.token_times) > 0

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def e2el(self) -> float:
        return self.token_times[-1] - self.arrival_time

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.e2el - self.ttft) / (n - 1) if n > 1 else None

    @property
    def itls(self) -> list[float]:
        return list(np.diff(self.token_times))


@dataclass
class StepRecord:
    start: float
    seconds: float
    prefill_tokens: int
    decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    num_preempted: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied to requests admitted in this step
    peak_activation_bytes: int = 0  # the step's activation peak (engine/activation.py; measured on CUDA)


def pct_key(p: float) -> str:
    return f"p{int(p) if float(p).is_integer() else p}"


def _stats(prefix: str, values_s: list[float], percentiles=PERCENTILES) -> dict[str, float]:
    ms = np.asarray(values_s, dtype=float) * 1000.0
    if ms.size == 0:
        ms = np.zeros(1)
    out = {f"mean_{prefix}_ms": float(ms.mean()), f"median_{prefix}_ms": float(np.median(ms)),
           f"std_{prefix}_ms": float(ms.std())}
    out.update({f"{pct_key(p)}_{prefix}_ms": float(np.percentile(ms, p)) for p in percentiles})
    return out


def is_good(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """DistServe goodput: a request counts only when it meets every SLO given."""
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return all(values[name] * 1000.0 <= limit for name, limit in slos_ms.items())


def stall_stats(records: list[RequestRecord], steps: list[StepRecord],
                threshold_s: float | None = None) -> dict[str, float]:
    """Generation stalls: ITL gaps above the threshold (default 5x the median decode-only step time)."""
    if threshold_s is None:
        decode_only = [s.seconds for s in steps if s.prefill_tokens == 0 and s.decode_tokens > 0]
        threshold_s = 5.0 * float(np.median(decode_only)) if decode_only else float("inf")
    gaps = [g for r in records if r.ok for g in r.itls]
    stalls = [g for g in gaps if g > threshold_s]
    return {"stall_threshold_ms": threshold_s * 1000.0, "num_stalls": len(stalls),
            "longest_stall_ms": max(stalls, default=0.0) * 1000.0}


def max_tokens_in_window(times: list[float], window: float = 1.0) -> int:
    """Most token timestamps inside any window of `window` seconds."""
    t = np.sort(np.asarray(times, dtype=float))
    if t.size == 0:
        return 0
    ends = np.searchsorted(t, t + window, side="left")
    return int((ends - np.arange(t.size)).max())


def summarize(records: list[RequestRecord], steps: list[StepRecord], duration_s: float,
              goodput_ms: dict[str, float] | None = None, num_kv_blocks: int | None = None,
              stall_threshold_s: float | None = None, extra_percentiles=()) -> dict[str, float]:
    """The summary dict: vLLM's keys plus goodput, SLA attainment, stalls, delays, preemptions, KV peak."""
    goodput_ms = goodput_ms or {}
    pcts = sorted(set(PERCENTILES) | set(extra_percentiles))
    done = [r for r in records if r.ok]
    duration_s = max(duration_s, 1e-9)
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(len(r.token_times) for r in done)
    good = [r for r in done if is_good(r, goodput_ms)]
    summary: dict[str, float] = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration_s,
        "request_goodput": len(good) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "max_output_tokens_per_s": max_tokens_in_window([t for r in done for t in r.token_times]),
    }
    summary |= _stats("ttft", [r.ttft for r in done], pcts)
    summary |= _stats("tpot", [r.tpot for r in done if r.tpot is not None], pcts)
    summary |= _stats("itl", [g for r in done for g in r.itls], pcts)
    summary |= _stats("e2el", [r.e2el for r in done], pcts)
    summary |= _stats("scheduling_delay", [r.first_scheduled_time - r.arrival_time for r in done
                                           if r.first_scheduled_time is not None], pcts)
    summary["sla_attainment_pct"] = 100.0 * len(good) / len(done) if done else 0.0
    for name in goodput_ms:
        met = sum(is_good(r, {name: goodput_ms[name]}) for r in done)
        summary[f"sla_attainment_{name}_pct"] = 100.0 * met / len(done) if done else 0.0
    summary |= stall_stats(done, steps, stall_threshold_s)
    summary["num_preemptions"] = sum(s.num_preempted for s in steps)
    peak = max((s.kv_blocks_used for s in steps), default=0)
    summary["peak_kv_blocks"] = peak
    if num_kv_blocks:
        summary["peak_kv_usage_pct"] = 100.0 * peak / num_kv_blocks
    cached = sum(r.num_cached_tokens for r in done)
    summary["cached_prompt_tokens"] = cached
    summary["computed_prompt_tokens"] = total_in - cached
    summary["prefix_cache_hit_rate_pct"] = 100.0 * cached / total_in if total_in else 0.0
    summary["prefix_cache_request_hit_rate_pct"] = (100.0 * sum(r.num_cached_tokens > 0 for r in done) / len(done)
                                                    if done else 0.0)
    summary["num_steps"] = len(steps)
    summary["peak_activation_bytes"] = max((s.peak_activation_bytes for s in steps), default=0)
    return summary


@dataclass
class MetricInfo:
    name: str
    definition: str
    unit: str


METRIC_TABLE: list[MetricInfo] = [
    MetricInfo("completed / failed", "requests that produced all their tokens / that were rejected or aborted",
               "requests"),
    MetricInfo("duration", "first arrival to last token of the run", "s"),
    MetricInfo("request_throughput", "completed / duration", "req/s"),
    MetricInfo("request_goodput", "requests meeting every --goodput SLO / duration (DistServe)", "req/s"),
    MetricInfo("output_throughput", "output tokens / duration", "tok/s"),
    MetricInfo("total_token_throughput", "(prompt + output tokens) / duration", "tok/s"),
    MetricInfo("max_output_tokens_per_s", "most output tokens produced inside any 1 s window", "tok"),
    MetricInfo("{mean,median,std,p50,p90,p95,p99}_ttft_ms", "time to first token: arrival to first token", "ms"),
    MetricInfo("..._tpot_ms", "time per output token: (E2EL - TTFT) / (output_len - 1), requests with "
               "more than one output token", "ms"),
    MetricInfo("..._itl_ms", "inter-token latency (TBT): every gap between consecutive tokens of a request, "
               "pooled over requests", "ms"),
    MetricInfo("..._e2el_ms", "end-to-end latency: arrival to last token", "ms"),
    MetricInfo("..._scheduling_delay_ms", "arrival to the first step that computes any of the request", "ms"),
    MetricInfo("sla_attainment_pct", "share of completed requests meeting every SLO given; "
               "sla_attainment_<metric>_pct for each SLO alone", "%"),
    MetricInfo("num_stalls / longest_stall_ms", "ITL gaps above stall_threshold_ms (5x the median "
               "decode-only step time of the run): their count and the longest", "count / ms"),
    MetricInfo("num_preemptions", "requests evicted from the KV cache and recomputed", "count"),
    MetricInfo("peak_kv_blocks / peak_kv_usage_pct", "most KV blocks in use at once, and as a share of the "
               "cache", "blocks / %"),
    MetricInfo("prefix_cache_hit_rate_pct / prefix_cache_request_hit_rate_pct", "prompt tokens served from "
               "the prefix cache / requests that found any cached prefix (first admission)", "%"),
    MetricInfo("cached_prompt_tokens / computed_prompt_tokens", "prompt tokens taken from the prefix cache / "
               "prompt tokens computed", "tokens"),
    MetricInfo("num_steps", "engine steps in the run", "count"),
    MetricInfo("peak_activation_bytes", "largest activation peak of any step, per GPU: measured on CUDA (allocator "
               "peak minus what was allocated before the step), else engine/activation.py's formula", "bytes"),
]
