"""The capacity search on a server whose capacity is known exactly: one FIFO server taking SERVICE_S seconds a
request (20 req/s), fed at constant arrivals. Below 20 req/s no request waits; above, the queue grows without
end. A capacity must land within the search's resolution below 20 req/s, with 20 inside its interval; a rate
above must be called over-saturated; and a server that is twice as fast for its first seconds (a start-up
transient that a short run never leaves) must not move the capacity."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

from chunkbench.engine.config import EngineConfig

from chunkbench.bench.backend import Backend
from chunkbench.bench.capacity import confirm, resolution_pct, search_capacity, settle
from chunkbench.bench.harness import RunResult
from chunkbench.bench.metrics import RequestRecord
from chunkbench.bench.probing import make_prober
from chunkbench.bench.runs import measure
from chunkbench.bench.slo import parse_slas
from chunkbench.bench.steady import MAX_GROWTH
from chunkbench.workloads.spec import WorkloadSpec, build_workload

SERVICE_S = 0.05  # 20 req/s
TRUTH = 1 / SERVICE_S


@dataclass
class QueueBackend(Backend):
    """A simulated FIFO server: a request starts when it has arrived and the one before it has finished, and
    takes SERVICE_S (half that before `fast_until` seconds of the run: the transient)."""

    fast_until: float = 0.0
    decode_s: float = 0.0  # after its first token, a request's last comes this much later (a long decode)
    simulated = True

    @contextlib.contextmanager
    def session(self, config, log=None):
        def serve(workload, *, seed=0, warmup_steps=0, progress=False, label="run", stop=None) -> RunResult:
            free, records = 0.0, []
            for w in sorted(workload, key=lambda w: w.arrival_time):
                start = max(w.arrival_time, free)
                free = start + (SERVICE_S / 2 if start < self.fast_until else SERVICE_S)
                times = [free, free + self.decode_s] if self.decode_s else [free]
                record = RequestRecord(w.prompt_len, len(times), w.arrival_time, times, first_scheduled_time=start)
                records.append(record)
            return RunResult(records, [], free + self.decode_s - records[0].arrival_time, 0)

        yield serve


SPEC = WorkloadSpec(
    name="synthetic", num_requests=100, rate=1.0, arrival="constant", prompt_len="fixed:16", output_len="fixed:1"
)
SLOS = parse_slas({"ttft": "150ms"})  # three services: met with no queue, missed soon after one grows


def capacity(backend: QueueBackend, slos=SLOS):
    config = EngineConfig.create("tiny")
    workload = build_workload(SPEC, 2048)
    with backend.session(config) as serve:

        def run(requests, stop=None):
            return measure(serve, config, requests, progress=False, percentiles=[99.0], backend="sim")

        prober = make_prober(run, workload, SPEC, slos, 2000.0, 2048, simulated=True, stoppable=False)
        found = search_capacity(prober)
        return prober, found, confirm(prober, settle(prober, found))


def test_the_capacity_is_the_service_rate_within_the_interval():
    _, short, found = capacity(QueueBackend())
    step = 1 + resolution_pct() / 100
    assert TRUTH / step <= found.capacity <= TRUTH * (1 + 1e-9), found.interval()
    assert found.low <= TRUTH <= found.high, found.interval()
    assert found.confirmed[0].feasible and not found.confirmed[-1].feasible  # held at it, not 15% above
    assert short.capacity >= found.capacity  # short runs can only flatter


def test_a_rate_above_it_is_over_saturated():
    prober, _, _ = capacity(QueueBackend(), parse_slas({"ttft": "100s"}))  # an SLA the queue takes long to miss
    probe = prober.probe(1.3 * TRUTH, start=prober.long)
    assert not probe.feasible and "over-saturated" in probe.reason, probe.reason


def test_a_fast_start_does_not_fool_it():
    """Twice as fast for its first 10 s: a 100-request run at up to 40 req/s never leaves that; the
    capacity, from long runs, is still the service rate."""
    _, short, found = capacity(QueueBackend(fast_until=10.0))
    assert short.capacity > 1.5 * TRUTH  # the short runs were fooled, as they can only be: upward
    step = 1 + resolution_pct() / 100
    assert TRUTH / step <= found.capacity <= TRUTH * (1 + 1e-9), found.interval()


def test_a_median_that_a_burst_meets_does_not_fool_it():
    """p50 TTFT <= 5 s: a hundred requests sent at once meet it (the median waits ~50 services, 2.5 s) at any
    rate, so the short runs hold everywhere. The long runs must be long enough for the queue's growth to show
    (steady.min_requests: 130 requests, not a median's 16), and the lattice must reach back down: the capacity
    is the service rate, within the growth the steady test allows (MAX_GROWTH: 5% behind what arrives)."""
    prober, short, found = capacity(QueueBackend(), parse_slas({"ttft": "p50:5s"}))
    assert short.capacity > 3 * TRUTH  # fooled, as short runs can only be: upward
    step = 1 + resolution_pct() / 100
    assert TRUTH / step <= found.capacity <= TRUTH / (1 - MAX_GROWTH), found.interval()
    # a short capacity 16 octaves above the pool's rate (a tune's hint can lead its search there): still found
    far = settle(prober, replace(short, capacity=2.0**16 * SPEC.rate, high=math.inf))
    assert TRUTH / step <= far.capacity <= TRUTH / (1 - MAX_GROWTH), far.interval()


def test_a_start_up_as_long_as_a_request_does_not_fool_a_median():
    """A server twice as fast until its first requests finish (each decodes 15 s after its first token), as a
    batch that is still filling serves faster: under a median SLA a long run must outlast that start-up before
    it shows anything held. Runs that ended inside it (pools of 520 requests: 13 s at 40 req/s) had held at
    twice the service rate."""
    _, short, found = capacity(QueueBackend(fast_until=15.0, decode_s=15.0), parse_slas({"ttft": "p50:150ms"}))
    assert short.capacity > 1.5 * TRUTH
    step = 1 + resolution_pct() / 100
    assert TRUTH / step <= found.capacity <= TRUTH * (1 + 1e-9), found.interval()
