"""One trial: run a configuration in a backend session and score it by the spec's objective (registry.get);
repeated runs of one configuration as their medians."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console

from chunkbench.bench.backend import Backend
from chunkbench.launch.process import whole_runs
from chunkbench.tune.objectives.base import Run
from chunkbench.tune.objectives.registry import get
from chunkbench.tune.spec import TrialOutcome, TuneSpec
from chunkbench.workloads.spec import WorkloadRequest

console = Console()


def evaluate(
    spec: TuneSpec,
    knobs: dict,
    workload: list[WorkloadRequest],
    backend: Backend | None = None,
    progress: bool = False,
    capacity_hint: float | None = None,
    repeats: int = 1,
    log: Path | None = None,
) -> TrialOutcome:
    """Run one configuration (engine keyword arguments) against the SLAs. `capacity_hint`: a capacity found
    for another configuration, where the capacity search starts (objectives/capacity.py). `repeats` > 1 runs
    it that many times in one session (one launched server) and scores the medians (median_outcome). `log`:
    where a launched server's output goes."""
    outcomes = evaluate_runs(spec, knobs, workload, backend, progress, capacity_hint, repeats, log)
    return outcomes[0] if repeats == 1 else median_outcome(outcomes)


def evaluate_runs(
    spec: TuneSpec,
    knobs: dict,
    workload: list[WorkloadRequest],
    backend: Backend | None = None,
    progress: bool = False,
    capacity_hint: float | None = None,
    repeats: int = 1,
    log: Path | None = None,
) -> list[TrialOutcome]:
    """evaluate's runs, each scored on its own, in one session; each run's metrics name its slot."""
    objective = get(spec.objective)
    backend = backend or spec.backend
    slot = getattr(backend, "slot", None)
    with open_run(spec, knobs, workload, backend, log, progress, capacity_hint) as run:
        outcomes = [objective.score(run) for _ in range(repeats)]
    for outcome in outcomes:  # where each run was measured (a launched server's slot and release), its GPUs' figures
        if slot is not None:
            outcome.metrics["slot"] = str(slot)
        outcome.metrics |= getattr(backend, "figures", {})
    return outcomes


@contextlib.contextmanager
def open_run(
    spec: TuneSpec,
    knobs: dict,
    workload: list[WorkloadRequest],
    backend: Backend | None = None,
    log: Path | None = None,
    progress: bool = False,
    capacity_hint: float | None = None,
) -> Iterator[Run]:
    """A configuration in a backend session of its own (a launched server), warmed up, for an objective. A run
    an interrupt cut short raises Interrupted (launch.process.whole_runs): never scored as a trial's."""
    backend = backend or spec.backend
    config = spec.base_config(**knobs)
    with backend.session(config, log=log) as session:
        serve = whole_runs(session)
        warm_up_server(backend, serve, config, spec.seed)
        yield Run(spec, knobs, workload, serve, config, backend, progress, capacity_hint)


def warm_up_server(backend: Backend, serve, config, seed: int) -> None:
    """A launched trial measures the configuration, not its server's first steps: a fresh vLLM 0.32 CPU server's
    first large steps are slow (docs/guides/simulator.md; presearch.runs.warmup_requests), a cost no server
    serving for hours pays. Its launch runs the
    calibration runs' untimed warm-up first. So does a simulator fitted to a server, whose cost remembers the
    token counts it ran (sim/linear_cost.py); see Backend.warms_up. A warm-up the server refused is said, once
    per trial, and the trial goes on (its own requests tell whether the configuration serves)."""
    from chunkbench.tune.presearch.runs import warm_up

    if backend.warms_up and not warm_up(serve, config, seed + 1):
        console.print(
            f"[yellow]warning:[/] the server refused part of the untimed warm-up (budget "
            f"{config.scheduler.max_num_batched_tokens} tokens); "
            "the trial is measured on a server that has not run a budget-sized step",
            soft_wrap=True,
        )


def median_outcome(outcomes: list[TrialOutcome]) -> TrialOutcome:
    """Repeated measurements of one configuration as one: the median of each value, constraint and numeric
    metric (each figure's own median: a noisy server's p99 TTFT and goodput need not peak in the same run; of
    an even count, the mean of the middle two), every run's metrics kept in `repeats`."""
    first = outcomes[0]

    def median(values: list) -> float:
        return float(np.median(values))

    metrics = {
        k: median([o.metrics[k] for o in outcomes if k in o.metrics])
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else v
        for k, v in first.metrics.items()
    }
    return TrialOutcome(
        [median(list(v)) for v in zip(*(o.values for o in outcomes))],
        {k: median([o.constraints[k] for o in outcomes]) for k in first.constraints},
        metrics,
        first.knobs,
        repeats=[o.metrics for o in outcomes],
    )
