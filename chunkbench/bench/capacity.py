"""Capacity at an SLA: the highest offered rate that a server sustains in steady state (it keeps pace, its
queue does not grow) with every SLA met, and a median scheduling delay within a bound (Sarathi-Serve's), over
the steady window of chunkbench/bench/steady.py. One search, shared by `tune --objective capacity` and
`compare` (each policy's capacity and its latency-load curve, from the same probes); docs/concepts/capacity.md
says why each rule is there.

A probe serves a pool's first requests at the rate and judges the steady window, again on twice the requests
while the verdict is not clear (steady.judge); early stops (chunkbench/bench/early_stop.py) end the overloaded
ones. Rates lie on a Lattice: search_capacity gallops to a bracket and bisects, `settle` does it again on long
runs, and `confirm` runs the capacity again, longer, and a step above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from chunkbench.bench.probing import CONFIRM_DRAWS, Probe, Prober, base_rate, load_size

BRACKET = 7  # the bracket's rates are base * 2**k for k in [-BRACKET, BRACKET]
BISECTIONS = 5  # the lattice's 2**BISECTIONS points an octave: about 2.2% apart
CONFIRM_LENGTH = 4  # the confirmation runs this many times the longest probe's requests (as the pool allows)
CONFIRM_ABOVE = 0.15  # and a run this much above the capacity, which must not hold


@dataclass
class Capacity:
    """The highest rate that held, and its interval: from the highest rate whose verdict was clear to the lowest
    rate above it that clearly failed."""

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


class Lattice:
    """The rates a search may probe, base * 2**(j / 2**bisections) (base: the pool's own rate), so that two
    configurations with the same boundary get the same capacity; and the verdicts found on them, short and
    long. A short probe is its first run only; a long one starts at `prober.long` and grows until clear, up to
    `prober.longest(rate)`: thousands of requests on a simulator, a real server's held to its caller's budget.
    `ceiling`: rates above it are not sustained, without a run (compare: the saturation throughput). The rates
    probed lie within BRACKET octaves of `center` (a hint, a capacity found; default the base): a pool whose own
    rate is far from the server's (a trace replayed fast) still has its capacity on the lattice; and within BRACKET
    octaves of the base, where a short run's capacity far above it does not hold on long ones."""

    def __init__(
        self,
        prober: Prober,
        bisections: int = BISECTIONS,
        ceiling: float | None = None,
        length: int | None = None,
        draws: int = 0,
        center: float | None = None,
    ):
        self.prober, self.ceiling = prober, ceiling
        self.length, self.draws = length, draws  # long runs from `length` on `draws` pools (0: the default)
        self.base, self.per_octave = base_rate(prober.pool), 2**bisections
        middle = self._nearest(center) if center and center > 0 else 0
        span = BRACKET * self.per_octave  # around the base too: a short run's capacity far above it may not hold
        self.lowest, self.highest = min(middle, 0) - span, max(middle, 0) + span
        self.probes: list[Probe] = []
        self.verdicts: dict[tuple[int, bool], Probe] = {}

    def rate(self, j: int) -> float:
        return self.base * 2.0 ** (j / self.per_octave)

    def _nearest(self, rate: float) -> int:
        return round(self.per_octave * math.log2(rate / self.base))

    def index(self, rate: float) -> int:
        return self.clamp(self._nearest(rate))

    def clamp(self, j: int) -> int:
        return max(self.lowest, min(self.highest, j))

    def feasible(self, j: int, long: bool = False, may_stop: bool = True) -> bool:
        rate, prober = self.rate(j), self.prober
        if self.ceiling is not None and rate > self.ceiling:
            probe = Probe(rate, None, False, above_ceiling=True, reason="above its saturation throughput")
        elif long:
            # from `length` where one is set (a confirmation's), grown while the server has not filled
            probe = prober.probe(rate, may_stop, start=self.length or prober.long, draws=self.draws)
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
            j = self.clamp((lo + step) if hi is None else (hi - step))
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
    lattice = Lattice(prober, bisections, ceiling, center=hint)
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
    lattice = Lattice(prober, bisections, ceiling, center=short.capacity)
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
    """Evidence at the boundary: the capacity run CONFIRM_LENGTH times longer than its longest probe (longer
    while the server has not filled) must hold on CONFIRM_DRAWS draws, and a run CONFIRM_ABOVE above it must not
    on as many. A capacity that does not hold is searched again below it on runs of that length (galloping down,
    then bisecting) and the report says so."""
    if found.capacity <= 0:
        return found
    longest = max(p.requests for p in found.probes if p.rate <= found.capacity * (1 + 1e-9))
    length = min(CONFIRM_LENGTH * longest, prober.longest(found.capacity), load_size(prober.pool))
    lattice = Lattice(prober, bisections, length=length, draws=CONFIRM_DRAWS, center=found.capacity)
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
    above = prober.probe(rate * (1 + CONFIRM_ABOVE), start=length, draws=CONFIRM_DRAWS)  # on as many draws
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
