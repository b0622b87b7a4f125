"""A tuned capacity holds when the run is made longer, and fails above it: the winner of a simulated tune, run
with `chunkbench run`'s engine loop at the reported capacity on ten times the tune's requests per probe, meets
the SLA (its percentile and the median scheduling delay bound); 15% above, it does not. Checked for the card's
tune (rag-mix, p99 TTFT <= 300 ms) and for another workload and SLA (chat, p99 TBT <= 30 ms). Fewer trials
than the card's 60, and the best of them alone settled on long runs (the card's tune settles three): the claim is
about the reported figure, not the search over knobs.

Near capacity one run's p99 is decided by rare bursts (at the card's capacity, four 3,000-request seeds gave
p99 TTFT 217-333 ms: docs/measurements/capacity.md), so the claim is about a typical run: the median over three
seeds holds at the capacity, and every seed fails 15% above."""

from __future__ import annotations

import json
import tomllib

import pytest
from chunkbench.engine.config import EngineConfig

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.runs import run_benchmark
from chunkbench.bench.slo import parse_slas, violations
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import run_cli

CASES = [
    ("rag-mix", {"ttft": "300ms"}),
    ("chat", {"tbt": "30ms"}),
]
TUNE_REQUESTS = 300
SEEDS = (0, 1, 2)


def held(summary: dict, slos) -> bool:
    return max(violations(summary, slos)) <= 0 and summary["median_scheduling_delay_ms"] <= 2000


@pytest.mark.slow
@pytest.mark.parametrize("workload,slas", CASES)
@pytest.mark.usefixtures("settle_one")
def test_the_tuned_capacity_holds_ten_times_longer_and_fails_15_percent_above(tmp_path, capsys, workload, slas):
    out = tmp_path / "tune"
    sla_flags = [f for name, value in slas.items() for f in (f"--sla-{name}", value)]
    args = ["tune", "--model", "llama-3-8b", "--workload", workload, *sla_flags, "--n-trials", "6"]
    code, _, err = run_cli([*args, "--num-requests", str(TUNE_REQUESTS), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    found = json.loads((out / "capacity.json").read_text())
    capacity, knobs = found["capacity_rps"], tomllib.loads((out / "recommended.toml").read_text())
    assert capacity > 0 and found["interval_rps"][0] <= capacity
    config = EngineConfig.create(**knobs["engine"])
    slos = parse_slas(slas)
    for rate in (capacity, 1.15 * capacity):
        summaries = []
        for seed in SEEDS:
            spec = WorkloadSpec(name=workload, num_requests=10 * TUNE_REQUESTS, rate=rate, seed=seed)
            requests = build_workload(spec, config.scheduler.max_model_len)
            summaries.append(
                run_benchmark(
                    config, requests, backend=SimBackend(gpu="h100-sxm"), progress=False, percentiles=[99.0]
                ).summary
            )
        figures = [{s.summary_key: round(m[s.summary_key]) for s in slos} for m in summaries]
        if rate == capacity:  # the median seed holds
            typical = sorted(summaries, key=lambda m: max(violations(m, slos)))[len(SEEDS) // 2]
            assert held(typical, slos), (rate, figures)
        else:
            assert not any(held(m, slos) for m in summaries), (rate, figures)
