"""The probes of a capacity search for one configuration (bench/capacity.py: Prober), built the same way for
`tune --objective capacity` and `compare`: on a simulator, short probes of the user's requests and long ones
on larger pools drawn with several seeds; on a real clock, one run each, grown within a time budget."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

from chunkbench.bench.capacity import Prober, load_size
from chunkbench.bench.slo import SLO, goodput_slos
from chunkbench.bench.steady import min_requests
from chunkbench.bench.workload import WorkloadRequest, WorkloadSpec, build_workload

LONG_FACTOR = 1  # a simulated long probe starts at this many times the requests a clear verdict needs
POOL_FACTOR = 4  # and may grow to this many (the confirmation runs twice the longest, within the pool)
DRAWS = 3  # and holds only where it holds on this many workloads drawn with consecutive seeds


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
    """`run(requests, stop)` -> runs.BenchRun. `workload`: the user's requests (a short probe's). A workload
    whose pools cannot hold a long probe (a short trace) gets short probes only."""
    first = load_size(workload)
    base, long, draws = workload, None, []
    if simulated and spec.num_requests:
        need = min_requests(slos)
        pools = [
            list(pool(dataclasses.replace(spec, seed=spec.seed + k), POOL_FACTOR * need, max_model_len))
            for k in range(DRAWS)
        ]
        if load_size(pools[0]) >= LONG_FACTOR * need:
            base, draws, long = pools[0], pools[1:], LONG_FACTOR * need

    def longest(rate: float) -> int:
        if simulated:
            return load_size(base)
        return max(first, int(rate * probe_seconds)) if probe_seconds else first

    return Prober(run, base, slos, max_sched_delay_ms, first, longest, long, stoppable, goodput_slos(slos), draws)
