"""Calibrate the simulator on the user's own server (`tune --presearch sim`, issue 18): launch it with a few
designed configurations and short workloads, measure per-request TTFT and ITL over HTTP, and fit the
roofline's free constants (sim/server_calibration.py) so that simulating those same runs gives the same
distributions.

The designs separate the cost terms: a *prefill* run (long prompts, a few tokens out, arriving together: TTFT
is a queue of compute-bound prefills -> the compute scale), a *decode* run (short prompts, answers of many
lengths: a batch that drains from a dozen to one, ITL at every batch size -> bandwidth and step overhead) and
a *mixed* run (prompts short to long at the space's smallest budget, so chunks share steps with decodes).

The fit: scipy least squares over log(flops_scale, bandwidth_scale, step_overhead_s) of relative errors,
per run, of the mean, median, p90 and p99 of TTFT and of ITL; where the server exposes vLLM's metrics, also
of its median queue time (vllm:request_queue_time_seconds) and its mean tokens per step
(vllm:iteration_tokens_total), at half weight. A coarse log grid picks the starting point (a discrete-event
simulation's percentiles are piecewise flat, so a local method alone can stall). The reported fit error is
the RMS relative error of the TTFT and ITL figures alone.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

from chunkbench.backends import Backend, SimBackend
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.spec import TuneSpec
from chunkbench.workload import WorkloadSpec, build_workload

STAT_PCTS = (50, 90, 99)
SERVER_WEIGHT = 0.5  # the server's own figures back the client's up; they are coarser (histogram buckets)
QUEUE_FLOOR_MS = 50.0  # relative error of a near-zero queue time means nothing: below this, absolute


@dataclass(frozen=True)
class Design:
    name: str
    knobs: dict  # engine keyword arguments on top of the tune's fixed flags
    workload: WorkloadSpec


def designs(spec: TuneSpec, num_requests: int = 8) -> list[Design]:
    """The three calibration runs for this tune. Every request arrives at once: the schedule then does not
    hinge on where an arrival falls against a step boundary, so the figures move smoothly with the constants
    (Poisson arrivals make the fit's objective jagged). Budgets come from the search space so the server
    accepts them; only the token budget varies (a --launch template may not pass other knobs through)."""
    budgets = sorted(spec.space.values.get("max_num_batched_tokens", [512]))
    max_len = spec.base_config().scheduler.max_model_len
    big = max([b for b in budgets if b <= 2048] or budgets[:1])
    long_prompt = max(64, min(1024, max_len // 2, big))

    def burst(n: int, prompt: str, output: str) -> WorkloadSpec:
        return WorkloadSpec(name="synthetic", num_requests=n, arrival="all-at-once", seed=spec.seed,
                            prompt_len=prompt, output_len=output)
    return [Design("prefill", {"max_num_batched_tokens": big},
                   burst(num_requests, f"uniform:{long_prompt // 4}:{long_prompt}", "fixed:4")),
            Design("decode", {"max_num_batched_tokens": big}, burst(num_requests + 4, "uniform:16:64", "uniform:16:96")),
            Design("mixed", {"max_num_batched_tokens": budgets[0]},
                   burst(num_requests + 2, f"uniform:16:{long_prompt}", "uniform:8:64"))]


def run_figures(result) -> dict:
    """Per-request TTFTs and pooled ITLs (ms) of one run, and the server's figures when it had any."""
    done = [r for r in result.requests if r.error is None and r.token_times]
    return {"ttft_ms": [1e3 * r.ttft for r in done], "itl_ms": [1e3 * g for r in done for g in r.itls],
            "server": dict(result.server or {})}


def measure_design(backend: Backend, spec: TuneSpec, design: Design) -> dict:
    """Run one design on the (launched) server: its figures, with the design to simulate it again."""
    config = spec.base_config(**design.knobs)
    workload = build_workload(design.workload, config.scheduler.max_model_len)
    with backend.session(config) as serve:
        result = serve(workload, seed=spec.seed, warmup_steps=0, progress=False, label=design.name)
    return {"name": design.name, "knobs": design.knobs, "workload": asdict(design.workload)} | run_figures(result)


def simulate_design(calibration: ServerCalibration, spec: TuneSpec, run: dict) -> dict:
    """The same run in the simulator under `calibration`, with the server-style figures it can give."""
    config = spec.base_config(**run["knobs"])
    workload = build_workload(WorkloadSpec(**run["workload"]), config.scheduler.max_model_len)
    with SimBackend(server_calibration=calibration).session(config) as serve:
        result = serve(workload, seed=spec.seed, warmup_steps=0, progress=False, label=run["name"])
    figures = run_figures(result)
    delays = [1e3 * (r.first_scheduled_time - r.arrival_time) for r in result.requests
              if r.first_scheduled_time is not None]
    tokens = [s.prefill_tokens + s.decode_tokens for s in result.steps] if result.steps else []
    figures["server"] = {"median_scheduling_delay_ms": float(np.median(delays)) if delays else 0.0,
                         "server_mean_step_tokens": float(np.mean(tokens)) if tokens else 0.0}
    return figures


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {"mean": float(array.mean())} | {f"p{p}": float(np.percentile(array, p)) for p in STAT_PCTS}


def residuals(measured: dict, simulated: dict) -> tuple[list[float], list[float]]:
    """(TTFT/ITL relative errors, server-figure errors) of one run."""
    main = []
    for key in ("ttft_ms", "itl_ms"):
        m, s = stats(measured[key]), stats(simulated[key])
        main += [(s.get(k, 0.0) - v) / v for k, v in m.items() if v > 0]
    extra = []
    server, sim_server = measured.get("server", {}), simulated.get("server", {})
    if "median_scheduling_delay_ms" in server:
        m = server["median_scheduling_delay_ms"]
        extra.append((sim_server["median_scheduling_delay_ms"] - m) / max(m, QUEUE_FLOOR_MS))
    if server.get("server_mean_step_tokens"):
        m = server["server_mean_step_tokens"]
        extra.append((sim_server["server_mean_step_tokens"] - m) / m)
    return main, extra


def fit(runs: list[dict], spec: TuneSpec, device: str = "cpu", server: str = "",
        num_blocks: int | None = None, grid: int = 4,
        max_evaluations: int = 300) -> ServerCalibration:
    """Least squares of the runs' relative errors over the three constants (module docstring)."""
    from scipy.optimize import minimize

    def calibration(x) -> ServerCalibration:
        return ServerCalibration(device, math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), spec.model, server,
                                 num_blocks)

    def vector(x, with_server: bool = True) -> np.ndarray:
        main, extra = [], []
        for run in runs:
            m, e = residuals(run, simulate_design(calibration(x), spec, run))
            main += m
            extra += e
        return np.asarray(main + ([SERVER_WEIGHT * v for v in extra] if with_server else []))

    x0 = _start(runs, spec, device, vector, grid)
    # Nelder-Mead, not a gradient method: percentiles of a discrete-event run are piecewise flat in the
    # constants, so finite differences often see no slope at all.
    solution = minimize(lambda x: float(np.sum(vector(x) ** 2)), x0, method="Nelder-Mead",
                        options={"xatol": 2e-3, "fatol": 1e-7, "maxfev": max_evaluations,
                                 "initial_simplex": x0 + 0.3 * np.vstack([np.zeros(3), np.eye(3)])})
    best = calibration(solution.x)
    errors = vector(solution.x, with_server=False)
    best.fit_error_pct = float(100 * math.sqrt(np.mean(errors ** 2))) if len(errors) else float("inf")
    best.max_error_pct = float(100 * np.max(np.abs(errors))) if len(errors) else float("inf")
    for run in runs:  # what the report plots: measured against fitted, per run
        simulated = simulate_design(best, spec, run)
        run["simulated"] = {k: simulated[k] for k in ("ttft_ms", "itl_ms", "server")}
    best.runs = runs
    return best


def _start(runs, spec, device, vector, grid: int) -> np.ndarray:
    """The best point of a coarse log grid around a first guess from the decode run's median ITL."""
    from chunkbench.sim.server_calibration import reference

    itls = [g for run in runs for g in run["itl_ms"]]
    median_itl_s = 1e-3 * (float(np.median(itls)) if itls else 30.0)
    ref, _ = reference(device)
    config = spec.base_config()
    weight_bytes = 2 * config.model.num_params
    bandwidth_scale = weight_bytes / (0.5 * median_itl_s) / ref.mem_bandwidth  # half the step streams weights
    flops_scale = bandwidth_scale * 0.5  # a machine's FLOP/byte is usually below the reference's
    centre = np.log([flops_scale, bandwidth_scale, 0.3 * median_itl_s])
    offsets = np.linspace(-1.5, 1.5, grid) if grid > 1 else [0.0]
    points = [centre + np.array(d) for d in itertools.product(offsets, repeat=3)]
    return min(points, key=lambda x: float(np.sum(vector(x) ** 2)))
