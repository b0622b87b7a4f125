"""Fit the linear step cost (sim/linear_cost.py) to a server's calibration runs (tune/calibrate.py).

The roofline's fit simulates every run afresh for every point it tries (~0.1 s a run, ~1,000 points: 456 s on
the tier's vLLM runs). A linear cost does not need that. Simulate a run once and record, per step, its features
and the latest arrival among the requests it admits; per request, the steps that gave its tokens. While that
schedule holds, any coefficients price every step's end in one pass, end = max(previous end, release) +
features . coefficients, and from the ends every TTFT, ITL and E2EL (a `Trace`). A burst's schedule hardly
depends on the step times (everything arrived by the primer's step). A run at its own arrivals does: priced far
from where it was recorded, its schedule is wrong, so each round moves the coefficients by at most a factor
e^TRUST, then simulates every run afresh under them and records again, while the real objective improves by 1%
(ROUNDS at most). calibrate.fit scores the answer by simulating every run once more.

Start point: non-negative least squares over per-request sums of step features, in relative error: each
request's decode span (E2EL - TTFT: the steps after its first token up to its last) and its TTFT (the steps
from the engine's last start after idling up to its first token, plus the client latency; the jitter is left
to the descent). Then, per round,
Nelder-Mead over the log coefficients (each in units of its typical contribution to a step) on calibrate.fit's
own objective: the log ratios of the mean, median, p90 and p99 of TTFT, ITL and E2EL, per run. The server's own
/metrics figures are left out here: they are histogram buckets, and the client's figures pin the linear terms.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chunkbench.sim.linear_cost import COEFFICIENTS, NEW_STEP, SEQUENCES, STALL, STEP_COEFFICIENTS
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.calibration_runs import residuals, run_figures, simulate_run, targets
from chunkbench.tune.linear_trace import Trace, trace
from chunkbench.tune.spec import TuneSpec

ROUNDS = 10  # re-simulate and refit at most this often
STALL_RATIO = 1.4  # stall_period: a decode gap this many times the decode run's median is a stalled step
MAX_STALL_PERIOD = 30  # stall_period: a decode run's longest request stalled in fewer gaps: none modelled
MIN_STALL_GAPS = 20  # stall_period: a longest request with fewer gaps tells nothing
MIN_DECODE_GAPS = 5  # decode_rows: a request with fewer lone decode gaps gives no row
BUNCHED = 0.2  # decode_rows: a gap below this share of the run's median is tokens sent together
# Each round moves every coefficient by at most this factor (e^0.4, x1.5) from where its schedule was recorded:
# a run at its own arrivals priced far from there is wrong (measured: steps 2x slower than recorded held a late
# request behind 50 steps it would have joined, TTFT 335 ms against 20 simulated).
TRUST = 0.4
WIDE_TRUST = 1.5  # the last descent, with the runs at their own arrivals simulated afresh: x4.5 either way
FRESH_EVALUATIONS = 800  # its points (each simulates those runs: ~10 ms for 32 requests)
FLOOR = 0.1  # a coefficient NNLS set to 0 starts at this share of its typical contribution (logs need > 0)


def request_rows(t: Trace, run: dict) -> tuple[list[np.ndarray], list[float]]:
    """Per request, (summed features, measured seconds) of its decode span and of its TTFT (module docstring).
    A burst's TTFTs are matched by rank (its requests are alike: which one the server took first the client
    cannot see); spans and a run at its own arrivals by request."""
    rows, targets = [], []
    n = len(t.token_steps)
    if len(run["ttft_ms"]) != n or len(run["e2el_ms"]) != n:  # a request failed: no request-by-request match
        return rows, targets
    # the step features summed over steps, and the client latency (in a TTFT once, in a decode span never)
    cumulative = np.vstack([np.zeros(t.features.shape[1]), np.cumsum(t.features, axis=0)])
    releases = np.flatnonzero(t.idle)
    burst = run["workload"].get("arrival") == "all-at-once"
    ttft_rank = np.argsort(np.argsort([s[0] for s in t.token_steps], kind="stable"), kind="stable")
    measured_ttft = sorted(run["ttft_ms"]) if burst else None
    for j, steps in enumerate(t.token_steps):
        i = t.measured_order[j]
        span = 1e-3 * (run["e2el_ms"][i] - run["ttft_ms"][i])
        if len(steps) > 1 and span > 0:
            rows.append(np.append(cumulative[steps[-1] + 1] - cumulative[steps[0] + 1], (0.0, 0.0)))
            targets.append(span)
        first = steps[0]
        k = releases[np.searchsorted(releases, first, side="right") - 1]
        ttft = 1e-3 * (measured_ttft[ttft_rank[j]] if burst else run["ttft_ms"][i])
        target = ttft + t.arrivals[j] - t.release[k]
        if target > 0:
            rows.append(np.append(cumulative[first + 1] - cumulative[k], (1.0, 0.0)))
            targets.append(target)
    decode, seconds = decode_rows(t, run)
    return rows + decode, targets + seconds


def request_gaps(t: Trace, run: dict) -> list[np.ndarray | None]:
    """Per simulated request, its measured gaps (ms, in order) where it got one per simulated token, else None:
    a stream the server merged (vLLM sends the tokens a stream has not sent yet as one chunk: 2-15% of the
    workload runs' tokens on the tier's vLLM, 2026-12-05) has fewer gaps, and which tokens went together the
    client cannot see. Split by the run's per-request `itl_counts`; a run recorded without them (before
    2026-12-05) only when no request merged, when the pooled count says where each request's gaps begin."""
    lengths = {t.measured_order[j]: len(steps) for j, steps in enumerate(t.token_steps)}
    counts = run.get("itl_counts") or [lengths[i] - 1 for i in range(len(lengths))]
    if len(counts) != len(lengths) or sum(counts) != len(run["itl_ms"]):
        return [None] * len(lengths)  # a request failed, or a run without counts merged somewhere
    gaps, offsets = np.asarray(run["itl_ms"]), np.concatenate(([0], np.cumsum(counts)))
    return [gaps[offsets[i]:offsets[i + 1]] if counts[i] == lengths[i] - 1 else None
            for i in (t.measured_order[j] for j in range(len(t.token_steps)))]


def decode_rows(t: Trace, run: dict) -> tuple[list[np.ndarray], list[float]]:
    """Per request, its mean decode step: the mean features of the decode-only steps that each made one of its
    gaps alone, against the mean of those gaps measured, stalls left out on both sides (a gap STALL_RATIO times
    the run's median, a step the simulator stalls). What pins the fixed step against the per-sequence term: the
    TTFT and span rows sum many steps of many batch sizes. A request whose stream merged gives none
    (request_gaps)."""
    if not run["itl_ms"]:
        return [], []
    median = 1e-3 * float(np.median(run["itl_ms"]))
    # below BUNCHED of the median: tokens the server sent together after a pause (measured: 0.0-0.01 ms gaps
    # behind a 0.5 s one on a loaded machine), not a step
    slow, bunched = STALL_RATIO * median, BUNCHED * median
    rows, targets = [], []
    for steps, measured in zip(t.token_steps, request_gaps(t, run)):
        if measured is None:
            continue
        own = 1e-3 * measured
        keep = [k for k in range(1, len(steps)) if steps[k] == steps[k - 1] + 1 and bunched < own[k - 1] < slow
                and not t.features[steps[k], 1] and not t.features[steps[k], STALL]
                and not t.features[steps[k], NEW_STEP]]
        if len(keep) >= MIN_DECODE_GAPS:
            rows.append(np.append(t.features[[steps[k] for k in keep]].mean(axis=0), (0.0, 0.0)))
            targets.append(float(np.mean([own[k - 1] for k in keep])))
    return rows, targets


def direct_estimate(traces: list[Trace], runs: list[dict]) -> np.ndarray | None:
    """Non-negative least squares of the per-request rows, each weighted by 1/its measured seconds."""
    from scipy.optimize import nnls

    rows, targets = [], []
    for t, run in zip(traces, runs):
        r, y = request_rows(t, run)
        rows += r
        targets += y
    if len(rows) < len(COEFFICIENTS):
        return None
    x, y = np.asarray(rows), np.asarray(targets)
    usable = (y > 0) & np.isfinite(y) & np.all(np.isfinite(x), axis=1)
    x, y = x[usable], y[usable]
    if len(y) < len(COEFFICIENTS):
        return None
    x, scale = x / y[:, None], np.abs(x / y[:, None]).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients, _ = nnls(x / scale, np.ones(len(y)), maxiter=50 * x.shape[1])
    return coefficients / scale


def residual(run: dict, figures: dict, compared: list | None = None) -> np.ndarray:
    """calibrate.fit's log ratios of the TTFT, ITL and E2EL figures (the server's figures left out); `compared`:
    the run's targets(), computed once for a descent's thousands of calls."""
    return np.asarray(residuals(run | {"server": {}}, figures, compared)[0])


def stall_period(runs: list[dict], spec: TuneSpec, first: ServerCalibration) -> int:
    """How many sequences stepped between stalls (sim/linear_cost.py, `stall_s`), from the decode run's longest
    request whose stream did not merge (request_gaps): after its first token it took (nearly) every step of the
    run, each a decode of a batch that only shrinks (a dozen to one: 2.2-2.7 ms a step on the tier's vLLM), so a
    gap STALL_RATIO times its median or more is a stall; the steps' sequences come from the run simulated under
    `first`. 0 (none) below one stalled gap in MAX_STALL_PERIOD."""
    run = next((r for r in runs if r["name"] == "decode"), None)
    if run is None:
        return 0
    t = trace(spec, first, run)
    known = [(len(steps), j, gaps) for j, (steps, gaps) in enumerate(zip(t.token_steps, request_gaps(t, run)))
             if gaps is not None and len(gaps) >= MIN_STALL_GAPS]
    if not known:  # every long stream merged (on the tier's vLLM, 12 of a decode burst's 13), or a request failed
        return 0
    _, j, gaps = max(known, key=lambda k: k[:2])  # the longest whose stream did not merge
    steps = t.token_steps[j]
    # a gap ending at a step of a batch size new to the session is slow for that reason (sim/linear_cost.py)
    slow = (gaps >= STALL_RATIO * np.median(gaps)) & (t.features[steps[1:], NEW_STEP] == 0)
    stalled = int(np.sum(slow))
    if stalled < len(gaps) / MAX_STALL_PERIOD or not stalled:
        return 0
    return max(1, int(round(t.features[steps[0] + 1:steps[-1] + 1, SEQUENCES].sum() / stalled)))


def fit_linear(runs: list[dict], spec: TuneSpec, first: ServerCalibration, max_evaluations: int = 4000,
               without: tuple[str, ...] = (), start: ServerCalibration | None = None) -> ServerCalibration:
    """The linear calibration that best reproduces `runs` (module docstring). `first`: the linear calibration
    the first schedules are simulated under. `without`: step coefficients held at 0 (their features too).
    `start`: a calibration the first descent may start from too (a smaller model's fit: calibrate.fit)."""
    every = stall_period(runs, spec, first)
    held = [STEP_COEFFICIENTS.index(k) for k in without]

    def calibration(c: np.ndarray) -> ServerCalibration:
        return dataclasses.replace(first, family="linear", coefficients=dict(zip(COEFFICIENTS, c.tolist()))
                                   | dict.fromkeys(without, 0.0) | {"stall_every": every})

    def traced(calibration: ServerCalibration, run: dict) -> Trace:
        recorded = trace(spec, calibration, run)
        recorded.features[:, held] = 0.0
        return recorded

    def simulated(c: np.ndarray, run: dict) -> float:  # afresh: the schedule free to move
        return float(np.sum(np.square(residual(run, run_figures(simulate_run(calibration(c), spec, run)[0])))))

    current, best, best_value = calibration(np.array([first.coefficients[k] for k in COEFFICIENTS])), None, math.inf
    begin = None if start is None else np.array([start.coefficients.get(k, 0.0) for k in COEFFICIENTS])
    for _ in range(ROUNDS):  # every run priced on its recorded schedule, in a trust region
        traces = [traced(current, run) for run in runs]
        c, unit = _descend(traces, runs, best if best is not None else begin, TRUST, max_evaluations, held=held)
        value = sum(simulated(c, run) for run in runs)
        if value >= best_value * (1 - 1e-2):
            break
        best, best_value, current = c, value, calibration(c)
    if best is None:
        best = c
    # Then the runs at their own arrivals simulated afresh at every point (their schedules move with the step
    # times; the bursts' do not), in a wider region: the trust region's rounds stop in a valley of the
    # recorded schedules (measured on the tier's vLLM: objective 2.5 where a point at x1.8 the fixed step,
    # a quarter of the per-sequence term gave 0.58).
    bursts = [run["workload"].get("arrival") == "all-at-once" for run in runs]
    traces = [traced(current, run) if burst else None for run, burst in zip(runs, bursts)]
    c, _ = _descend(traces, runs, best, WIDE_TRUST, FRESH_EVALUATIONS,
                    lambda c, t, run: simulated(c, run) if t is None else None, held)
    value = sum(simulated(c, run) for run in runs)
    return calibration(c if value < best_value else best)


def _descend(traces: list, runs: list[dict], best: np.ndarray | None, trust: float, evaluations: int,
             fresh=None, held: list[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Nelder-Mead over the log coefficients (in units of their typical share of a step: a step's median seconds
    over the feature's mean), within `trust` of the start: the best of NNLS on the runs, `best`, and `best` with
    NNLS's value for each coefficient it has at 0 (a term a smaller model left out). A run
    whose trace is None is priced by `fresh(c, None, run)`; the others on their traces. The coefficients
    `held` (indices) stay 0, outside the search."""
    from scipy.optimize import minimize

    compared = [targets(run) for run in runs]

    def value(c: np.ndarray) -> float:
        return float(sum(np.sum(np.square(residual(run, t.figures(c), own))) if t is not None else fresh(c, t, run)
                         for t, run, own in zip(traces, runs, compared)))
    recorded = [t for t in traces if t is not None]
    direct = direct_estimate(traces, runs) if all(t is not None for t in traces) else None
    hybrid = None if direct is None or best is None else np.where(best > 0, best, direct)
    candidates = [c for c in (direct, best, hybrid) if c is not None]
    free = np.ones(len(COEFFICIENTS), dtype=bool)
    free[list(held)] = False
    candidates = [np.where(free, c, 0.0) for c in candidates]
    c = min(candidates, key=value) if len(candidates) > 1 else candidates[0]
    # the latency and the jitter: once per token
    means = np.append(np.vstack([t.features for t in recorded]).mean(axis=0), (1.0, 1.0))
    typical = np.median(np.concatenate([t.features @ c[:len(STEP_COEFFICIENTS)] for t in recorded])) or 1e-3
    unit = typical / np.where(means > 0, means, 1.0)
    start = np.log(np.maximum(c / unit, FLOOR))

    def coefficients(y: np.ndarray) -> np.ndarray:  # y: the free log coefficients
        x = start.copy()
        x[free] = y
        return np.where(free, np.exp(x) * unit, 0.0)

    def objective(y: np.ndarray) -> float:
        return 1e6 if np.any(np.abs(y - start[free]) > trust) else value(coefficients(y))

    n = int(free.sum())
    simplex = start[free] + 0.5 * min(trust, 1.0) * np.vstack([np.zeros(n), np.eye(n)])
    solution = minimize(objective, start[free], method="Nelder-Mead", options={
        "xatol": 1e-4, "fatol": 1e-10, "maxfev": evaluations, "adaptive": True, "initial_simplex": simplex})
    return coefficients(solution.x), unit
