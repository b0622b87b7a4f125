"""Token-gap statistics of a run: stalls (engine steps that paused a decode, or ITL gaps over HTTP far above
the run's median), every token's time, the pooled inter-token latencies and the busiest second."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only
    from chunkbench.bench.metrics import RequestRecord

SLOW_STEP_FACTOR = 5.0  # a slow step: longer than 5x the run's median decode-only step
ENDPOINT_STALL_FACTOR = 5.0  # over HTTP, a stall: an ITL gap longer than 5x the run's median ITL


def engine_stall_stats(
    done: list[RequestRecord], steps: np.ndarray, slow_step_threshold_s: float | None = None
) -> dict[str, float]:
    """Generation stalls as the scheduler decided them: a paused decode is a running request in decode that a
    step left out; a stall is a token gap of a completed request during which it was paused at least once.
    Slow steps (a long step delays every request in it, paused or not) are counted on their own.
    `steps`: step_table()."""
    stalled = [r.token_times[i] - r.token_times[i - 1] for r in done for i in r.paused_gaps if i < len(r.token_times)]
    out = {
        "num_paused_decodes": int(steps["num_paused_decodes"].sum()),
        "num_stalls": len(stalled),
        "longest_stall_ms": max(stalled, default=0.0) * 1000.0,
    }
    if slow_step_threshold_s is None:
        decode_only = steps["seconds"][(steps["prefill_tokens"] == 0) & (steps["decode_tokens"] > 0)]
        slow_step_threshold_s = SLOW_STEP_FACTOR * float(np.median(decode_only)) if decode_only.size else None
    out["num_slow_steps"] = int((steps["seconds"] > slow_step_threshold_s).sum()) if slow_step_threshold_s else 0
    if slow_step_threshold_s:  # no decode-only step: no threshold, and no key rather than Infinity
        out["slow_step_threshold_ms"] = slow_step_threshold_s * 1000.0
    return out


def endpoint_stall_stats(done: list[RequestRecord], threshold_s: float | None = None) -> dict[str, float]:
    """Over HTTP there are no steps to read: a stall is an ITL gap above 5x the run's median ITL (pooled over
    completed requests), a gap far beyond the server's typical decode step."""
    gaps = [g for r in done for g in r.itls]
    if threshold_s is None and gaps:
        threshold_s = ENDPOINT_STALL_FACTOR * float(np.median(gaps))
    stalls = [g for g in gaps if threshold_s is not None and g > threshold_s]
    out = {"num_stalls": len(stalls), "longest_stall_ms": max(stalls, default=0.0) * 1000.0}
    if threshold_s is not None:
        out["stall_threshold_ms"] = threshold_s * 1000.0
    return out


def token_times(done: list[RequestRecord]) -> np.ndarray:
    """Every token time of the requests, one array, in request order."""
    return np.fromiter(itertools.chain.from_iterable(r.token_times for r in done), dtype=float)


def pooled_itls(done: list[RequestRecord], times: np.ndarray) -> np.ndarray:
    """Every request's gaps between its token times (r.itls), pooled in request order: one np.diff over all
    the times, the differences across two requests' boundary dropped (19,000 small np.diff calls took longer)."""
    lengths = [len(r.token_times) for r in done]
    if not all(lengths):  # a record without tokens would shift every boundary after it
        raise ValueError("pooled_itls: every record needs token times (completed requests only)")
    gaps = np.diff(times)
    ends = np.cumsum(lengths)[:-1] - 1  # each boundary's index in `gaps`
    return np.delete(gaps, ends)


def peak_per_second(done: list[RequestRecord], times: np.ndarray | None = None) -> tuple[int, int]:
    """vLLM's peaks over fixed 1 s buckets counted from the earliest latency origin (send or arrival) of the
    completed requests: the most output events (tokens; chunks over HTTP) in a bucket, and the most requests
    active in a bucket (from the bucket of its origin to that of its last token). `times`: token_times(done)."""
    if not done:
        return 0, 0
    origin = min(r.latency_origin for r in done)
    times = token_times(done) if times is None else times
    buckets = np.floor(np.maximum(times - origin, 0.0))
    if buckets.size and buckets.max() < 4 * buckets.size:  # a dense count, as long as the run is not much sparser
        per_bucket = np.bincount(buckets.astype(np.int64))
    else:  # only the occupied buckets: a dense array over every second asked for 24.8 TiB at --rate 1e-12
        _, per_bucket = np.unique(buckets, return_counts=True)
    first = np.floor([r.latency_origin - origin for r in done])
    after_last = np.floor([r.token_times[-1] - origin for r in done]) + 1
    # A request is active from its first bucket to its last: +1 where it starts, -1 after it ends, ends first
    # where they meet; the most active is the highest running sum.
    where = np.concatenate([first, after_last])
    change = np.concatenate([np.ones(len(done)), -np.ones(len(done))])
    order = np.lexsort((change, where))
    return int(per_bucket.max()), int(np.cumsum(change[order]).max())
