"""The simulator describes a real vLLM. Calibrate on the tier's vLLM 0.32 CPU server (the four launched
runs of `tune --presearch sim`), then predict a workload none of them ran, at a budget none of them used, and
launch vLLM to measure it (HELD_OUT_LAUNCHES launches between the calibration's, HELD_OUT_PASSES passes on each,
pooled, as simulated in as many sessions): median TTFT, p99 ITL and output throughput within
BOUNDS. The line it prints gives the figures and the held-out's median ITL, measured and simulated
(the server's speed).

How it has fared, launch by launch and in CI, and why the bounds are what they are:
docs/measurements/server-calibration-held-out.md. The bursts must queue behind their primer as designed: a primer
that finished before its burst was sent voids a burst's figures."""

from __future__ import annotations

import pytest
from chunkbench.engine.knobs import VLLM_CPU_VERSION

from chunkbench.backends.launched import LaunchBackend
from chunkbench.backends.sim import SimBackend
from chunkbench.bench.metrics import summarize
from chunkbench.bench.slo import parse_slas
from chunkbench.files import write_json
from chunkbench.servers.vllm import VLLM
from chunkbench.tune.presearch import server as cal
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.conftest import free_port
from tests.vllm.conftest import VLLM_CLI, VLLM_FIXED_FLAGS, vllm_env

HELD_OUT_TOLERANCE = 0.15  # the agreement the simulator is held to
# What the test asserts: 15% on the output throughput and the fit, 20% on the two latencies. The p99 ITL
# is a 40-request tail: refitted offline, thirteen calibrations predicted it -15.6% to +3.9% (one beyond 15%),
# nineteen fresh runs -11.2% to +6.0% but CI's +16.5% (docs/measurements/server-calibration-held-out.md). The median
# TTFT follows the server's speed, which moves between the calibration's runs and the held-out's on this 2-core VM (the
# held-out's median ITL measured 1.70-2.58 ms across eighteen runs, and within one run from pass to pass 1.98-3.01 ms):
# of nineteen fresh runs, seventeen predicted it within 15% (-14.5% to +12.4%), one at -15.0% (its held-out measured at
# slower moments than its calibration), CI's at +19.9% (its workload run caught the server at 2.80 ms against the decode
# run's 2.07). 15% there would fail CI now and then on the host's noise, not on a regression. The printed line shows the
# figures against 15%.
BOUNDS = {"median_ttft_ms": 0.20, "p99_itl_ms": 0.20, "output_throughput": HELD_OUT_TOLERANCE}
# What the calibration runs (the tune's workload: chat, 12 requests at 6/s; budgets 256, 1536 and 2048) did not:
# uniform prompt lengths of up to two 512-token chunks, at 8/s, 40 requests, at budget 512 (in the space).
HELD_OUT = WorkloadSpec(
    name="synthetic", num_requests=40, rate=8.0, prompt_len="uniform:32:1024", output_len="uniform:16:128", seed=7
)
HELD_OUT_BUDGET = 512
# Served on this many launches, this many times in a row on each (other prompts each time), the figures pooled,
# as simulated in a session a launch. One pass's figures moved 6-8% between passes on a launch (median TTFT
# 29.7-34.0 ms, p99 ITL 14.9-17.2 ms; scripts/vllm_step_log.py --design held-out --passes 4): a
# 40-request median and p99 are noisy; and a launch can slow down for a while (the module docstring).
HELD_OUT_LAUNCHES, HELD_OUT_PASSES = 3, 3
FIGURES = ("median_ttft_ms", "p99_itl_ms", "output_throughput")


@pytest.fixture
def vllm_environment(monkeypatch):
    for key, value in vllm_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def pooled(passes, endpoint: bool | None = None) -> dict:
    """The figures of a workload's passes (backend results) as one run's: their requests together, their durations
    summed (the passes' clocks overlap, so per-second peaks are not; FIGURES do not use them)."""
    return summarize(
        [r for p in passes for r in p.requests],
        [s for p in passes for s in p.steps],
        sum(p.duration for p in passes),
        endpoint=endpoint,
    )


def tune_spec(model: str, backend) -> TuneSpec:
    space, _ = SearchSpace.load("default").for_server(VLLM, VLLM_CPU_VERSION)
    workload = WorkloadSpec(**{**space.workload, "name": "chat", "num_requests": 12, "rate": 6.0})
    return TuneSpec(
        model=model,
        slos=parse_slas({"ttft": "5s", "tbt": None, "tpot": None, "e2el": None}, 99.0),
        space=space,
        workload=workload,
        backend=backend,
        n_trials=1,
    )


def tier_launch() -> LaunchBackend:
    """The tier's `vllm serve` as a tune's launch template, on a free port (the tune sets --max-model-len)."""
    port = free_port()
    flags = [f for f in VLLM_FIXED_FLAGS if f not in ("--max-model-len", "2048")]
    return LaunchBackend(
        " ".join(
            [str(VLLM_CLI), "serve", "{model}", "{vllm_flags}", "--port", str(port), "--host", "127.0.0.1", *flags]
        ),
        f"http://127.0.0.1:{port}/v1",
        versions={"vllm": VLLM_CPU_VERSION},
    )


@pytest.mark.timing  # simulated figures against measured ones, to a margin
def test_a_calibrated_simulator_predicts_a_held_out_workload_on_vllm(tiny_model, tmp_path, vllm_environment):
    launch = tier_launch()
    spec = tune_spec(str(tiny_model), launch)
    config = spec.base_config(max_num_batched_tokens=HELD_OUT_BUDGET)
    workload = build_workload(HELD_OUT, config.scheduler.max_model_len)

    def held_out(backend, k: int, log=None) -> list:
        """The held-out's passes on the k-th server of its own, warmed up as the calibration runs are
        (presearch.runs.warm_up: a fresh server's first large steps cost what no step cost describes)."""
        with backend.session(config, log=log) as serve:
            cal.warm_up(serve, config, seed=1)
            return [
                serve(workload, seed=spec.seed + 2 * (HELD_OUT_PASSES * k + j), warmup_steps=0, progress=False)
                for j in range(HELD_OUT_PASSES)
            ]

    # the held-out's launches between the calibration's, so that a server slower for a while slows both alike
    designs, runs, measured = cal.designs(spec), [], []
    for step in ["held-out", *designs[:2], "held-out", *designs[2:], "held-out"]:  # HELD_OUT_LAUNCHES
        if step == "held-out":
            k = len(measured) // HELD_OUT_PASSES
            measured += held_out(launch, k, tmp_path / f"held-out-{k}" / "launch.log")
        else:
            runs.append(cal.measure_design(launch, spec, step, tmp_path / step.name / "launch.log"))
    calibration = cal.fit(runs, spec, "cpu", launch.launch)
    calibration.save(tmp_path / "calibration.json")  # its runs, measured and fitted, for a look after
    assert not [run["name"] for run in runs if cal.primer_outran_burst(run)]  # else a burst arrived at an idle server
    assert HELD_OUT_BUDGET not in [run["knobs"]["max_num_batched_tokens"] for run in runs]
    assert HELD_OUT_BUDGET in spec.space.values["max_num_batched_tokens"]
    simulated = [p for k in range(HELD_OUT_LAUNCHES) for p in held_out(SimBackend(server_calibration=calibration), k)]
    assert all(r.ok for p in measured for r in p.requests)
    assert [len(p.requests) for p in measured] == [HELD_OUT.num_requests] * HELD_OUT_LAUNCHES * HELD_OUT_PASSES
    m, s = pooled(measured, endpoint=True), pooled(simulated)
    write_json(
        {
            "measured": m,
            "simulated": s,  # for a look after, with each pass's requests
            "passes": [
                {"measured": cal.run_figures(a), "simulated": cal.run_figures(b)} for a, b in zip(measured, simulated)
            ],
        },
        tmp_path / "held-out" / "figures.json",
    )
    errors = {k: s[k] / m[k] - 1 for k in FIGURES}
    # the server's speed on the held-out's launches against the calibration's: its median ITL (a few sequences a
    # step), measured and simulated
    speed = f"median ITL measured {m['median_itl_ms']:.2f} ms, simulated {s['median_itl_ms']:.2f} ms"
    print(
        f"held-out workload on vLLM: {calibration.label()}; "
        + ", ".join(f"{k} measured {m[k]:.2f} simulated {s[k]:.2f} ({100 * errors[k]:+.1f}%)" for k in FIGURES)
        + f"; {speed}; beyond 15%: "
        + (", ".join(k for k, e in errors.items() if abs(e) > HELD_OUT_TOLERANCE) or "none")
    )
    assert calibration.family == "linear"
    assert calibration.fit_error_pct <= 100 * HELD_OUT_TOLERANCE  # over its runs
    # measured, five runs: median TTFT -8.1%, +12.4%, -2.8%, +4.2%, +2.3%; p99 ITL -10.2%,
    # -8.9%, -6.8%, +0.1%, +1.7%; output throughput -0.0%, -1.4%, -0.5%, -1.0%, -0.3%
    missed = {k: e for k, e in errors.items() if abs(e) > BOUNDS[k]}
    assert not missed, (
        "held-out figures beyond their bounds (BOUNDS): "
        + ", ".join(f"{k} {100 * e:+.0f}%" for k, e in missed.items())
        + f" (calibration fit error {calibration.fit_error_pct:.1f}%, "
        f"{calibration.workload_error_pct:.1f}% on its workload run; {speed})"
    )
