"""vllm bench serve's ramp-up (--ramp-up-strategy, its start and end rates) and probes (--probe-request-rate):
send times whose right answer is a formula, and probes against a fake server whose timing is known."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from chunkbench.errors import UserError
from chunkbench.workloads.arrivals import vllm_arrivals
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import free_port, run_cli

SLOW_SERVER = Path(__file__).resolve().parent.parent / "tune" / "slow_server.py"


@pytest.mark.parametrize(
    "strategy, rates", [("linear", np.linspace(1.0, 10.0, 19)), ("exponential", 1.0 * 16.0 ** (np.arange(19) / 18))]
)
def test_a_ramp_sends_each_request_at_its_own_rate(strategy, rates):
    """With constant gaps (infinite burstiness) request i is due at the sum of 1/rate_j for j <= i."""
    due = vllm_arrivals(19, 1.0, float("inf"), 0, (strategy, 1.0, 10.0 if strategy == "linear" else 16.0))
    assert due == pytest.approx(np.cumsum(1.0 / rates), rel=1e-12)


def test_a_ramped_workload_speeds_up_and_is_checked():
    spec = WorkloadSpec(
        name="synthetic",
        num_requests=200,
        arrival="vllm",
        ramp_up_strategy="linear",
        ramp_up_start_rps=1.0,
        ramp_up_end_rps=20.0,
        seed=3,
    )
    arrivals = np.array([r.arrival_time for r in build_workload(spec)])
    gaps = np.diff(arrivals)
    assert gaps[:50].mean() > 3 * gaps[-50:].mean()  # ~1/2.2 s early, ~1/18 s late
    with pytest.raises(UserError, match="needs --ramp-up-start-rps"):
        build_workload(WorkloadSpec(name="synthetic", ramp_up_strategy="linear"))
    with pytest.raises(UserError, match="must be one of linear, exponential"):
        build_workload(WorkloadSpec(name="synthetic", ramp_up_strategy="steps", ramp_up_start_rps=1, ramp_up_end_rps=2))


def test_probes_beside_the_load_are_counted_and_timed(tmp_path, capsys):
    """A server that streams a token every 20 ms: a probe (one token) takes ~20 ms; at 10 probes/s, one at a
    time with a 0.1 s pause after each, a run of ~2 s holds about 2 / 0.12 of them."""
    port, events = free_port(), tmp_path / "events"
    server = subprocess.Popen(
        [sys.executable, str(SLOW_SERVER), "--port", str(port), "--token-ms", "20", "--events", str(events)]
    )
    try:
        while not events.exists():
            time.sleep(0.05)
        code, stdout, err = run_cli(
            [
                "bench",
                "--endpoint",
                f"http://127.0.0.1:{port}/v1",
                "--workload",
                "synthetic",
                "--prompt-len",
                "fixed:16",
                "--output-len",
                "fixed:20",
                "--num-requests",
                "10",
                "--rate",
                "8",
                "--probe-request-rate",
                "10",
                "--out",
                str(tmp_path / "out"),
                "--save-result",
                "--result-dir",
                str(tmp_path),
                "--result-filename",
                "r.json",
            ],
            capsys,
        )
    finally:
        server.terminate()
        server.wait()
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    expected = summary["duration"] / (0.020 + 0.1)
    assert summary["probe_failed"] == 0 and 0.6 * expected <= summary["probe_completed"] <= expected + 2
    assert 20 <= summary["probe_median_e2el_ms"] <= 60  # one token at 20 ms, plus the loopback's few ms
    assert summary["probe_median_e2el_ms"] <= summary["probe_max_e2el_ms"]
    assert json.loads((tmp_path / "r.json").read_text())["probe_completed"] == summary["probe_completed"]
    assert "probes: " in stdout
