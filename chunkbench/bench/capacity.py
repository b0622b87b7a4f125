"""Capacity at an SLA: the highest offered rate that a server sustains in steady state (it keeps pace, its
queue does not grow) with every SLA met, and a median scheduling delay within a bound (Sarathi-Serve's), over
the steady window of chunkbench/bench/steady.py. One search, shared by `tune --objective capacity` and
`compare` (each policy's capacity and its latency-load curve, from the same probes). docs/concepts/capacity.md
says why each rule is there.

A *probe* serves the first `first` requests of a pool at the rate (the pool's arrivals compressed or stretched
to it) and judges the steady window; a verdict that is not yet clear (steady.judge) is run again on twice the
requests, up to `longest(rate)`. A simulator's probes grow to thousands of requests; a real server's are held
to the time budget its caller sets. Early stops (chunkbench/bench/early_stop.py) end the overloaded ones.

Rates lie on one lattice, `2**bisections` points an octave (5: about 2.2% apart); the search gallops from a
hint (another configuration's capacity) to a bracket, then bisects (search_capacity); `settle` does it again
on long runs. The capacity is the highest rate that held; its interval runs from the highest rate whose
verdict was clear to the lowest rate above it that clearly failed. Then `confirm` runs the capacity again,
longer, and a step above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from chunkbench.bench.early_stop import certain_miss
from chunkbench.bench.slo import SLO
from chunkbench.bench.steady import judge, steady_state
from chunkbench.bench.workload import WorkloadRequest, add_probes

BRACKET = 7  # the bracket's rates are base * 2**k for k in [-BRACKET, BRACKET]
BISECTIONS = 5
CONFIRM_LENGTH = 2  # the confirmation runs this many times the longest probe's requests (as the pool allows)
CONFIRM_ABOVE = 0.15  # and a run this much above the capacity, which must not hold


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


@dataclass
class Capacity:
    capacity: float  # req/s; 0 when no probed rate met the SLAs
    best: dict | None  # the steady figures at the capacity; when none met them, the lowest rate's (its miss)
    probes: list[Probe] = field(default_factory=list)
    low: float = 0.0  # the interval: the highest rate clearly sustained ...
    high: float = math.inf  # ... to the lowest rate above the capacity that clearly was not
    confirmed: list[Probe] = field(default_factory=list)  # the confirmation runs (confirm)
    note: str = ""  # what the confirmation changed
    converged: bool = True  # False: short runs only, below a capacity confirmed elsewhere (an upper bound)

    def interval(self) -> str:
        high = "-" if math.isinf(self.high) else f"{self.high:.3g}"
        return f"{self.capacity:.3g} req/s ({self.low:.3g}-{high})"


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

    def probe(self, rate: float, may_stop: bool = True, start: int | None = None, grow: bool = True) -> Probe:
        """The steady verdict at `rate`. A long probe (`start` given) holds only where it holds on the pool and
        on every other draw: a rate at the knee of a tail latency holds on one sample of bursts and not on
        the next, and a user's run is one more sample. Over several draws it must also hold with their noise:
        each figure's mean over the draws plus twice their standard deviation within its limit."""
        pools = [self.pool, *self.draws] if start else [self.pool]
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
            if verdict.clear or n >= limit or not grow:
                break
            n = min(limit, 2 * n)
        # Over several draws the draws are the noise measure: their verdicts together are the clear one.
        clear = verdict.clear or bool(self.draws and start)
        summary = steady.summary
        if verdict.feasible and before is not None and before.summary and _worse(before.summary, summary, self.slos):
            summary = before.summary  # the worst draw's figures
        probe = Probe(rate, summary, verdict.feasible, False, n, clear, verdict.reason, done.summary, draws)
        probe.drawn = steady.summary
        return probe


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


class Lattice:
    """The rates a search may probe, base * 2**(j / 2**bisections) (base: the pool's own rate), so that two
    configurations with the same boundary get the same capacity; and the verdicts found on them, short and
    long. A short probe is its first run only; a long one starts at `prober.long` and grows until clear.
    `ceiling`: rates above it are not sustained, without a run (compare: the saturation throughput)."""

    def __init__(
        self, prober: Prober, bisections: int = BISECTIONS, ceiling: float | None = None, length: int | None = None
    ):
        self.prober, self.ceiling, self.length = prober, ceiling, length  # length: long runs of exactly this
        self.base, self.per_octave = base_rate(prober.pool), 2**bisections
        self.edge = BRACKET * self.per_octave  # rates within base * 2**(+-BRACKET)
        self.probes: list[Probe] = []
        self.verdicts: dict[tuple[int, bool], Probe] = {}

    def rate(self, j: int) -> float:
        return self.base * 2.0 ** (j / self.per_octave)

    def index(self, rate: float) -> int:
        return max(-self.edge, min(self.edge, round(self.per_octave * math.log2(rate / self.base))))

    def feasible(self, j: int, long: bool = False, may_stop: bool = True) -> bool:
        rate, prober = self.rate(j), self.prober
        if self.ceiling is not None and rate > self.ceiling:
            probe = Probe(rate, None, False, above_ceiling=True, reason="above its saturation throughput")
        elif long:
            probe = prober.probe(rate, may_stop, start=self.length or prober.long, grow=self.length is None)
        else:
            two_phase = prober.long is not None
            probe = prober.probe(rate, may_stop, grow=not two_phase)
            probe.clear = probe.clear and not (two_phase and probe.feasible)  # provisional until a long run
        self.probes.append(probe)
        self.verdicts[j, long] = probe
        return probe.feasible

    def bracket(self, j: int, long: bool, step: int, lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
        """Gallop from j (steps doubling) until lo holds and hi fails, then bisect them to adjacent points."""
        while lo is None or hi is None:
            j = max(-self.edge, min(self.edge, (lo + step) if hi is None else (hi - step)))
            if (j, long) in self.verdicts:  # at the edge of the range
                break
            lo, hi = (j, hi) if self.feasible(j, long) else (lo, j)
            step *= 2
        while lo is not None and hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.feasible(mid, long) else (lo, mid)
        return lo, hi

    def result(self, lo: int | None, converged: bool = True) -> Capacity:
        """The capacity at lattice point lo (None: no rate met the SLAs; then the lowest rate's miss, run in full)."""
        if lo is None:
            lowest = min(self.verdicts)
            if self.verdicts[lowest].summary is None:
                self.feasible(lowest[0], lowest[1], may_stop=False)
            return Capacity(0.0, self.verdicts[lowest].summary, self.probes, *interval(self.probes, 0.0))
        capacity = self.rate(lo)
        best = self.verdicts.get((lo, True)) or self.verdicts.get((lo, False))
        held = [p for (j, _), p in self.verdicts.items() if j >= lo and p.feasible]
        summary = (best or held[0]).summary if best or held else None
        return Capacity(capacity, summary, self.probes, *interval(self.probes, capacity), converged=converged)


def search_capacity(
    prober: Prober, hint: float | None = None, bisections: int = BISECTIONS, ceiling: float | None = None
) -> Capacity:
    """The capacity on `prober`'s pool. From the pool's own rate, or the lattice point nearest `hint` (another
    configuration's capacity), gallop (a quarter octave after a hint, an octave without, doubling) until a rate
    holds and a rate above it fails, then bisect to adjacent lattice points. Where the prober has long runs
    (`prober.long`) these are short runs, which can only flatter (a server that starts empty has not met its
    worst yet): their misses stand, their passes are provisional until `settle` runs long."""
    lattice = Lattice(prober, bisections, ceiling)
    j = 0 if not hint or hint <= 0 else lattice.index(hint)
    lo, hi = (j, None) if lattice.feasible(j) else (None, j)
    lo, _ = lattice.bracket(j, False, max(1, lattice.per_octave // 4) if hint else lattice.per_octave, lo, hi)
    return lattice.result(lo)


def settle(
    prober: Prober,
    short: Capacity,
    floor: float | None = None,
    bisections: int = BISECTIONS,
    ceiling: float | None = None,
) -> Capacity:
    """The steady capacity from a short search's: long runs descend from it, galloping, until one holds, then
    bisect (its short misses stand for long ones). `floor`: a steady capacity found elsewhere (a tune's best
    so far): a configuration whose short capacity is below it, or whose long run fails at it, is not settled
    further (converged False; its capacity is then an upper bound)."""
    if prober.long is None or short.capacity <= 0:
        return short
    lattice = Lattice(prober, bisections, ceiling)
    lattice.probes = list(short.probes)
    lo, hi = lattice.index(short.capacity), lattice.index(short.high) if math.isfinite(short.high) else None
    top = None if floor is None else lattice.index(floor)
    if top is not None and lo < top:
        return replace(short, converged=False)
    start = lo if top is None else min(lo, top)
    if lattice.feasible(start, long=True):
        lo, _ = lattice.bracket(start, True, 1, start, hi)
        return lattice.result(lo)
    if start == top:  # below the floor: where exactly matters to no one
        return replace(lattice.result(top - 1, converged=False), best=short.best)
    lo, _ = lattice.bracket(start, True, 1, None, start)
    return lattice.result(lo)


def interval(probes: list[Probe], capacity: float) -> tuple[float, float]:
    """From the highest rate up to the capacity whose verdict was clear and held, to the lowest rate above it
    whose verdict was clear and failed (an unclear verdict at the length cap widens it)."""
    held = [p.rate for p in probes if p.feasible and p.clear and p.rate <= capacity]
    failed = [p.rate for p in probes if not p.feasible and p.clear and p.rate > capacity]
    return (max(held) if held else 0.0), (min(failed) if failed else math.inf)


def confirm(prober: Prober, found: Capacity, bisections: int = BISECTIONS) -> Capacity:
    """Evidence at the boundary: the capacity run CONFIRM_LENGTH times longer than its longest probe must hold,
    and a run CONFIRM_ABOVE above it must not. A capacity that does not hold is searched again below it on
    runs of that length (galloping down, then bisecting) and the report says so."""
    if found.capacity <= 0:
        return found
    longest = max(p.requests for p in found.probes if p.rate <= found.capacity * (1 + 1e-9))
    length = min(CONFIRM_LENGTH * longest, prober.longest(found.capacity), load_size(prober.pool))
    lattice = Lattice(prober, bisections, length=length)
    lattice.probes = list(found.probes)
    top = lattice.index(found.capacity)
    lo, hi = (
        (top, None) if lattice.feasible(top, long=True, may_stop=False) else lattice.bracket(top, True, 1, None, top)
    )
    confirmed = lattice.probes[len(found.probes) :]
    notes = [
        f"{p.rate:.3g} req/s did not hold over {p.requests:,} requests ({p.reason})"
        for p in confirmed
        if not p.feasible
    ]
    if lo is None:
        return replace(found, capacity=0.0, low=0.0, confirmed=confirmed, note="; ".join(notes) + ": none held")
    rate = lattice.rate(lo)
    above = prober.probe(rate * (1 + CONFIRM_ABOVE), start=length, grow=False)
    confirmed.append(above)
    if above.feasible:
        notes.append(
            f"{above.rate:.3g} req/s ({CONFIRM_ABOVE:.0%} above) also held over {above.requests:,} requests: the "
            "capacity may be understated"
        )
    lowered = lo < top
    low, high = (rate, lattice.rate(hi)) if lowered else (found.low, found.high)
    note = "; ".join(notes) + (f": capacity lowered to {rate:.3g} req/s" if lowered else "")
    best = lattice.verdicts[lo, True].summary
    return replace(found, capacity=rate, best=best, low=low, high=high, confirmed=confirmed, note=note)
