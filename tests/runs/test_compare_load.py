"""`compare` across load on a fake backend whose answers are known exactly: a policy meets p99 TBT <= 100 ms at
any arrival rate up to its capacity (CAPACITY) and misses it above; served all at once it completes SATURATION
requests/s. The capacity search must land within its resolution below the capacity (or below the saturation
throughput, whichever is lower), the common rate must be the smallest capacity found, and the verdict must say
so."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
from chunkbench.engine.config import EngineConfig

from chunkbench.bench.backend import Backend
from chunkbench.bench.capacity import BISECTIONS, resolution_pct
from chunkbench.bench.harness import RunResult
from chunkbench.bench.load_sweep import common_rate, run_at_common_rate, sweep_policy, verdict
from chunkbench.bench.metrics import RequestRecord
from chunkbench.bench.probing import base_rate
from chunkbench.bench.slo import parse_slas
from chunkbench.workloads.spec import WorkloadSpec, build_workload

CAPACITY = {"static": 1.3, "continuous": 2.0, "chunked": 5.0}  # req/s meeting the TBT SLA
SATURATION = 4.0  # req/s, every policy, all requests at once: chunked's capacity is above it
TOKENS = 5


@dataclass
class KnownBackend(Backend):
    simulated = True
    runs: int = 0

    @contextlib.contextmanager
    def session(self, config, log=None):
        def serve(workload, *, seed=0, warmup_steps=0, progress=False, label="run", stop=None) -> RunResult:
            self.runs += 1
            rate = base_rate(workload)
            itl = 0.010 if rate <= CAPACITY[config.scheduler.policy] else 0.500
            records = [
                RequestRecord(
                    w.prompt_len,
                    TOKENS,
                    w.arrival_time,
                    [w.arrival_time + 0.01 + i * itl for i in range(TOKENS)],
                    first_scheduled_time=w.arrival_time,
                )
                for w in workload
            ]
            end = max(r.token_times[-1] for r in records)
            duration = len(workload) / SATURATION if rate > 1e6 else end
            return RunResult(records, [], duration, 0)

        yield serve


SLOS = parse_slas({"tbt": "100ms"})
WORKLOAD = build_workload(WorkloadSpec(name="synthetic", num_requests=40, rate=1.0, seed=0), 2048)


def sweep(policy: str, backend: Backend, bisections: int = BISECTIONS, rates=(), count=None):
    return sweep_policy(
        policy,
        EngineConfig.create("tiny", policy=policy),
        backend,
        WORKLOAD,
        SLOS,
        2000.0,
        list(rates),
        bisections,
        count,
    )


@pytest.mark.parametrize("bisections", [1, 2, 5])
def test_capacity_within_the_stated_resolution_of_the_truth(bisections):
    resolution = resolution_pct(bisections) / 100
    for policy, truth in CAPACITY.items():
        load = sweep(policy, KnownBackend(), bisections)
        limit = min(truth, SATURATION)
        assert limit / (1 + resolution) <= load.capacity <= limit + 1e-9, (policy, load.capacity)
        assert all(p.rate <= SATURATION or p.above_ceiling for p in load.found.probes)  # nothing run above it
        assert load.saturation.summary["request_throughput"] == pytest.approx(SATURATION)


def test_rates_asked_for_and_counted_are_run():
    backend = KnownBackend()
    load = sweep("continuous", backend, rates=(0.5, 3.0))
    assert [p.rate for p in load.extra] == [0.5, 3.0] and [p.feasible for p in load.extra] == [True, False]
    counted = sweep("continuous", KnownBackend(), count=3)
    assert [round(p.rate, 6) for p in counted.extra] == [round(SATURATION * 2 ** (-k / 2), 6) for k in (3, 2, 1)]


def test_the_common_rate_is_the_smallest_capacity_and_its_runs_are_reused():
    backend = KnownBackend()
    loads = [sweep(policy, backend) for policy in ("continuous", "chunked", "static")]
    rate = common_rate(loads)
    assert rate == min(load.capacity for load in loads) == loads[2].capacity
    before = backend.runs
    runs = [run_at_common_rate(load, rate, backend) for load in loads]
    assert backend.runs == before + 2  # static probed that rate already; the other two run it once more
    assert all(r.summary["p99_itl_ms"] <= 100 for r in runs)  # every policy meets the SLA there
    said = verdict(loads, SLOS, 2000.0, resolution_pct())
    assert said.startswith("at p99 TBT <= 100 ms: chunked sustains ")
    ratio = loads[1].capacity / loads[0].capacity
    assert f"chunked sustains {ratio:.2f}x continuous's rate" in said and "does not win" not in said


def test_the_verdict_says_when_chunked_does_not_win():
    backend = KnownBackend()
    loads = [sweep("chunked", backend), sweep("continuous", backend)]
    loads[0].found.capacity = 1.0  # as if chunked had stalled out first
    said = verdict(loads, SLOS, 2000.0, resolution_pct())
    assert "Chunked prefill does not win here: continuous sustains the most" in said
