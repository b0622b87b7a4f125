"""Issue 31: the simulator describes a real vLLM. Calibrate on the tier's vLLM 0.32 CPU server (the four launched
runs of `tune --presearch sim`), then predict a workload none of them ran, at a budget none of them used, and
launch vLLM to measure it (HELD_OUT_PASSES times on the launch, pooled, as simulated in one session): median
TTFT, p99 ITL and output throughput within HELD_OUT_TOLERANCE. The line it prints gives the figures and the
held-out's median ITL, measured and simulated (the server's speed on that launch).

Measured: until 2026-12-05's afternoon the server ran its model on two OpenMP threads (tests/vllm/env.py says
why and why no more), and the test passed in 21 of 45 runs, an expected failure in the others: the held-out's
median ITL moved 2.0-6.3 ms from launch to launch, and the calibrations fitted their own runs with 4-22% error.
With one thread, 10 runs fitted with 3.6-6.2% error, and 9 predicted all three figures within 15% (7 within
10%; the tenth's median TTFT +18.9%, its median ITL simulated 29% high: docs/measurements.md, "One OpenMP
thread"). The bursts must queue behind their primer as designed: a primer that finished before its burst
was sent voids a burst's figures."""

from __future__ import annotations

import pytest

from chunkbench.backends import SimBackend
from chunkbench.launch import LaunchBackend
from chunkbench.metrics import summarize
from chunkbench.outputs import write_json
from chunkbench.slo import parse_slas
from chunkbench.tune import calibrate as cal
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workload import WorkloadSpec, build_workload
from tests.conftest import free_port
from tests.vllm.conftest import VLLM_CLI, VLLM_FIXED_FLAGS, vllm_env

HELD_OUT_TOLERANCE = 0.15  # issue 31's acceptance
# What the calibration runs (the tune's workload: chat, 12 requests at 6/s; budgets 256, 1536 and 2048) did not:
# uniform prompt lengths of up to two 512-token chunks, at 8/s, 40 requests, at budget 512 (in the space).
HELD_OUT = WorkloadSpec(name="synthetic", num_requests=40, rate=8.0, prompt_len="uniform:32:1024",
                        output_len="uniform:16:128", seed=7)
HELD_OUT_BUDGET = 512
# Served this many times in a row on its launch (other prompts each time), the figures pooled, as simulated in one
# session. One pass's figures moved 6-8% between passes on a launch (median TTFT 29.7-34.0 ms, p99 ITL 14.9-17.2
# ms; 2026-12-05, scripts/vllm_step_log.py --design held-out --passes 4): a 40-request median and p99 are noisy.
HELD_OUT_PASSES = 3
FIGURES = ("median_ttft_ms", "p99_itl_ms", "output_throughput")


@pytest.fixture
def vllm_environment(monkeypatch):
    for key, value in vllm_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def pooled(passes, endpoint: bool | None = None) -> dict:
    """The figures of a workload's passes (backend results) as one run's: their requests together, their durations
    summed (the passes' clocks overlap, so per-second peaks are not; FIGURES do not use them)."""
    return summarize([r for p in passes for r in p.requests], [s for p in passes for s in p.steps],
                     sum(p.duration for p in passes), endpoint=endpoint)


def tune_spec(model: str, backend) -> TuneSpec:
    space, _ = SearchSpace.load("default").for_vllm()
    workload = WorkloadSpec(**{**space.workload, "name": "chat", "num_requests": 12, "rate": 6.0})
    return TuneSpec(model=model, slos=parse_slas({"ttft": "5s", "tbt": None, "tpot": None, "e2el": None}, 99.0),
                    space=space, workload=workload, backend=backend, n_trials=1)


def tier_launch() -> LaunchBackend:
    """The tier's `vllm serve` as a tune's launch template, on a free port (the tune sets --max-model-len)."""
    port = free_port()
    flags = [f for f in VLLM_FIXED_FLAGS if f not in ("--max-model-len", "2048")]
    return LaunchBackend(" ".join([str(VLLM_CLI), "serve", "{model}", "{vllm_flags}", "--port", str(port),
                                   "--host", "127.0.0.1", *flags]), f"http://127.0.0.1:{port}/v1")


def test_a_calibrated_simulator_predicts_a_held_out_workload_on_vllm(tiny_model, tmp_path, vllm_environment):
    launch = tier_launch()
    spec = tune_spec(str(tiny_model), launch)
    runs = [cal.measure_design(launch, spec, d, tmp_path / d.name / "launch.log") for d in cal.designs(spec)]
    calibration = cal.fit(runs, spec, "cpu", launch.launch)
    calibration.save(tmp_path / "calibration.json")  # its runs, measured and fitted, for a look after
    assert not [run["name"] for run in runs if cal.primer_outran_burst(run)]  # else a burst arrived at an idle server
    assert HELD_OUT_BUDGET not in [run["knobs"]["max_num_batched_tokens"] for run in runs]
    assert HELD_OUT_BUDGET in spec.space.values["max_num_batched_tokens"]

    config = spec.base_config(max_num_batched_tokens=HELD_OUT_BUDGET)
    workload = build_workload(HELD_OUT, config.scheduler.max_model_len)
    with launch.session(config, log=tmp_path / "held-out" / "launch.log") as serve:
        # warmed up as the calibration runs were (calibration_runs.warm_up): a fresh server's first large
        # steps cost what no step cost describes
        cal.warm_up(serve, config, seed=1)
        measured = [serve(workload, seed=spec.seed + 2 * k, progress=False) for k in range(HELD_OUT_PASSES)]
    with SimBackend(server_calibration=calibration).session(config) as serve:  # the same session: its warm-up
        cal.warm_up(serve, config, seed=1)  # ran the token counts the server has not paid for since (linear_cost)
        simulated = [serve(workload, seed=spec.seed + 2 * k, warmup_steps=0, progress=False)
                     for k in range(HELD_OUT_PASSES)]
    assert all(r.ok for p in measured for r in p.requests)
    assert [len(p.requests) for p in measured] == [HELD_OUT.num_requests] * HELD_OUT_PASSES
    m, s = pooled(measured, endpoint=True), pooled(simulated)
    write_json({"measured": m, "simulated": s,  # for a look after, with each pass's requests
                "passes": [{"measured": cal.run_figures(a), "simulated": cal.run_figures(b)}
                           for a, b in zip(measured, simulated)]}, tmp_path / "held-out" / "figures.json")
    errors = {k: s[k] / m[k] - 1 for k in FIGURES}
    # the server's speed on the held-out's launch against the calibration's: its median ITL (a few sequences a
    # step) moved 2.0-6.3 ms from launch to launch while the server ran two OpenMP threads, and the misses
    # followed it (docs/measurements.md, "The server's speed")
    speed = f"median ITL measured {m['median_itl_ms']:.2f} ms, simulated {s['median_itl_ms']:.2f} ms"
    print(f"held-out workload on vLLM: {calibration.label()}; "
          + ", ".join(f"{k} measured {m[k]:.2f} simulated {s[k]:.2f} ({100 * errors[k]:+.1f}%)" for k in FIGURES)
          + f"; {speed}")
    assert calibration.family == "linear"
    assert calibration.fit_error_pct <= 100 * HELD_OUT_TOLERANCE  # over its runs, issue 31's other bound
    # measured with one OpenMP thread (2026-12-05): median TTFT +8.5%, +9.7%, +7.2%, -6.0%, +1.6%, +6.4%, -9.4%,
    # +13.8%, +1.4%, +18.9% (a failure); p99 ITL +2.8%, +2.0%, +1.3%, -9.4%, -5.7%, -7.4%, -0.9%, +9.1%, +13.1%,
    # +10.3%; output throughput within 1.8%
    missed = {k: e for k, e in errors.items() if abs(e) > HELD_OUT_TOLERANCE}
    assert not missed, ("held-out figures beyond 15%: " + ", ".join(f"{k} {100 * e:+.0f}%" for k, e in missed.items())
                        + f" (calibration fit error {calibration.fit_error_pct:.1f}%, "
                        f"{calibration.workload_error_pct:.1f}% on its workload run; {speed})")
