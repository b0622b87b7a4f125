"""Early stop of a capacity probe: end a run as soon as its steady-state verdict (chunkbench/bench/steady.py) is
certainly "not sustained", so an overloaded probe costs seconds of simulation, not the whole backlog. The
verdict is the one the full run would give, so the capacity found is the same.

"Certainly" is a counting argument over the window's requests (the ones the verdict is made on). A request's
TTFT (scheduling delay, E2EL) is at least the time it has waited so far, and that only grows: once
`now - arrival` exceeds the limit and it has no first token (was not scheduled, has not finished), its final
value exceeds the limit too. The percentile p of N values (numpy's linear interpolation) exceeds the limit when
at least N - floor(p/100 * (N - 1)) values do (one more here, against rounding). TBT and TPOT have no such
rule. A growing queue is certain once the whole window has arrived, its first third has been scheduled, and
the last third's delays, as far as they have come, already grew faster than steady.MAX_GROWTH.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from chunkbench.bench.slo import SLO
from chunkbench.bench.steady import MAX_GROWTH, MIN_THIRD, window_bounds
from chunkbench.engine.request import Request
from chunkbench.workloads.spec import WorkloadRequest


def _ttft(r: Request, now: float) -> float:
    return (r.token_times[0] if r.token_times else now) - r.arrival_time


def _e2el(r: Request, now: float) -> float:
    return (r.token_times[-1] if r.is_finished else now) - r.arrival_time


def _scheduling_delay(r: Request, now: float) -> float:
    return (now if r.first_scheduled_time is None else r.first_scheduled_time) - r.arrival_time


LOWER_BOUNDS = {"ttft": _ttft, "e2el": _e2el}


def needed_misses(percentile: float, total: int) -> int:
    """Values above a limit that put the `percentile` of `total` values above it, whatever the others."""
    return total - math.floor(percentile / 100 * (total - 1)) + 1


class CertainMiss:
    """A `stop(requests, start, now)` for harness.run_workload over `workload`: True once its steady verdict
    is certainly a miss; `why` then says which."""

    def __init__(self, workload: list[WorkloadRequest], slos: list[SLO], max_sched_delay_ms: float | None):
        load = sorted((i for i, w in enumerate(workload) if not w.probe), key=lambda i: workload[i].arrival_time)
        first, last = window_bounds(len(load))
        self.window = {str(i) for i in load[first:last]}
        self.thirds = len(load[first:last]) // 3
        self.first_third = {str(i) for i in load[first : first + self.thirds]}
        self.last_third = {str(i) for i in load[last - self.thirds : last]}
        self.last_arrival = workload[load[last - 1]].arrival_time if load else 0.0
        rules = [(s.percentile, s.limit_ms, LOWER_BOUNDS[s.name], str(s)) for s in slos if s.name in LOWER_BOUNDS]
        if max_sched_delay_ms is not None:
            rules.append(
                (50.0, max_sched_delay_ms, _scheduling_delay, f"median scheduling delay <= {max_sched_delay_ms:g} ms")
            )
        total = len(self.window)
        self.rules = [(needed_misses(p, total), limit, bound, name) for p, limit, bound, name in rules]
        self.why = ""

    def __call__(self, requests: list[Request], start: float, now: float) -> bool:
        window = [r for r in requests if r.request_id in self.window and r.error is None]
        for needed, limit, bound, name in self.rules:
            if sum(1 for r in window if bound(r, now) * 1000.0 > limit) >= needed:
                self.why = f"stopped early: {name} certainly missed"
                return True
        if now - start >= self.last_arrival and self._growing(window, now):
            self.why = "stopped early: over-saturated (its queue certainly grows)"
            return True
        return False

    def _growing(self, window: list[Request], now: float) -> bool:
        if self.thirds < MIN_THIRD:
            return False
        early = [r for r in window if r.request_id in self.first_third]
        late = [r for r in window if r.request_id in self.last_third]
        if any(r.first_scheduled_time is None for r in early):
            return False  # the first third's delays are not final yet
        gap = np.median([r.arrival_time for r in late]) - np.median([r.arrival_time for r in early])
        rise = np.median([_scheduling_delay(r, now) for r in late]) - np.median(
            [_scheduling_delay(r, now) for r in early]
        )
        return bool(rise > MAX_GROWTH * max(float(gap), 1e-9))


def certain_miss(
    workload: list[WorkloadRequest], slos: list[SLO], max_sched_delay_ms: float | None
) -> Callable[[list[Request], float, float], bool]:
    return CertainMiss(workload, slos, max_sched_delay_ms)
