"""Fit a linear family (sim/linear_cost.py, sim/cpu_linear_cost.py) to a server's calibration runs
(tune/presearch/server.py): the families' fitters, fit_linear_family and fit_cpu_linear.

A linear cost needs no simulation per point tried, as the roofline's fit does: a run simulated once records each
step's features and each request's steps (a `Trace`), and while that schedule holds, any coefficients price every
step, TTFT, ITL and E2EL in one pass. fit_linear says how its rounds keep the schedule true; how much faster it
is: docs/guides/simulator.md ("Server calibration families"). The server's own /metrics figures are left out:
they are histogram buckets, and the client's figures pin the linear terms.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from chunkbench.launch.process import check_not_stopping
from chunkbench.sim.cost_family import Scored
from chunkbench.sim.linear_cost import LinearFamily
from chunkbench.sim.server_calibration import FIT_TOLERANCE_PCT, ServerCalibration
from chunkbench.tune.presearch.linear_rows import direct_estimate, stall_period
from chunkbench.tune.presearch.linear_trace import Trace, trace
from chunkbench.tune.presearch.runs import residuals, run_figures, simulate_run, targets
from chunkbench.tune.spec import TuneSpec

ROUNDS = 10  # re-simulate and refit at most this often
EVALUATIONS = 4000  # a round's descent's points at most
# Each round moves every coefficient by at most this factor (e^0.4, x1.5) from where its schedule was recorded:
# a run at its own arrivals priced far from there is wrong (a late request's place in the schedule moves)
TRUST = 0.4
WIDE_TRUST = 1.5  # the last descent, with the runs at their own arrivals simulated afresh: x4.5 either way
FRESH_EVALUATIONS = 800  # its points (each simulates those runs afresh)
FLOOR = 0.1  # a coefficient NNLS set to 0 starts at this share of its typical contribution (logs need > 0)
LINEAR_WITHOUT = ("fresh_pair_s", "first_pair_s")  # fit_cpu_linear's smaller model holds these at 0


def residual(run: dict, figures: dict, compared: list | None = None) -> np.ndarray:
    """presearch.server.fit's log ratios of the TTFT, ITL and E2EL figures (the server's figures left out); `compared`:
    the run's targets(), computed once for a descent's thousands of calls."""
    return np.asarray(residuals(run | {"server": {}}, figures, compared)[0])


def fit_linear(
    runs: list[dict],
    spec: TuneSpec,
    first: ServerCalibration,
    without: tuple[str, ...] = (),
    start: ServerCalibration | None = None,
) -> ServerCalibration:
    """The linear calibration that best reproduces `runs`. `first`: the linear calibration the first schedules
    are simulated under. `without`: step coefficients held at 0 (their features too). `start`: a calibration the
    first descent may start from too (a smaller model's fit: fit_cpu_linear).

    A recorded schedule prices any coefficients: end = max(previous end, release) + features . coefficients per
    step, the release being the latest arrival among the requests it admits. A burst's schedule hardly depends on
    the step times (everything arrived by the primer's step); a run at its own arrivals does: priced far from
    where it was recorded, its schedule is wrong. So each round moves the coefficients by at most a factor
    e^TRUST, then simulates every run afresh under them and records again, while the real objective improves by
    1% (ROUNDS at most); presearch.server.fit scores the answer by simulating every run once more. Start point:
    non-negative least squares over per-request rows (tune/presearch/linear_rows.py); then, per round,
    Nelder-Mead over the log coefficients (each in units of its typical contribution to a step) on the fit's own
    objective: the log ratios of the mean, median, p90 and p99 of TTFT, ITL and E2EL, per run."""
    family = first.cost_family
    assert isinstance(family, LinearFamily), family.name
    every = {"stall_every": stall_period(runs, spec, first)} if "stall_every" in family.settings else {}
    held = [family.step_terms.index(k) for k in without]

    def calibration(c: np.ndarray) -> ServerCalibration:
        return dataclasses.replace(
            first, coefficients=dict(zip(family.terms, c.tolist())) | dict.fromkeys(without, 0.0) | every
        )

    def traced(calibration: ServerCalibration, run: dict) -> Trace:
        recorded = trace(spec, calibration, run)
        recorded.features[:, held] = 0.0
        return recorded

    def simulated(c: np.ndarray, run: dict) -> float:  # afresh: the schedule free to move
        return float(np.sum(np.square(residual(run, run_figures(simulate_run(calibration(c), spec, run)[0])))))

    coefficients, begun = first.coefficients or {}, (start.coefficients or {}) if start is not None else None
    current, best, best_value = calibration(np.array([coefficients[k] for k in family.terms])), None, math.inf
    begin = None if begun is None else np.array([begun.get(k, 0.0) for k in family.terms])
    for _ in range(ROUNDS):  # every run priced on its recorded schedule, in a trust region
        traces = [traced(current, run) for run in runs]
        c, unit = _descend(family, traces, runs, best if best is not None else begin, TRUST, EVALUATIONS, held=held)
        value = sum(simulated(c, run) for run in runs)
        if value >= best_value * (1 - 1e-2):
            break
        best, best_value, current = c, value, calibration(c)
    if best is None:
        best = c
    # Then the runs at their own arrivals simulated afresh at every point (their schedules move with the step
    # times; the bursts' do not), in a wider region: the trust region's rounds can stop in a valley of the
    # recorded schedules that the real objective does not have.
    bursts = [run["workload"].get("arrival") == "all-at-once" for run in runs]
    traces = [traced(current, run) if burst else None for run, burst in zip(runs, bursts)]
    c, _ = _descend(
        family,
        traces,
        runs,
        best,
        WIDE_TRUST,
        FRESH_EVALUATIONS,
        lambda c, t, run: simulated(c, run) if t is None else None,
        held,
    )
    value = sum(simulated(c, run) for run in runs)
    return calibration(c if value < best_value else best)


def _descend(
    family: LinearFamily,
    traces: list,
    runs: list[dict],
    best: np.ndarray | None,
    trust: float,
    evaluations: int,
    fresh=None,
    held: list[int] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Nelder-Mead over the log coefficients (in units of their typical share of a step: a step's median seconds
    over the feature's mean), within `trust` of the start: the best of NNLS on the runs, `best`, and `best` with
    NNLS's value for each coefficient it has at 0 (a term a smaller model left out). A run
    whose trace is None is priced by `fresh(c, None, run)`; the others on their traces. The coefficients
    `held` (indices) stay 0, outside the search. `family`: whose terms the coefficients are."""
    from scipy.optimize import minimize

    compared = [targets(run) for run in runs]

    def value(c: np.ndarray) -> float:
        return float(
            sum(
                np.sum(np.square(residual(run, t.figures(c), own))) if t is not None else fresh(c, t, run)
                for t, run, own in zip(traces, runs, compared)
            )
        )

    recorded = [t for t in traces if t is not None]
    direct = direct_estimate(traces, runs) if all(t is not None for t in traces) else None
    hybrid = None if direct is None or best is None else np.where(best > 0, best, direct)
    candidates = [c for c in (direct, best, hybrid) if c is not None]
    free = np.ones(len(family.terms), dtype=bool)
    free[list(held)] = False
    candidates = [np.where(free, c, 0.0) for c in candidates]
    c = min(candidates, key=value) if len(candidates) > 1 else candidates[0]
    # the client terms (latency, jitter): once per token
    means = np.append(np.vstack([t.features for t in recorded]).mean(axis=0), (1.0,) * len(family.client_terms))
    typical = np.median(np.concatenate([t.features @ c[: len(family.step_terms)] for t in recorded])) or 1e-3
    unit = typical / np.where(means > 0, means, 1.0)
    start = np.log(np.maximum(c / unit, FLOOR))

    def coefficients(y: np.ndarray) -> np.ndarray:  # y: the free log coefficients
        x = start.copy()
        x[free] = y
        return np.where(free, np.exp(x) * unit, 0.0)

    def objective(y: np.ndarray) -> float:
        check_not_stopping()  # a fit takes a minute of CPU with no server to stop: SIGINT/SIGTERM end it here
        return 1e6 if np.any(np.abs(y - start[free]) > trust) else value(coefficients(y))

    n = int(free.sum())
    simplex = start[free] + 0.5 * min(trust, 1.0) * np.vstack([np.zeros(n), np.eye(n)])
    solution = minimize(
        objective,
        start[free],
        method="Nelder-Mead",
        options={"xatol": 1e-4, "fatol": 1e-10, "maxfev": evaluations, "adaptive": True, "initial_simplex": simplex},
    )
    return coefficients(solution.x), unit


def linear_guess(family: LinearFamily, runs: list[dict], device: str, meta: dict) -> ServerCalibration:
    """The calibration the first schedules are simulated under: the runs' median ITL, most of it per step (a
    burst's schedule does not depend on it; the fit re-simulates the others from its answer)."""
    itls = [g for run in runs for g in run["itl_ms"]]
    step = 1e-3 * (float(np.median(itls)) if itls else 30.0)
    guess = {
        "step_s": 0.6 * step,
        "prefill_step_s": 0.2 * step,
        "token_s": 0.005 * step,
        "pair_s": 1e-5 * step,
        "seq_s": 0.02 * step,
        "key_s": 1e-5 * step,
    }
    return ServerCalibration(device, **({"family": family.name} | meta), coefficients=guess)


def fit_linear_family(
    family: LinearFamily,
    runs: list[dict],
    spec: TuneSpec,
    device: str,
    meta: dict,
    score: Callable[[ServerCalibration], Scored],
    **_,
) -> Scored:
    """The `linear` family's fitter (CostFamily.fitter): fit_linear from linear_guess, scored."""
    return score(fit_linear(runs, spec, linear_guess(family, runs, device, meta)))


def fit_cpu_linear(
    family: LinearFamily,
    runs: list[dict],
    spec: TuneSpec,
    device: str,
    meta: dict,
    score: Callable[[ServerCalibration], Scored],
    **_,
) -> Scored:
    """The `linear-cpu` family's fitter: without the first-touch memory terms (LINEAR_WITHOUT), then with them,
    starting also from where the smaller model ended (the descent that starts those terms where their few steps
    weigh most can end in a valley the smaller model does not have). Kept: one a presearch would trust
    (ServerCalibration.fits), then one within FIT_TOLERANCE_PCT over its runs too, then the fuller one if both
    are, else the lower judged error. Not the lower error over the runs: the runs leave a token's cost and an
    attention pair's apart unpinned, so a workload of other first chunks is an extrapolation, which the fuller
    model makes from the workload run's own first chunks. On a server without such a cost the fuller fit invents
    one (tests/tune/test_calibrate_server.py). Measured: docs/guides/simulator.md ("Server calibration
    families")."""
    guess = linear_guess(family, runs, device, meta)
    smaller = score(fit_linear(runs, spec, guess, without=LINEAR_WITHOUT))
    fuller = score(fit_linear(runs, spec, guess, start=smaller[0]))
    return min(
        (fuller, smaller),
        key=lambda c: (  # min keeps the first of equals: the fuller
            not c[0].fits,
            (c[0].fit_error_pct or 0.0) > FIT_TOLERANCE_PCT,
            0.0 if c[0].fits else c[0].judged_error_pct,
        ),
    )
