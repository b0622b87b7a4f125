"""Fit the `roofline` family (sim/roofline_family.py) to a server's calibration runs (tune/presearch/server.py): its
fitter, fit_roofline.

Least squares over log(flops_scale, bandwidth_scale, step_overhead_s, seq_overhead_s) of relative errors (as log
ratios), per run, of the mean, median, p90 and p99 of TTFT, ITL and E2EL; where the server exposes vLLM's metrics,
also of its median queue time (vllm:request_queue_time_seconds) and its mean tokens per step
(vllm:iteration_tokens_total), at half weight. The best point of a coarse log grid starts a Nelder-Mead search
(percentiles of a discrete-event run are piecewise flat, so finite-difference gradients often see no slope). Each
run is simulated with the arrivals the server saw (the client's send times).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from chunkbench.launch.process import check_not_stopping
from chunkbench.sim.cost_family import CostFamily, Scored
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.presearch.runs import residuals, simulate_design
from chunkbench.tune.spec import TuneSpec

BOX = 6.0  # the fit stays within e^6 (x400) of its first guess: beyond, no real server
SERVER_WEIGHT = 0.5  # the server's own figures back the client's up; they are coarser (histogram buckets)


def fit_roofline(
    family: CostFamily,
    runs: list[dict],
    spec: TuneSpec,
    device: str,
    meta: dict,
    score: Callable[[ServerCalibration], Scored],
    grid: int = 3,
    max_evaluations: int = 500,
    restarts: int = 4,
) -> Scored:
    """The `roofline` family's fitter (CostFamily.fitter), scored: _fit_roofline."""
    return score(_fit_roofline(runs, spec, device, meta, grid, max_evaluations, restarts))


def _fit_roofline(
    runs: list[dict], spec: TuneSpec, device: str, meta: dict, grid: int, max_evaluations: int, restarts: int
) -> ServerCalibration:
    """The roofline's four constants: a coarse log grid, then Nelder-Mead on the simulated runs."""
    from scipy.optimize import minimize

    def calibration(x) -> ServerCalibration:
        return ServerCalibration(device, *np.exp(x).tolist(), **meta)

    def vector(x, only=None) -> np.ndarray:
        check_not_stopping()  # each point simulates the runs: SIGINT/SIGTERM end the fit here (server_linear's)
        if box is not None and np.any(np.abs(x - box) > BOX):  # outside: constants no server has
            return np.full(len(reference_vector), 1e3)
        main, extra = [], []
        for run in only or runs:
            m, e = residuals(run, simulate_design(calibration(x), spec, run))
            main += m
            extra += e
        return np.asarray(main + [SERVER_WEIGHT * v for v in extra])

    def descend(x, only=None):
        """Nelder-Mead from x. The valley between bandwidth and the two overheads is long and narrow: it
        shrinks its simplex before it reaches the bottom, so it restarts from where it stopped while that helps."""
        value = float("inf")
        for _ in range(restarts):
            solution = minimize(
                lambda x: float(np.sum(vector(x, only=only) ** 2)),
                x,
                method="Nelder-Mead",
                options={
                    "xatol": 1e-3,
                    "fatol": 1e-9,
                    "maxfev": max_evaluations,
                    "initial_simplex": x + 0.3 * np.vstack([np.zeros(len(x)), np.eye(len(x))]),
                },
            )
            improved = solution.fun < 0.99 * value
            x, value = solution.x, min(value, solution.fun)
            if not improved:
                break
        return x

    box = None
    reference_vector = vector(_guess(runs, spec, device))
    box = _guess(runs, spec, device)
    # First the bursts alone (their objective is smooth: the grid and Nelder-Mead find its valley), then every
    # run from there: the Poisson arrivals of the workload run make the objective jagged far from the bottom.
    bursts = [run for run in runs if run["workload"].get("arrival") == "all-at-once"] or None
    x = descend(_start(box, lambda x: vector(x, only=bursts), grid), bursts)
    if bursts is not None and len(bursts) < len(runs):
        x = descend(x)
    return calibration(x)


def _guess(runs, spec, device) -> np.ndarray:
    """A first guess (log constants) from the runs' median ITL: half of a step streams the weights."""
    from chunkbench.sim.server_calibration import reference

    itls = [g for run in runs for g in run["itl_ms"]]
    median_itl_s = 1e-3 * (float(np.median(itls)) if itls else 30.0)
    ref, _ = reference(device)
    weight_bytes = 2 * spec.base_config().model.num_params
    bandwidth_scale = weight_bytes / (0.5 * median_itl_s) / ref.mem_bandwidth
    flops_scale = bandwidth_scale * 0.5  # a machine's FLOP/byte is usually below the reference's
    return np.log([flops_scale, bandwidth_scale, 0.3 * median_itl_s, 0.02 * median_itl_s])


def _start(centre: np.ndarray, vector, grid: int) -> np.ndarray:
    """The best point of a coarse log grid around the first guess."""
    offsets = np.linspace(-1.5, 1.5, grid) if grid > 1 else [0.0]
    points = [centre + np.array(d) for d in itertools.product(offsets, repeat=len(centre))]
    return min(points, key=lambda x: float(np.sum(vector(x) ** 2)))
