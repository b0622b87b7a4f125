"""Capacity at an SLA (Sarathi-Serve's definition): the highest arrival rate whose run meets every SLA with a
median scheduling delay within a bound. One search, shared by `tune --objective capacity` (a trial's score)
and `compare` (each policy's capacity and its latency-load curve, from the same probes).

The workload's arrivals are compressed or stretched to each probed rate. The bracket is found on the grid
base * 2**k (base: the workload's own rate), from k = 0 or from the grid point nearest a hint (another
configuration's capacity): feasibility falls as the rate grows, so both find the same bracket, the second in
fewer probes. Then `bisections` geometric halvings; resolution 2**(1 / 2**bisections) - 1 (5: about 2.2%).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from chunkbench.bench.slo import SLO, violations
from chunkbench.bench.workload import WorkloadRequest, add_probes

BRACKET = 7  # the bracket's rates are base * 2**k for k in [-BRACKET, BRACKET]
BISECTIONS = 5


@dataclass
class Probe:
    rate: float  # requests/s offered
    summary: dict | None  # None: stopped early, an SLA certainly missed, or above the ceiling
    feasible: bool
    above_ceiling: bool = False  # not run: above the saturation throughput


@dataclass
class Capacity:
    capacity: float  # req/s; 0 when no probed rate met the SLAs
    best: dict | None  # the summary at the capacity; when none met them, the lowest rate's (its miss)
    probes: list[Probe] = field(default_factory=list)


def resolution_pct(bisections: int = BISECTIONS) -> float:
    return 100 * (2 ** (1 / 2**bisections) - 1)


def base_rate(workload: list[WorkloadRequest]) -> float:
    """The load's rate (req/s): its requests over its last arrival, --probe-request-rate's probes left out."""
    load = [w for w in workload if not w.probe]
    return len(load) / max(load[-1].arrival_time, 1e-9)


def at_rate(workload: list[WorkloadRequest], rate: float) -> list[WorkloadRequest]:
    """The workload with its load's arrivals scaled to `rate` requests/s; its probes, if any, stay at their own
    rate over the new span."""
    scale = base_rate(workload) / rate
    scaled = [replace(w, arrival_time=w.arrival_time * scale) for w in workload if not w.probe]
    probes = [w.arrival_time for w in workload if w.probe]
    return add_probes(scaled, 1.0 / (probes[1] - probes[0])) if len(probes) > 1 else scaled


def meets(summary: dict | None, slos: list[SLO], max_sched_delay_ms: float) -> bool:
    return (
        summary is not None
        and max(violations(summary, slos), default=0) <= 0
        and summary["median_scheduling_delay_ms"] <= max_sched_delay_ms
    )


def search_capacity(
    run: Callable[[list[WorkloadRequest], bool], dict | None],
    workload: list[WorkloadRequest],
    slos: list[SLO],
    max_sched_delay_ms: float,
    hint: float | None = None,
    bisections: int = BISECTIONS,
    ceiling: float | None = None,
) -> Capacity:
    """`run(requests, may_stop)` serves the requests and returns their summary, or None for a run it stopped
    early because an SLA was certainly missed (infeasible, as the whole run would be). `ceiling`: rates above
    it are infeasible without a run (compare: the policy's saturation throughput; a finite run offered more
    than that can keep its median delay under the bound while its queue grows without end)."""
    base = base_rate(workload)
    probes: list[Probe] = []

    def feasible(rate: float, may_stop: bool = True) -> tuple[bool, dict | None]:
        if ceiling is not None and rate > ceiling:
            probes.append(Probe(rate, None, False, above_ceiling=True))
            return False, None
        summary = run(at_rate(workload, rate), may_stop)
        ok = meets(summary, slos, max_sched_delay_ms)
        probes.append(Probe(rate, summary, ok))
        return ok, summary

    k = 0 if not hint or hint <= 0 else max(-BRACKET, min(BRACKET, round(math.log2(hint / base))))
    lo, hi, best = None, None, None
    ok, summary = feasible(base * 2.0**k)
    step = 1 if ok else -1  # feasible: climb until a rate fails; infeasible: descend until one passes
    while True:
        if ok:
            lo, best = base * 2.0**k, summary
        else:
            hi = base * 2.0**k
        if (lo is not None and hi is not None) or not -BRACKET <= k + step <= BRACKET:
            break
        k += step
        ok, summary = feasible(base * 2.0**k)
    if lo is not None and hi is not None:
        for _ in range(bisections):
            mid = (lo * hi) ** 0.5
            ok, summary = feasible(mid)
            lo, best = (mid, summary) if ok else (lo, best)
            hi = hi if ok else mid
    if best is None:  # no rate met the SLAs: show by how much the lowest one missed (its full run)
        best = summary if summary is not None else feasible(base * 2.0**k, may_stop=False)[1]
    return Capacity(lo or 0.0, best, probes)
