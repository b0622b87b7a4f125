"""The probes of a capacity search (chunkbench/bench/capacity.py): one probe is the steady verdict at a rate
(Probe), run by a Prober for one configuration in one serving session, built the same way for `tune
--objective capacity` and `compare` (make_prober): on a simulator, short probes of the user's requests and
long ones on larger pools drawn with several seeds; on a real clock, one run each, grown within a time
budget."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from chunkbench.bench.early_stop import certain_miss
from chunkbench.bench.slo import SLO, goodput_slos
from chunkbench.bench.steady import MIN_LOAD, judge, min_requests, steady_state
from chunkbench.errors import UserError
from chunkbench.workloads.spec import WorkloadRequest, WorkloadSpec, add_probes, build_workload


@dataclass
class Probe:
    rate: float  # requests/s offered
    summary: dict | None  # the steady window's figures; None: stopped early, or above the ceiling (not run)
    feasible: bool
    above_ceiling: bool = False  # not run: above the saturation throughput
    requests: int = 0  # load requests of its longest run (on each draw)
    clear: bool = True  # the verdict held on a run long enough to trust (steady.judge)
    reason: str = ""  # what it missed
    full: dict | None = None  # its longest run's figures as `vllm bench serve` reports them, warm-up and drain in
    draws: int = 1  # workloads it ran on (Prober.draws)
    drawn: dict | None = field(default=None, repr=False)  # the last draw's own steady figures


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


def prefix(pool: list[WorkloadRequest], n: int) -> list[WorkloadRequest]:
    """The pool's first n load requests and the probes among them: the same run, made shorter."""
    load = [w for w in pool if not w.probe][:n]
    end = load[-1].arrival_time
    return sorted(load + [w for w in pool if w.probe and w.arrival_time <= end], key=lambda w: w.arrival_time)


def load_size(pool: list[WorkloadRequest]) -> int:
    return sum(not w.probe for w in pool)


RunFn = Callable[[list[WorkloadRequest], Callable | None], object]  # (requests, stop) -> runs.BenchRun


@dataclass
class Prober:
    """Probes of one configuration in one serving session. `run(requests, stop)` serves them and returns a
    runs.BenchRun (an empty summary: `stop` ended it). `first`: a short probe's requests; `longest(rate)`: the
    most a run at that rate may take (the pool, a time budget); `long`: where a long probe starts (the
    simulator's; None: every probe is one run, grown within `longest`); `draws`: more pools like `pool` drawn
    with other seeds, on which a long probe must hold too; `stoppable`: `stop` is honoured."""

    run: RunFn
    pool: list[WorkloadRequest]
    slos: list[SLO]
    max_sched_delay_ms: float
    first: int
    longest: Callable[[float], int]
    long: int | None = None
    stoppable: bool = False
    goodput_ms: dict | None = None
    draws: list[list[WorkloadRequest]] = field(default_factory=list)
    on_probe: Callable[[Probe], None] | None = None

    def probe(
        self, rate: float, may_stop: bool = True, start: int | None = None, grow: bool = True, draws: int = 0
    ) -> Probe:
        """The steady verdict at `rate`. A long probe (`start` given) holds only where it holds on the pool and
        on every other draw: a rate at the knee of a tail latency holds on one sample of bursts and not on
        the next, and a user's run is one more sample. Over several draws it must also hold with their noise:
        each figure's mean over the draws plus twice their standard deviation within its limit."""
        pools = [self.pool, *self.draws[: (draws or DRAWS) - 1]] if start else [self.pool]
        found, figures = None, []
        for pool in pools:
            found = self._one(pool, rate, may_stop, start, grow, found)
            if not found.feasible:
                break
            figures.append(found.drawn)
        if found.feasible and len(figures) > 1 and (miss := noise_miss(figures, self.slos, self.max_sched_delay_ms)):
            found = replace(found, feasible=False, reason=miss)
        if self.on_probe:
            self.on_probe(found)
        return found

    def _one(self, pool, rate: float, may_stop: bool, start: int | None, grow: bool, before: Probe | None) -> Probe:
        """The verdict on one pool, each run twice as long as the last until it is clear (`grow`)."""
        limit = max(1, min(self.longest(rate), load_size(pool)))
        n = min(start or self.first, limit)
        percentiles = [s.percentile for s in self.slos]
        draws = before.draws + 1 if before else 1
        while True:
            requests = at_rate(prefix(pool, n), rate)
            stop = certain_miss(requests, self.slos, self.max_sched_delay_ms) if self.stoppable and may_stop else None
            done = self.run(requests, stop)
            if not done.summary:
                why = getattr(stop, "why", "") or "stopped early"
                return Probe(rate, None, False, requests=n, reason=why, draws=draws)
            steady = steady_state(done.result, self.goodput_ms, percentiles, done.result.num_kv_blocks or None)
            if steady is None:
                return Probe(rate, done.summary, False, requests=n, clear=False, reason="too few requests")
            verdict = judge(steady, self.slos, self.max_sched_delay_ms)
            if verdict.clear or (self.draws and start and verdict.long_enough) or n >= limit or not grow:
                break
            n = min(limit, 2 * n)
        # Over several draws the draws are the noise measure (in place of the halves' spread), once each run is
        # long enough to have filled the server.
        clear = verdict.clear or bool(self.draws and start and verdict.long_enough)
        if start and self.long and verdict.feasible and not steady.filled:  # a pool of ours: it could be longer
            verdict = replace(verdict, feasible=False, reason=unfilled(steady.summary))
        summary = steady.summary
        if verdict.feasible and before is not None and before.summary and _worse(before.summary, summary, self.slos):
            summary = before.summary  # the worst draw's figures
        probe = Probe(rate, summary, verdict.feasible, False, n, clear, verdict.reason, done.summary, draws)
        probe.drawn = steady.summary
        return probe


def unfilled(summary: dict) -> str:
    """Why a long run that met the SLAs shows nothing: it ended inside the server's start-up, where a server
    still filling with requests serves faster than it will."""
    return (
        "not shown to hold: the run ended while the server still filled (its warm-up "
        f"{1000 * summary['steady_start_s']:,.0f} ms < the median E2EL {summary['median_e2el_ms']:,.0f} ms)"
    )


def noise_miss(figures: list[dict], slos: list[SLO], max_sched_delay_ms: float) -> str:
    """What does not hold with the draws' noise (mean + 2 standard deviations over the limit), or ''."""
    limits = [(s.summary_key, s.limit_ms, str(s)) for s in slos]
    limits.append(
        ("median_scheduling_delay_ms", max_sched_delay_ms, f"median scheduling delay <= {max_sched_delay_ms:g} ms")
    )
    misses = []
    for key, limit, name in limits:
        values = np.array([f[key] for f in figures])
        mean, std = float(values.mean()), float(values.std(ddof=1))
        if mean + 2 * std > limit:
            misses.append(f"{name}: {mean:,.1f} +- {std:,.1f} ms over {len(values)} draws, within 2 sd of the limit")
    return "; ".join(misses)


def _worse(a: dict, b: dict, slos: list[SLO]) -> bool:
    """Whether figures a are closer to (or further past) the SLAs than b."""
    keys = [(s.summary_key, s.limit_ms) for s in slos] or [("median_scheduling_delay_ms", 1.0)]
    return max(a[k] / limit for k, limit in keys) > max(b[k] / limit for k, limit in keys)


LONG_FACTOR = 1  # a simulated long probe starts at this many times the requests a clear verdict needs
POOL_FACTOR = 4  # and may grow to this many (the confirmation runs four times the longest, within the pool)
MIN_POOL = 2_000  # and to this many at the least: a run must outlast the start-up of a server whose requests take
# seconds, whatever the percentile (a median's pools of 520 ended inside it: docs/measurements/capacity.md)
DRAWS = 3  # and holds only where it holds on this many workloads drawn with consecutive seeds
CONFIRM_DRAWS = 6  # as many for the confirmation: a tail's rare bursts show in more samples
MIN_SHORT = 50  # a simulated short probe's requests at the least: fewer leave a window of nothing to judge


@functools.lru_cache(maxsize=8)
def pool(workload: WorkloadSpec, size: int, max_model_len: int) -> tuple[WorkloadRequest, ...]:
    """`size` requests of the workload (its own count and clipping warnings were said already)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(build_workload(dataclasses.replace(workload, num_requests=size), max_model_len))


def make_prober(
    run: Callable,
    workload: list[WorkloadRequest],
    spec: WorkloadSpec,
    slos: list[SLO],
    max_sched_delay_ms: float,
    max_model_len: int,
    *,
    simulated: bool,
    stoppable: bool,
    probe_seconds: float | None = None,
) -> Prober:
    """`run(requests, stop)` -> runs.BenchRun. `workload`: the user's requests (a short probe's; on a
    simulator at least MIN_SHORT)."""
    base, draws, long = probe_pools(workload, spec, slos, max_model_len, simulated)
    first = max(load_size(workload), MIN_SHORT) if long else load_size(workload)

    def longest(rate: float) -> int:
        if simulated:
            return load_size(base)
        return max(first, int(rate * probe_seconds)) if probe_seconds else first

    return Prober(run, base, slos, max_sched_delay_ms, first, longest, long, stoppable, goodput_slos(slos), draws)


def probe_pools(
    workload: list[WorkloadRequest], spec: WorkloadSpec, slos: list[SLO], max_model_len: int, simulated: bool
) -> tuple[list[WorkloadRequest], list[list[WorkloadRequest]], int | None]:
    """The requests a capacity search probes, the other draws a long probe must hold on, and where a long probe
    starts (None: none). On a simulator, pools of the workload drawn with consecutive seeds, long enough for a
    clear verdict at the SLAs' percentiles and at least MIN_POOL; else, or where the pools cannot hold a long
    probe (a short trace), the user's requests alone."""
    if simulated and spec.num_requests:
        need = min_requests(slos)
        pools = [
            list(pool(dataclasses.replace(spec, seed=spec.seed + k), max(POOL_FACTOR * need, MIN_POOL), max_model_len))
            for k in range(CONFIRM_DRAWS)
        ]
        if load_size(pools[0]) >= LONG_FACTOR * need:
            return pools[0], pools[1:], LONG_FACTOR * need
    return workload, [], None


def check_probe_pool(requests: list[WorkloadRequest], slos: list[SLO]) -> str:
    """Before a capacity search: one line (UserError) where its requests can decide nothing at any rate (a
    steady window needs MIN_LOAD of them, and arrivals that a rate can scale); a note where they are fewer than
    a clear verdict at the SLAs' percentile needs (steady.min_requests: 716 for a p99), else ''."""
    n, need = load_size(requests), min_requests(slos)
    top = max((s.percentile for s in slos), default=50.0)
    if n < MIN_LOAD:
        raise UserError(
            f"{n} request{'s' if n != 1 else ''} cannot decide a capacity: a steady window after the warm-up needs "
            f"at least {MIN_LOAD}, a clear p{top:g} verdict {need}; give --num-requests {need} or more, or compare "
            "at one rate with --rate"
        )
    if max(w.arrival_time for w in requests if not w.probe) <= 0:
        raise UserError(
            "the requests all arrive at once (--arrival all-at-once, --rate inf, or a trace with one timestamp): a "
            "capacity search sets their arrival rate; give them an arrival process, or compare at one rate with "
            "--rate"
        )
    if n < need:
        return (
            f"{n} requests per probe cannot decide a p{top:g} clearly ({need} can): the verdicts are marked not "
            f"clear and the capacity's interval is wide; give --num-requests {need} or more for clear ones"
        )
    return ""
