"""Serving metrics as pure functions of recorded events, named as `vllm bench serve --save-result` names them.

Per request: TTFT (arrival to first token), TPOT ((E2EL - TTFT) / (output_len - 1), for output_len > 1),
ITL (every gap between consecutive tokens, pooled), E2EL (arrival to last token), scheduling delay
(arrival to first scheduled step). Percentiles are numpy's linear ones. Times in the summary are ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_type_hints

import numpy as np

from chunkbench.bench.gc_pause import gc_paused
from chunkbench.bench.token_gaps import (
    endpoint_stall_stats,
    engine_stall_stats,
    peak_per_second,
    pooled_itls,
    token_times,
)
from chunkbench.engine.outputs import StepRecord

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """What the harness (engine runs) or the HTTP client (endpoint runs) saw of one request. Times are
    seconds on the run's clock.

    Latencies start at `send_time` when the client recorded one (endpoint runs: the request left the client
    after waiting `client_queue_time` for a --max-concurrency slot, as vLLM measures), else at the arrival.
    `token_times` holds one time per output event: a token on the engine, a streamed chunk (which may carry
    several tokens, or none) over HTTP or in a simulation with a server calibration's output jitter
    (server_calibration.streamed); `num_output_tokens` is the token count when it differs (the server's
    usage.completion_tokens)."""

    prompt_len: int
    output_len: int
    arrival_time: float
    token_times: list[float]
    first_scheduled_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    send_time: float | None = None  # endpoint runs: when the request was sent
    num_output_tokens: int | None = None  # None: one token per entry of token_times
    num_paused_decodes: int = 0  # engine runs: steps that left this request out while it was decoding
    paused_gaps: tuple[int, ...] = ()  # engine runs: indices i whose gap token_times[i-1] -> [i] had a pause
    output_token_source: str | None = None  # endpoint runs: "usage" (the server's count) or "chunks"
    end_time: float | None = None  # endpoint runs: when the request ended (last byte, failure or timeout)
    response_id: str | None = None  # endpoint runs: the server's id for it
    dispatch_time: float | None = None  # endpoint runs: when the client's loop started it (due time + send lag)
    probe: bool = False  # a --probe-request-rate probe: summarized apart (probe_figures)
    server_queue_time: float | None = None  # endpoint runs: the server's own queue time, when it sent it (s)
    server_ttft: float | None = None  # endpoint runs: the server's own TTFT, from scheduling, when sent (s)

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.token_times) > 0

    @property
    def latency_origin(self) -> float:
        return self.arrival_time if self.send_time is None else self.send_time

    @property
    def client_queue_time(self) -> float | None:
        """The wait for a --max-concurrency slot: vLLM's, from the dispatch (its request_arrival_time)."""
        if self.send_time is None:
            return None
        return self.send_time - (self.arrival_time if self.dispatch_time is None else self.dispatch_time)

    @property
    def send_lag(self) -> float | None:
        """How late the client's loop dispatched the request against its due time."""
        return None if self.dispatch_time is None else self.dispatch_time - self.arrival_time

    @property
    def output_tokens(self) -> int:
        return len(self.token_times) if self.num_output_tokens is None else self.num_output_tokens

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.latency_origin

    @property
    def e2el(self) -> float:
        return self.token_times[-1] - self.latency_origin

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        return (self.e2el - self.ttft) / (n - 1) if n > 1 else None

    @property
    def itls(self) -> list[float]:
        return list(np.diff(self.token_times))


STEP_DTYPE = np.dtype([(name, "f8" if kind is float else "i8") for name, kind in get_type_hints(StepRecord).items()])


def step_table(steps: list[StepRecord]) -> np.ndarray:
    """The steps as one structured array: a float64 or int64 column per StepRecord field."""
    return np.fromiter(steps, dtype=STEP_DTYPE, count=len(steps))


def pct_key(p: float) -> str:
    return f"p{int(p) if float(p).is_integer() else p}"


def _stats(prefix: str, values_s: list[float], percentiles=PERCENTILES) -> dict[str, float]:
    ms = np.asarray(values_s, dtype=float) * 1000.0
    if ms.size == 0:
        ms = np.zeros(1)
    out = {
        f"mean_{prefix}_ms": float(ms.mean()),
        f"median_{prefix}_ms": float(np.median(ms)),
        f"std_{prefix}_ms": float(ms.std()),
    }
    if percentiles:  # one call: one partition of the array for all of them (each value as if asked alone)
        out.update(
            {f"{pct_key(p)}_{prefix}_ms": float(v) for p, v in zip(percentiles, np.percentile(ms, list(percentiles)))}
        )
    return out


def is_good(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """DistServe goodput: a request counts only when it meets every SLO given."""
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return all(values[name] * 1000.0 <= limit for name, limit in slos_ms.items())


@gc_paused  # it builds a few lists per request of a trace
def summarize(
    records: list[RequestRecord],
    steps: list[StepRecord],
    duration_s: float,
    goodput_ms: dict[str, float] | None = None,
    num_kv_blocks: int | None = None,
    stall_threshold_s: float | None = None,
    extra_percentiles=(),
    *,
    endpoint: bool | None = None,
    slow_step_threshold_s: float | None = None,
) -> dict:
    """The summary dict: vLLM's keys plus goodput, SLA attainment, stalls, delays, preemptions, KV peak.

    `endpoint` (default: any record has a send time) selects the client-side keys (client queue time, token
    source, ITL-based stalls with `stall_threshold_s`) over the engine's (paused decodes, slow steps).
    A zero duration (nothing completed on the engine) gives zero throughputs, not a division by 1e-9."""
    goodput_ms = goodput_ms or {}
    endpoint = any(r.send_time is not None for r in records) if endpoint is None else endpoint
    pcts = sorted(set(PERCENTILES) | set(extra_percentiles))
    done = [r for r in records if r.ok]
    table = step_table(steps)
    good = [r for r in done if is_good(r, goodput_ms)]
    times = token_times(done)
    summary = _throughputs(records, done, len(good), duration_s, times)
    summary |= _latency_stats(done, times, pcts, endpoint)
    summary |= _sla_attainment(done, len(good), goodput_ms)
    if endpoint:
        summary |= _client_stats(records, done, pcts)
        summary |= endpoint_stall_stats(done, stall_threshold_s)
    else:
        summary |= engine_stall_stats(done, table, slow_step_threshold_s)
    summary |= _step_and_cache_stats(done, steps, table, num_kv_blocks, endpoint, summary["total_input_tokens"])
    return summary


def _throughputs(
    records: list[RequestRecord], done: list[RequestRecord], num_good: int, duration_s: float, times: np.ndarray
) -> dict:
    """The summary's first keys: counts, duration, token totals, throughputs (zero over a zero duration) and
    vLLM's per-second peaks."""

    def per_s(amount: float) -> float:
        return amount / duration_s if duration_s > 0 else 0.0

    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    peak_tokens, peak_requests = peak_per_second(done, times)
    return {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration": max(duration_s, 0.0),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(len(done)),
        "request_goodput": per_s(num_good),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }


def _latency_stats(done: list[RequestRecord], times: np.ndarray, pcts: list, endpoint: bool) -> dict:
    """TTFT, TPOT, ITL, E2EL and scheduling-delay statistics of the completed requests."""
    stats = _stats("ttft", [r.ttft for r in done], pcts)
    stats |= _stats("tpot", [r.tpot for r in done if r.tpot is not None], pcts)
    # The same gaps as r.itls, pooled as arrays: a list of millions of numpy scalars took seconds.
    stats |= _stats("itl", pooled_itls(done, times) if done else [], pcts)
    stats |= _stats("e2el", [r.e2el for r in done], pcts)
    if endpoint:  # the client cannot see the scheduler: TTFT bounds the delay from above (a documented proxy)
        stats |= _stats("scheduling_delay", [r.ttft for r in done], pcts)
        stats["scheduling_delay_source"] = "ttft-proxy"
    else:
        stats |= _stats(
            "scheduling_delay",
            [r.first_scheduled_time - r.arrival_time for r in done if r.first_scheduled_time is not None],
            pcts,
        )
    return stats


def _sla_attainment(done: list[RequestRecord], num_good: int, goodput_ms: dict[str, float]) -> dict:
    """The share of completed requests within every SLA of `goodput_ms`, then within each one (%)."""
    attainment = {"sla_attainment_pct": 100.0 * num_good / len(done) if done else 0.0}
    for name in goodput_ms:
        met = sum(is_good(r, {name: goodput_ms[name]}) for r in done)
        attainment[f"sla_attainment_{name}_pct"] = 100.0 * met / len(done) if done else 0.0
    return attainment


def _client_stats(records: list[RequestRecord], done: list[RequestRecord], pcts: list) -> dict:
    """What only the HTTP client sees: its queue time, how late requests were sent, the token count's source."""
    stats = _stats("client_queue_time", [r.client_queue_time for r in done if r.send_time is not None], pcts)
    lags = [r.send_lag for r in records if r.send_lag is not None]  # every request was sent, failed ones too
    if lags:
        stats |= _stats("send_lag", lags, pcts) | {"max_send_lag_ms": 1000.0 * max(lags)}
    sources = {r.output_token_source for r in done}
    if sources:
        stats["output_token_source"] = sources.pop() if len(sources) == 1 else "mixed"
    return stats


def _step_and_cache_stats(
    done: list[RequestRecord], steps: list[StepRecord], table, num_kv_blocks: int | None, endpoint: bool, total_in: int
) -> dict:
    """The summary's last keys: preemptions, KV and prefix-cache use (of `total_in` prompt tokens), and the
    step count and times (what a --step-time-target is held to)."""
    out: dict = {"num_preemptions": int(table["num_preempted"].sum())}
    peak = int(table["kv_blocks_used"].max()) if steps else 0
    out["peak_kv_blocks"] = peak
    if num_kv_blocks:
        out["peak_kv_usage_pct"] = 100.0 * peak / num_kv_blocks
    cached = sum(r.num_cached_tokens for r in done)
    out["cached_prompt_tokens"] = cached
    out["computed_prompt_tokens"] = total_in - cached
    out["prefix_cache_hit_rate_pct"] = 100.0 * cached / total_in if total_in else 0.0
    out["prefix_cache_request_hit_rate_pct"] = (
        100.0 * sum(r.num_cached_tokens > 0 for r in done) / len(done) if done else 0.0
    )
    out["num_steps"] = len(steps)
    if not endpoint:  # a server's activations are its own business
        out["peak_activation_bytes"] = int(table["peak_activation_bytes"].max()) if steps else 0
    if steps:  # what a --step-time-target is held to
        step_ms = table["seconds"] * 1000.0
        out |= {
            "median_step_ms": float(np.median(step_ms)),
            "p99_step_ms": float(np.percentile(step_ms, 99)),
            "max_step_ms": float(step_ms.max()),
        }
    return out


def probe_figures(probes: list[tuple[float, str | None]], percentiles=()) -> dict:
    """vllm bench serve's probe keys: completed and failed counts, and the completed ones' median, p99 and max
    E2EL (ms; absent when none completed, as there); `percentiles`: more, as probe_p90_e2el_ms."""
    done = [e2el for e2el, error in probes if error is None]
    figures = {"probe_completed": len(done), "probe_failed": len(probes) - len(done)}
    if done:
        figures |= {"probe_median_e2el_ms": float(np.median(done)) * 1000, "probe_max_e2el_ms": max(done) * 1000}
        figures |= {
            f"probe_{pct_key(p)}_e2el_ms": float(np.percentile(done, p)) * 1000 for p in sorted({99.0, *percentiles})
        }
    return figures
