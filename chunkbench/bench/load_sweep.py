"""`compare` across load: each policy's capacity at an SLA and its latency-load curve, from one backend
session per policy.

Per policy (sweep_policy): a *saturation run*, then the capacity search of chunkbench/bench/capacity.py started
there, settled on long runs and confirmed, then any --rates asked for. Every probe that ran to the end is a point
of the curve (its steady figures: p99 TTFT, p99 and median ITL against throughput). The comparison table is taken
at the *common rate*, the highest rate every policy sustains (the smallest capacity). Without an --sla-*, the SLA
is Sarathi-Serve's relaxed one (default_slo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from chunkbench.bench.backend import Backend
from chunkbench.bench.capacity import Capacity, confirm, search_capacity, settle
from chunkbench.bench.harness import RunResult
from chunkbench.bench.probing import Probe, at_rate, base_rate, make_prober, prefix
from chunkbench.bench.runs import BenchRun, measure
from chunkbench.bench.slo import SLO
from chunkbench.bench.steady import WARMUP
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.policies import chunks_prompts
from chunkbench.engine.shape import StepShape
from chunkbench.errors import UserError
from chunkbench.workloads.spec import WorkloadRequest, WorkloadSpec

RELAXED_FACTOR = 25  # Sarathi-Serve's relaxed TBT SLO: 25x a decode iteration without prefill interference
REFERENCE_BATCH, REFERENCE_CONTEXT = 32, 4096


@dataclass
class PolicyLoad:
    label: str
    config: EngineConfig
    saturation: BenchRun  # a long probe's requests all at once
    found: Capacity
    extra: list[Probe] = field(default_factory=list)  # --rates
    runs: dict[float, BenchRun] = field(default_factory=dict)  # full runs by offered rate
    requests: list[WorkloadRequest] = field(default_factory=list)  # a long probe's, at the pool's rate

    @property
    def capacity(self) -> float:
        return self.found.capacity

    @property
    def saturation_rps(self) -> float:
        return self.saturation.summary["steady_throughput"]

    def points(self) -> list[tuple[float, dict]]:
        """(offered rate, steady figures) of every probe that ran to the end, by rate (the longest run at a
        rate); the saturation run last (rate: infinity)."""
        done: dict[float, Probe] = {}
        for p in self.found.probes + self.found.confirmed + self.extra:
            if p.summary and (p.rate not in done or p.requests * p.draws >= done[p.rate].requests * done[p.rate].draws):
                done[p.rate] = p
        full = sorted((rate, p.summary) for rate, p in done.items())
        return full + [(math.inf, self.saturation.summary | {"request_throughput": self.saturation_rps})]

    def limited_by(self, slos: list[SLO], max_sched_delay_ms: float) -> str:
        """What the lowest rate above the capacity missed (from its run, or 'stopped early' when cut short)."""
        above = sorted(
            (p for p in self.found.probes + self.found.confirmed if not p.feasible and p.rate > self.capacity),
            key=lambda p: p.rate,
        )
        if not above:
            return "-"
        probe = above[0]
        if probe.above_ceiling:
            return f"its saturation throughput {self.saturation_rps:.3g} req/s"
        if probe.summary is None:
            return f"an SLA at {probe.rate:.3g} req/s ({probe.reason or 'stopped early'})"
        return f"{probe.reason} at {probe.rate:.3g} req/s"


def saturation_throughput(result: RunResult) -> float:
    """Requests completed per second while the queue still held requests, the first WARMUP of completions
    left out: the most the server serves in steady state. A run too short to have such a window (every
    request admitted at once): its completions over its duration, as `vllm bench serve` reports them."""
    done = sorted(r.token_times[-1] for r in result.requests if r.ok and not r.probe)
    admitted = [r.first_scheduled_time for r in result.requests if r.first_scheduled_time is not None]
    if len(done) < 10 or not admitted:
        return len(done) / result.duration if result.duration > 0 else 0.0
    start, end = done[math.ceil(WARMUP * len(done))], max(admitted)
    inside = int(np.searchsorted(done, end, "right") - np.searchsorted(done, start, "left"))
    if end - start <= 0 or inside < 0.2 * len(done):
        return len(done) / result.duration if result.duration > 0 else 0.0
    return inside / (end - start)


def decode_iteration_s(backend: Backend, config: EngineConfig, workload: list[WorkloadRequest]) -> tuple[float, str]:
    """A decode-only step of the reference batch, by the backend's cost model; and what it was. The batch is
    Sarathi-Serve's 32 requests at 4k context, but no more requests than the workload has nor more context than
    its mean (prompt and half the output): a CPU run of a few requests never decodes 32 at 4k."""
    mean_context = sum(w.prompt_len + w.output_len // 2 for w in workload) / len(workload)
    context = int(min(REFERENCE_CONTEXT, config.scheduler.max_model_len, mean_context))
    batch = min(REFERENCE_BATCH, config.scheduler.max_num_seqs, len(workload))
    cost = backend.step_cost(config)
    if cost is None:
        raise UserError(f"{backend} predicts no step times for the default SLA: set --sla-tbt or --sla-ttft")
    step = StepShape((), (context,) * batch, batch)
    return cost.predict(step), f"a decode step of {batch} requests at {context} tokens of context"


def default_slo(backend: Backend, config: EngineConfig, workload: list[WorkloadRequest]) -> tuple[list[SLO], str]:
    """Sarathi-Serve's relaxed SLA: p99 TBT within RELAXED_FACTOR decode iterations without prefill interference
    (their strict one is 5x), the iteration's time from the backend's cost model (decode_iteration_s)."""
    seconds, what = decode_iteration_s(backend, config, workload)
    limit = round(RELAXED_FACTOR * seconds * 1000, 1)
    slo = SLO("tbt", 99.0, limit)
    return [slo], (
        f"SLA: {slo} (Sarathi-Serve's relaxed SLO: {RELAXED_FACTOR}x {what}, {seconds * 1000:.1f} ms on "
        f"{backend}); set --sla-tbt/--sla-ttft to choose"
    )


def sweep_policy(
    label: str,
    config: EngineConfig,
    backend: Backend,
    workload: list[WorkloadRequest],
    slos: list[SLO],
    max_sched_delay_ms: float,
    rates: list[float],
    bisections: int,
    count: int | None = None,
    seed: int = 0,
    goodput_ms: dict | None = None,
    warmup_steps: int = 3,
    on_probe=None,
    spec: WorkloadSpec | None = None,
    probe_seconds: float | None = None,
) -> PolicyLoad:
    """One policy's saturation run, capacity search (settled and confirmed) and --rates (or `count` rates half
    an octave apart up to its saturation throughput), in one session. `spec`: the workload's, from which a
    simulator's long probes draw larger pools (None: the requests given are all there is).

    The saturation run sends a long probe's requests all at once: its steady completion rate, the warm-up and the
    drain left out, is the most the policy serves, and the point past saturation on the curve; the capacity
    search starts there (rates above it are not sustained); the confirmation is capacity.confirm."""
    runs: dict[float, BenchRun] = {}
    percentiles = [s.percentile for s in slos]
    with backend.session(config) as serve:

        def run(requests: list[WorkloadRequest], stop=None, keep: bool = True) -> BenchRun:
            options = dict(goodput_ms=goodput_ms, seed=seed, warmup_steps=warmup_steps, percentiles=percentiles)
            done = measure(
                serve, config, requests, label=label, progress=False, backend=str(backend), stop=stop, **options
            )
            if done.summary and keep:
                runs[base_rate(requests)] = done
            return done

        prober = make_prober(
            run,
            workload,
            spec or WorkloadSpec(num_requests=None),
            slos,
            max_sched_delay_ms,
            config.scheduler.max_model_len,
            simulated=backend.simulated,
            stoppable=backend.stoppable,
            probe_seconds=probe_seconds,
        )
        if on_probe:
            prober.on_probe = lambda p: on_probe(label, p)
        longest = prefix(prober.pool, prober.long or prober.first)
        saturation = run(at_rate(longest, 1e9), keep=False)
        saturation.summary["steady_throughput"] = saturation_throughput(saturation.result)
        ceiling = saturation.summary["steady_throughput"]
        if on_probe:
            on_probe(label, Probe(math.inf, saturation.summary | {"request_throughput": ceiling}, False))
        found = search_capacity(prober, ceiling, bisections, ceiling)
        found = confirm(prober, settle(prober, found, bisections=bisections, ceiling=ceiling), bisections)
        extra = [
            prober.probe(rate, may_stop=False)
            for rate in rates + [ceiling * 2 ** (-(count - i) / 2) for i in range(count or 0)]
        ]
    return PolicyLoad(label, config, saturation, found, extra, runs, longest)


def common_rate(loads: list[PolicyLoad]) -> float | None:
    """The highest rate every policy sustains: the smallest capacity (None when a policy met the SLAs at none)."""
    capacities = [load.capacity for load in loads]
    return min(capacities) if capacities and min(capacities) > 0 else None


def run_at_common_rate(load: PolicyLoad, rate: float, backend: Backend, **options) -> BenchRun:
    """The policy's run at `rate` (a long probe's requests): its probe's when one ran there to the end, else a
    new run."""
    for probed, run in load.runs.items():
        if abs(probed - rate) <= 1e-9 * rate:
            return run
    with backend.session(load.config) as serve:
        run = measure(
            serve,
            load.config,
            at_rate(load.requests, rate),
            label=load.label,
            backend=str(backend),
            progress=False,
            **options,
        )
    load.runs[rate] = run
    return run


def verdict(
    loads: list[PolicyLoad],
    slos: list[SLO],
    max_sched_delay_ms: float,
    resolution_pct: float,
    steps: dict[str, tuple[float, float]] | None = None,
) -> str:
    """One line: each policy's capacity against the first's at the SLA; where chunked does not sustain the
    most, that it does not, what limited it, and what the runs at the common rate show (`steps`: per policy,
    mean tokens per step and tokens per second of step time)."""
    sla = " and ".join(map(str, slos))
    first = loads[0]
    parts = []
    for load in loads[1:]:
        if first.capacity > 0:
            parts.append(f"{load.label} sustains {load.capacity / first.capacity:.2f}x {first.label}'s rate")
            if overlap(load.found, first.found):
                parts[-1] += " (their intervals overlap: not ahead)"
        else:
            parts.append(f"{load.label} {load.capacity:.3g} req/s ({first.label} met it at no rate)")
    line = f"at {sla}: " + ("; ".join(parts) if parts else f"{first.label} sustains {first.capacity:.3g} req/s")
    chunked = [load for load in loads if chunks_prompts(load.config.scheduler.policy)]
    best = max(loads, key=lambda load: load.capacity)
    if not chunked or len(loads) < 2 or best in chunked:
        return line
    load = max(chunked, key=lambda c: c.capacity)
    if load.capacity * (1 + resolution_pct / 100) >= best.capacity:
        return line + (
            f". Chunked prefill ties with {best.label} here, within the capacity search's resolution "
            f"({resolution_pct:.1f}%)"
        )
    line += (
        f". Chunked prefill does not win here: {best.label} sustains the most; {load.label} is limited by "
        f"{load.limited_by(slos, max_sched_delay_ms)}"
    )
    if steps and load.label in steps and best.label in steps:
        (size, speed), (best_size, best_speed) = steps[load.label], steps[best.label]
        if speed < 0.9 * best_speed:
            line += (
                f"; at the common rate its steps averaged {size:,.0f} tokens at {speed:,.0f} tokens per second "
                f"of step time, {best.label}'s {best_size:,.0f} at {best_speed:,.0f}: smaller steps cost "
                "throughput on this backend"
            )
    return line


def overlap(a: Capacity, b: Capacity) -> bool:
    """Whether two capacities' intervals overlap (then neither is ahead)."""
    return a.low <= b.high and b.low <= a.high


def step_figures(run: BenchRun) -> tuple[float, float] | None:
    """(mean tokens per step, tokens per second of step time) of a run with steps (engine, simulator)."""
    steps = run.result.steps
    tokens = sum(s.prefill_tokens + s.decode_tokens for s in steps)
    seconds = sum(s.seconds for s in steps)
    return (tokens / len(steps), tokens / seconds) if steps and seconds > 0 else None
