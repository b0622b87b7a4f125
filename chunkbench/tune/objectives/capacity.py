"""`capacity`: the highest request rate a configuration sustains in steady state with the SLAs met and a
bounded median scheduling delay (chunkbench/bench/capacity.py), searched in one backend session: one launched
server per trial.

On a simulator each trial is screened on short runs (the tune's requests per probe: its capacity an upper
bound, as short runs flatter); the best few are then settled on long runs (tune/settle.py) and the winner
confirmed on a longer one (tune/settle.py). On a real server a probe is one run, grown within
--probe-seconds of arrivals when set."""

from __future__ import annotations

import dataclasses
import math

from chunkbench.bench.capacity import Capacity as Found
from chunkbench.bench.capacity import confirm, resolution_pct, search_capacity, settle
from chunkbench.bench.probing import Probe, Prober, make_prober
from chunkbench.bench.slo import violations
from chunkbench.tune.objectives.base import METRIC_ATTRS, Objective, Run
from chunkbench.tune.objectives.registry import register
from chunkbench.tune.spec import TrialOutcome, TuneSpec
from chunkbench.workloads.spec import WorkloadRequest

RESOLUTION_PCT = resolution_pct()


def prober(run: Run) -> Prober:
    """The trial's probes (bench/probing.py), each run in the trial's session."""
    spec, backend = run.spec, run.backend

    def measure(requests: list[WorkloadRequest], stop):
        return run.measure(requests, progress=False, stop=stop)

    return make_prober(
        measure,
        run.workload,
        spec.workload,
        spec.slos,
        spec.max_sched_delay_ms,
        run.config.scheduler.max_model_len,
        simulated=backend.simulated,
        stoppable=backend.stoppable and spec.early_stop,
        probe_seconds=spec.probe_seconds,
    )


def outcome(spec: TuneSpec, knobs: dict, found: Found, settled: bool) -> TrialOutcome:
    """A capacity as a trial outcome: its value, interval, figures and each SLO's margin there."""
    best = found.best or {}
    keys = METRIC_ATTRS + tuple(s.summary_key for s in spec.slos)
    metrics = {k: best[k] for k in keys if k in best} | {
        "capacity_rps": found.capacity,
        "capacity_low_rps": found.low,
        "capacity_steady": settled and found.converged,
    }
    if math.isfinite(found.high):
        metrics["capacity_high_rps"] = found.high
    # Each SLO's margin at the capacity (or its miss at the lowest rate): ties on capacity go to more headroom.
    constraints = {"capacity": 0.0 if found.capacity > 0 else 1.0} | dict(
        zip((s.name for s in spec.slos), violations(best, spec.slos))
    )
    return TrialOutcome([found.capacity], constraints, metrics, knobs)


def searched(metrics: dict) -> Found:
    """A trial's capacity back from its metrics (what settle and confirm start from; its figures, those)."""
    high = metrics.get("capacity_high_rps", math.inf)
    return Found(metrics["capacity_rps"], metrics, [], metrics.get("capacity_low_rps", 0.0), high)


class Capacity(Objective):
    name = "capacity"
    help = (
        "capacity (highest req/s sustained in steady state with the SLAs met and median scheduling delay <= "
        "--max-sched-delay, by bisection)"
    )
    value_labels = ("capacity (req/s)",)
    headline_name = "capacity"
    column = ("capacity req/s", "capacity_rps")
    rows = (("capacity_rps", "capacity (req/s)"),)
    extra_rows = (("median_scheduling_delay_ms", "median sched. delay (ms)"),)
    needs_slos = True
    auto_with_slas = True

    def score(self, run: Run) -> TrialOutcome:
        """The trial's capacity with its interval and its figures there (or, when no rate met the SLAs, the
        lowest rate's miss): on a simulator, its short runs' (an upper bound until settled)."""
        probes = prober(run)
        return outcome(run.spec, run.knobs, search_capacity(probes, run.capacity_hint), probes.long is None)

    def settle(self, run: Run, metrics: dict, floor: float | None) -> TrialOutcome:
        """A screened trial's capacity on long runs (bench/capacity.py: settle)."""
        return outcome(run.spec, run.knobs, settle(prober(run), searched(metrics), floor), True)

    def confirm(self, run: Run, metrics: dict) -> tuple[TrialOutcome, list[Probe], str]:
        """The winner's capacity run longer and a step above it (bench/capacity.py: confirm)."""
        probes = prober(run)
        found = searched(metrics)
        found.probes = [Probe(found.capacity, None, True, requests=probes.long or probes.first)]
        done = confirm(probes, found)
        best = done.best or (done.confirmed[0].summary if done.confirmed else None)
        return outcome(run.spec, run.knobs, replace_best(done, best), True), done.confirmed, done.note

    def tie_reason(self, winner, runner) -> str:
        return (
            f"the capacity search resolves rates to {RESOLUTION_PCT:.1f}% on a fixed grid, and both met the "
            "SLAs at the same highest rate"
        )

    def notes(self, spec: TuneSpec) -> list[str]:
        length = (
            f"each trial screened on probes of {spec.workload.num_requests} requests (short runs flatter: an upper "
            "bound), the best settled on long runs"
            if spec.backend.simulated
            else f"probes of {spec.workload.num_requests} requests"
            + (f", grown within {spec.probe_seconds:g} s of arrivals" if spec.probe_seconds else "")
        )
        return [
            f"Capacity is the highest rate sustained in steady state (warm-up and drain left out; {length}), "
            f"found by bisection to {RESOLUTION_PCT:.1f}%; configurations closer than that tie. Probes that had "
            "certainly missed were stopped early (same verdict as a full run). The SLA figures shown are the "
            "steady window's at the capacity."
        ]


def replace_best(found: Found, best: dict | None) -> Found:
    return dataclasses.replace(found, best=best)


register(Capacity())
