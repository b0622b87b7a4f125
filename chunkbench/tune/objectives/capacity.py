"""`capacity`: the highest request rate meeting the SLAs with a bounded median scheduling delay
(Sarathi-Serve's), by bisection in one backend session (chunkbench/bench/capacity.py): one launched server per trial."""

from __future__ import annotations

from chunkbench.bench.capacity import resolution_pct, search_capacity
from chunkbench.bench.slo import violations
from chunkbench.bench.workload import WorkloadRequest
from chunkbench.tune.early_stop import certain_miss
from chunkbench.tune.objectives.base import METRIC_ATTRS, Objective, Run
from chunkbench.tune.objectives.registry import register
from chunkbench.tune.spec import TrialOutcome, TuneSpec

RESOLUTION_PCT = resolution_pct()


class Capacity(Objective):
    name = "capacity"
    help = (
        "capacity (highest req/s meeting the SLAs with median scheduling delay <= --max-sched-delay, by "
        "bisection: Sarathi-Serve's)"
    )
    value_labels = ("capacity (req/s)",)
    headline_name = "capacity"
    column = ("capacity req/s", "capacity_rps")
    rows = (("capacity_rps", "capacity (req/s)"),)
    extra_rows = (("median_scheduling_delay_ms", "median sched. delay (ms)"),)
    needs_slos = True
    auto_with_slas = True

    def score(self, run: Run) -> TrialOutcome:
        """The trial's capacity, its figures at that rate (or, when no rate met the SLAs, the lowest rate's
        miss) and each SLO's margin there. Probes the harness can stop end once they have certainly missed."""
        spec = run.spec
        early = run.backend.kind in ("sim", "engine") and spec.early_stop  # runs the harness can stop

        def probe(w: list[WorkloadRequest], may_stop: bool = True) -> dict | None:
            stop = certain_miss(spec.slos, spec.max_sched_delay_ms, len(w)) if early and may_stop else None
            return run.measure(w, progress=False, stop=stop).summary or None

        found = search_capacity(probe, run.workload, spec.slos, spec.max_sched_delay_ms, run.capacity_hint)
        keys = METRIC_ATTRS + tuple(s.summary_key for s in spec.slos)
        metrics = {k: found.best[k] for k in keys if k in found.best}
        # Each SLO's margin at the capacity (or its miss at the lowest rate): ties on capacity go to more headroom.
        constraints = {"capacity": 0.0 if found.capacity > 0 else 1.0} | dict(
            zip((s.name for s in spec.slos), violations(found.best, spec.slos))
        )
        return TrialOutcome([found.capacity], constraints, metrics | {"capacity_rps": found.capacity}, run.knobs)

    def tie_reason(self, winner, runner) -> str:
        return (
            f"the capacity search resolves rates to {RESOLUTION_PCT:.1f}% on a fixed grid, and both met the "
            "SLAs at the same highest rate"
        )

    def notes(self, spec: TuneSpec) -> list[str]:
        return [
            f"Capacity is found by bisection to {RESOLUTION_PCT:.1f}% on {spec.workload.num_requests} requests; "
            "configurations closer than that tie. Probes that had certainly missed an SLA were stopped early "
            "(same verdict as a full run). The SLA figures shown are those at the capacity."
        ]


register(Capacity())
