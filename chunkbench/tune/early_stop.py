"""Early stop of a capacity probe: end a run as soon as it has certainly missed an SLA, so an overloaded
probe costs seconds of simulation, not the whole backlog. The probe's verdict (infeasible) is the one the full
run would give, so the capacity found is the same.

"Certainly" is a counting argument. A request's TTFT (scheduling delay, E2EL) is at least the time it has
waited so far, and that only grows: once `now - arrival` exceeds the limit and it has no first token (was
not scheduled, has not finished), its final value exceeds the limit too; a request that already has the
value is counted by it. The summary's percentile p of N values (numpy's linear interpolation) exceeds the
limit when the values at both neighbouring ranks of p/100 * (N - 1) do, i.e. when at least
N - floor(p/100 * (N - 1)) values do (one more here, against rounding). N, the completed requests, is at
most the workload's size, and that threshold grows with N, so counting against the workload's size is safe.
Rules exist for TTFT, E2EL and the median scheduling delay bound; TBT and TPOT have none (a run is never
stopped by them, only by the others).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from chunkbench.bench.slo import SLO
from chunkbench.engine.request import Request


def _ttft(r: Request, start: float, now: float) -> float:
    end = r.token_times[0] if r.token_times else now
    return (end - start) - (r.arrival_time - start)  # as the record computes it: times relative to start


def _e2el(r: Request, start: float, now: float) -> float:
    end = r.token_times[-1] if r.is_finished else now
    return (end - start) - (r.arrival_time - start)


def _scheduling_delay(r: Request, start: float, now: float) -> float:
    end = now if r.first_scheduled_time is None else r.first_scheduled_time
    return (end - start) - (r.arrival_time - start)


LOWER_BOUNDS = {"ttft": _ttft, "e2el": _e2el}


def needed_misses(percentile: float, total: int) -> int:
    """Values above a limit that put the `percentile` of `total` values above it, whatever the others."""
    return total - math.floor(percentile / 100 * (total - 1)) + 1


def certain_miss(slos: list[SLO], max_sched_delay_ms: float | None, total: int) -> Callable:
    """A `stop(requests, start, now)` for harness.run_workload: True once an SLA (or the median scheduling
    delay bound) is certainly missed by a run of `total` requests."""
    rules = [(s.percentile, s.limit_ms, LOWER_BOUNDS[s.name]) for s in slos if s.name in LOWER_BOUNDS]
    if max_sched_delay_ms is not None:
        rules.append((50.0, max_sched_delay_ms, _scheduling_delay))
    rules = [(needed_misses(p, total), limit, bound) for p, limit, bound in rules]

    def stop(requests: list[Request], start: float, now: float) -> bool:
        for needed, limit, bound in rules:
            late = sum(1 for r in requests if r.error is None and bound(r, start, now) * 1000.0 > limit)
            if late >= needed:
                return True
        return False

    return stop
