"""One trial: run a configuration and score it. `goodput` (request goodput, SLAs as constraints),
`capacity` (the highest request rate meeting the SLAs with a bounded median scheduling delay, by bisection
in one backend session: one launched server per trial), `pareto` (p99 TTFT, p99 TBT, output throughput)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console

from chunkbench.backends import Backend
from chunkbench.capacity import search_capacity
from chunkbench.runs import measure
from chunkbench.slo import goodput_slos, violations
from chunkbench.tune.early_stop import certain_miss
from chunkbench.tune.spec import TrialOutcome, TuneSpec
from chunkbench.workload import WorkloadRequest

console = Console()

METRIC_ATTRS = ("request_goodput", "request_throughput", "output_throughput", "p99_ttft_ms", "median_ttft_ms",
                "p99_itl_ms", "p99_tpot_ms", "median_tpot_ms", "p99_e2el_ms", "median_scheduling_delay_ms", "sla_attainment_pct",
                "num_preemptions", "num_paused_decodes", "longest_stall_ms", "completed",
                "server_requests", "scheduling_delay_source")  # the last two: over HTTP, from the server


def evaluate(spec: TuneSpec, knobs: dict, workload: list[WorkloadRequest], backend: Backend | None = None,
             progress: bool = False, capacity_hint: float | None = None, repeats: int = 1,
             log: Path | None = None) -> TrialOutcome:
    """Run one configuration (engine keyword arguments) against the SLAs. `capacity_hint`: a capacity found
    for another configuration, where the capacity search starts (see _capacity). `repeats` > 1 runs it that
    many times in one session (one launched server) and scores the medians (median_outcome). `log`: where a
    launched server's output goes."""
    outcomes = evaluate_runs(spec, knobs, workload, backend, progress, capacity_hint, repeats, log)
    return outcomes[0] if repeats == 1 else median_outcome(outcomes)


def evaluate_runs(spec: TuneSpec, knobs: dict, workload: list[WorkloadRequest], backend: Backend | None = None,
                  progress: bool = False, capacity_hint: float | None = None, repeats: int = 1,
                  log: Path | None = None) -> list[TrialOutcome]:
    """evaluate's runs, each scored on its own, in one session; each run's metrics name its slot."""
    config = spec.base_config(**knobs)
    backend = backend or spec.backend
    options = dict(goodput_ms=goodput_slos(spec.slos), seed=spec.seed, percentiles=[s.percentile for s in spec.slos],
                   backend=str(backend))

    def once(serve) -> TrialOutcome:
        if spec.objective == "capacity":
            early = backend.kind in ("sim", "engine") and spec.early_stop  # runs the harness can stop

            def run(w: list[WorkloadRequest], may_stop: bool = True) -> dict | None:
                stop = certain_miss(spec.slos, spec.max_sched_delay_ms, len(w)) if early and may_stop else None
                return measure(serve, config, w, progress=False, stop=stop, **options).summary or None
            return _capacity(spec, run, workload, knobs, capacity_hint)
        return _score(spec, knobs, measure(serve, config, workload, progress=progress, **options).summary)

    slot = getattr(backend, "slot", None)
    with backend.session(config, log=log) as serve:
        warm_up_server(backend, serve, config, spec.seed)
        outcomes = [once(serve) for _ in range(repeats)]
    for outcome in outcomes:  # where each run was measured (a launched server's slot), its GPUs' figures
        if slot is not None:
            outcome.metrics["slot"] = str(slot)
        outcome.metrics |= getattr(backend, "gpu_figures", {})
    return outcomes


def warm_up_server(backend: Backend, serve, config, seed: int) -> None:
    """A launched trial measures the configuration, not its server's first steps: a fresh vLLM 0.32 CPU server's
    first large steps are slow (a 1,024-token first step 144 ms where the same step later took ~40; measured on
    the tier, calibration_runs.warmup_requests), a cost no server serving for hours pays. Its launch runs the
    calibration runs' untimed warm-up first. So does a simulator fitted to a server, whose cost remembers the
    token counts it ran (sim/linear_cost.py); see Backend.warms_up. A warm-up the server refused is said, once
    per trial, and the trial goes on (its own requests tell whether the configuration serves)."""
    from chunkbench.tune.calibration_runs import warm_up

    if backend.warms_up and not warm_up(serve, config, seed + 1):
        console.print(f"[yellow]warning:[/] the server refused part of the untimed warm-up (budget "
                      f"{config.scheduler.max_num_batched_tokens} tokens); "
                      "the trial is measured on a server that has not run a budget-sized step", soft_wrap=True)


def median_outcome(outcomes: list[TrialOutcome]) -> TrialOutcome:
    """Repeated measurements of one configuration as one: the median of each value, constraint and numeric
    metric (each figure's own median: a noisy server's p99 TTFT and goodput need not peak in the same run; of
    an even count, the mean of the middle two), every run's metrics kept in `repeats`."""
    first = outcomes[0]

    def median(values: list) -> float:
        return float(np.median(values))

    metrics = {k: median([o.metrics[k] for o in outcomes if k in o.metrics])
               if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in first.metrics.items()}
    return TrialOutcome([median(list(v)) for v in zip(*(o.values for o in outcomes))],
                        {k: median([o.constraints[k] for o in outcomes]) for k in first.constraints}, metrics,
                        first.knobs, repeats=[o.metrics for o in outcomes])


def _score(spec: TuneSpec, knobs: dict, summary: dict) -> TrialOutcome:
    """One run's summary as a trial outcome: its objective values, SLA margins and the metrics kept."""
    # Over HTTP some keys do not exist (paused decodes need the scheduler's decisions): those are left out.
    metrics = {k: summary[k] for k in METRIC_ATTRS if k in summary} | \
        {s.summary_key: summary[s.summary_key] for s in spec.slos}
    if spec.objective == "pareto":
        values = [summary["p99_ttft_ms"], summary["p99_itl_ms"], summary["output_throughput"]]
    else:
        values = [summary["request_goodput"]]
    return TrialOutcome(values, dict(zip((s.name for s in spec.slos), violations(summary, spec.slos))), metrics,
                        knobs)


def _capacity(spec: TuneSpec, run, workload: list[WorkloadRequest], knobs: dict,
              hint: float | None = None) -> TrialOutcome:
    """A trial's capacity (chunkbench/capacity.py's search), its figures at that rate (or, when no rate met
    the SLAs, the lowest rate's miss) and each SLO's margin there."""
    found = search_capacity(run, workload, spec.slos, spec.max_sched_delay_ms, hint)
    keys = METRIC_ATTRS + tuple(s.summary_key for s in spec.slos)
    metrics = {k: found.best[k] for k in keys if k in found.best}
    # Each SLO's margin at the capacity (or its miss at the lowest rate): ties on capacity go to more headroom.
    constraints = {"capacity": 0.0 if found.capacity > 0 else 1.0} | dict(zip((s.name for s in spec.slos),
                                                                             violations(found.best, spec.slos)))
    return TrialOutcome([found.capacity], constraints, metrics | {"capacity_rps": found.capacity}, knobs)
