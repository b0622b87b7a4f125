"""A run's steady state: the figures that decide whether a server sustains an arrival rate, with the start-up
transient and the drain left out (docs/concepts/capacity.md says why each rule is there).

The load's requests, in arrival order, are split into a warm-up (the first WARMUP of them), the *window* and a
cool-down (the last COOLDOWN): only the window's are measured, the others keep the server loaded. Over the window
the server keeps pace (its queue does not grow: _growth) and the SLAs and the median scheduling delay bound hold.
What it served against what arrived is said beside it but decides nothing: a server still filling at the window's
start completes fewer than arrive without falling behind (docs/measurements/capacity.md). A verdict is *clear*
when the run is long enough to trust it (judge); one that is not is run again longer (capacity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chunkbench.bench.harness import RunResult
from chunkbench.bench.metrics import RequestRecord, summarize
from chunkbench.bench.slo import SLO, violations

WARMUP, COOLDOWN = 0.2, 0.1  # shares of the load's requests, by arrival, left out of the window
MAX_GROWTH = 0.05  # seconds of scheduling delay gained per second of arrivals
MIN_TAIL = 5  # requests beyond each SLA's percentile that a clear verdict needs
MIN_THIRD = 30  # requests in each third of the window for a trend to count (fewer: a burst reads as growth)
MIN_LOAD = 3  # load requests a run needs for a window at all


def window_bounds(n: int) -> tuple[int, int]:
    """The window's [first, last) indices among n load requests in arrival order."""
    first = math.ceil(WARMUP * n)
    return first, max(first + 1, n - math.floor(COOLDOWN * n))


def tail_requests(slos: list[SLO]) -> int:
    """Window requests a clear verdict needs: MIN_TAIL beyond the strictest percentile (p99: 500)."""
    top = max((s.percentile for s in slos), default=50.0)
    return math.ceil(MIN_TAIL * 100 / max(100 - top, 0.1))


def window_requests(slos: list[SLO]) -> int:
    """Window requests a clear verdict needs: tail_requests, and thirds of MIN_THIRD: fewer cannot tell a server
    that falls behind (_growth), and a median's few dozen requests sent at once would hold at any rate."""
    return max(tail_requests(slos), 3 * MIN_THIRD)


def min_requests(slos: list[SLO]) -> int:
    """A run's requests whose window holds window_requests."""
    return math.ceil(window_requests(slos) / (1 - WARMUP - COOLDOWN)) + 1


@dataclass
class Steady:
    summary: dict  # the window's figures (summarize's keys), throughputs over [t0, t1]
    offered: float  # req/s arriving in the window
    served: float  # req/s completed in the window
    growth: float  # scheduling delay gained per second of arrivals, last third against first
    filled: bool  # the warm-up outlasted the window's median E2EL
    halves: list[dict]  # each half of the window's figures
    requests: int  # the run's load requests

    @property
    def over_saturated(self) -> bool:
        return self.growth > MAX_GROWTH

    def why_over(self) -> str:
        return (
            f"over-saturated: scheduling delay grew {self.growth * 1000:.0f} ms per s of arrivals (served "
            f"{self.served:.3g} of {self.offered:.3g} req/s arriving)"
        )


def steady_state(
    result: RunResult, goodput_ms: dict | None = None, percentiles=(), num_kv_blocks: int | None = None
) -> Steady | None:
    """The run's steady figures (None: fewer than MIN_LOAD load requests, no window to speak of)."""
    load = sorted((r for r in result.requests if not r.probe), key=lambda r: r.arrival_time)
    if len(load) < MIN_LOAD:
        return None
    first, last = window_bounds(len(load))
    window = load[first:last]
    t0, t1 = window[0].arrival_time, window[-1].arrival_time
    span = max(t1 - t0, 1e-9)
    done = [r for r in window if r.ok]
    e2el = np.array([r.token_times[-1] - r.arrival_time for r in done]) if done else np.zeros(1)
    steps = [s for s in result.steps if t0 <= s.start <= t1]
    summary = summarize(window, steps, span, goodput_ms, num_kv_blocks, extra_percentiles=percentiles)
    summary |= _rates(window, load, t0, t1)
    summary |= result.server or {}  # a server's own queue times (its /metrics) cover the whole run
    half = len(window) // 2
    halves = [
        summarize(part, [], span / 2, goodput_ms, None, extra_percentiles=percentiles)
        for part in (window[:half], window[half:])
    ]
    return Steady(
        summary,
        (len(window) - 1) / span,
        summary["request_throughput"],
        _growth(window),
        t0 >= float(np.median(e2el)),
        halves,
        len(load),
    )


def _rates(window: list[RequestRecord], load: list[RequestRecord], t0: float, t1: float) -> dict:
    """Throughputs over [t0, t1]: what the server completed and generated there, whoever's requests."""
    span = max(t1 - t0, 1e-9)
    tokens = sum(sum(1 for t in r.token_times if t0 <= t <= t1) for r in load if r.ok)
    completed = sum(1 for r in load if r.ok and t0 <= r.token_times[-1] <= t1)
    return {
        "request_throughput": completed / span,
        "output_throughput": tokens / span,
        "steady_window_s": t1 - t0,
        "steady_start_s": t0,
        "steady_requests": len(window),
        "run_requests": len(load),
    }


def _growth(window: list[RequestRecord]) -> float:
    """Median scheduling delay of the window's last third minus its first third's, per second between their
    median arrivals (a request never scheduled waits until its end, or counts as the last third's longest).
    A server keeps pace when this is at most MAX_GROWTH: one that falls behind by a share d of what arrives makes
    each request wait d seconds longer per second."""
    third = len(window) // 3
    if third < MIN_THIRD:
        return 0.0
    early, late = window[:third], window[-third:]

    def delays(part: list[RequestRecord]) -> np.ndarray:
        return np.array([_delay(r) for r in part])

    gap = float(np.median([r.arrival_time for r in late]) - np.median([r.arrival_time for r in early]))
    return float(np.median(delays(late)) - np.median(delays(early))) / max(gap, 1e-9)


def _delay(r: RequestRecord) -> float:
    if r.first_scheduled_time is not None:
        return r.first_scheduled_time - r.arrival_time
    return (r.token_times[0] if r.token_times else math.inf) - r.arrival_time


def meets(summary: dict, slos: list[SLO], max_sched_delay_ms: float) -> bool:
    return (
        max(violations(summary, slos), default=0) <= 0 and summary["median_scheduling_delay_ms"] <= max_sched_delay_ms
    )


def missed(summary: dict, slos: list[SLO], max_sched_delay_ms: float) -> list[str]:
    """What the figures missed, each as 'p99 TTFT 412 ms > 300 ms'."""
    out = [
        f"p{s.percentile:g} {s.name.upper()} {summary[s.summary_key]:,.0f} ms > {s.limit_ms:g} ms"
        for s, v in zip(slos, violations(summary, slos))
        if v > 0
    ]
    if summary["median_scheduling_delay_ms"] > max_sched_delay_ms:
        out.append(
            f"median scheduling delay {summary['median_scheduling_delay_ms']:,.0f} ms > {max_sched_delay_ms:g} ms"
        )
    return out


@dataclass
class Verdict:
    feasible: bool
    clear: bool
    reason: str  # what it missed, or '' when it met everything
    long_enough: bool = True  # filled, with enough tail: clear but for the halves' spread


def judge(steady: Steady, slos: list[SLO], max_sched_delay_ms: float) -> Verdict:
    """Sustained: keeps pace, the queue does not grow, the SLAs and the delay bound hold over the window.
    Clear: filled (the warm-up outlasts the median E2EL), enough tail (the window holds MIN_TAIL requests beyond
    each SLA's percentile, and thirds of MIN_THIRD, or growth could not show), and each figure farther from its
    limit than the same figure over the window's two halves differs (two batch means: their gap is about twice
    the figure's standard error)."""
    misses = ([steady.why_over()] if steady.over_saturated else []) + missed(steady.summary, slos, max_sched_delay_ms)
    limits = [(s.summary_key, s.limit_ms) for s in slos] + [("median_scheduling_delay_ms", max_sched_delay_ms)]
    first, second = steady.halves
    settled = steady.over_saturated or all(
        abs(steady.summary[key] - limit) > abs(first[key] - second[key]) for key, limit in limits
    )
    enough = steady.summary["steady_requests"] >= window_requests(slos)
    return Verdict(not misses, steady.filled and settled and enough, "; ".join(misses), steady.filled and enough)
