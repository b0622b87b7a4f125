"""Calibrate the simulator on the user's own server (`tune --presearch sim`, issue 18): launch it with a few
designed configurations and short workloads, measure per-request TTFT, ITL and E2EL over HTTP, and fit the
roofline's free constants (sim/server_calibration.py) so that simulating those same runs gives the same
distributions.

The designs separate the cost terms: a *prefill* run (long prompts, a few tokens out, arriving together: TTFT
is a queue of compute-bound prefills -> the compute scale), a *decode* run (short prompts, answers of many
lengths: a batch that drains from a dozen to one, ITL at every batch size -> bandwidth and step overhead) and
a *mixed* run (prompts of up to three chunks at the space's smallest budget, so chunks share steps with
decodes), and a *workload* run: the tune's own workload (its first WORKLOAD_REQUESTS requests, at their own
arrivals) at the space's middle budget, so the constants also fit the load the trials will run at.

A burst is built so that what the client cannot see does not matter. Its prompts are all one length, so the
order in which the server took them (measured on `chunkbench serve`: a mixed burst sent in order 0..9 was
served 3..9 first, then 0..2) cannot change its figures. And a *primer* goes first, a long prompt (up to a
step of the design's budget) with one token out, PRIMER_LEAD_S ahead of the burst: the burst arrives while the
server is busy with it and joins the queue behind it together (without it, the server's first step caught
however many requests had arrived by then: three of a decode burst of twelve in one measured run, all twelve
in another). A server fast enough to finish the primer before the burst is sent is told so
(`primer_outran_burst`).

The fit: least squares over log(flops_scale, bandwidth_scale, step_overhead_s, seq_overhead_s) of relative
errors (as log ratios), per run, of the mean, median, p90 and p99 of TTFT, ITL and E2EL; where the server
exposes vLLM's metrics, also of its median queue time (vllm:request_queue_time_seconds) and its mean tokens
per step (vllm:iteration_tokens_total), at half weight. The best point of a coarse log grid starts a Nelder-Mead
search (percentiles of a discrete-event run are piecewise flat, so finite-difference gradients often see no
slope). Each run is simulated with the arrivals the server saw (the client's send times). The reported fit
error is the RMS relative error of the TTFT, ITL and E2EL figures alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from chunkbench.backends import Backend, SimBackend
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.spec import TuneSpec
from chunkbench.workload import WorkloadRequest, WorkloadSpec, build_workload

STAT_PCTS = (50, 90, 99)
BOX = 6.0  # the fit stays within e^6 (x400) of its first guess: beyond, no real server
SERVER_WEIGHT = 0.5  # the server's own figures back the client's up; they are coarser (histogram buckets)
QUEUE_FLOOR_MS = 50.0  # relative error of a near-zero queue time means nothing: below this, absolute
WORKLOAD_REQUESTS = 32  # the fourth calibration run: at most this many of the tune's own requests
DRIFT_TOLERANCE = 0.15  # drift_check: a server this much slower or faster than when calibrated is warned about
PRIMER_LEAD_S = 0.02  # a burst follows its primer by this much: longer than the client's spread of sends (~8 ms)


@dataclass(frozen=True)
class Design:
    name: str
    knobs: dict  # engine keyword arguments on top of the tune's fixed flags
    workload: WorkloadSpec
    # The prefill run's ITLs are bimodal (a gap behind a 2k-token prefill step, or a plain decode step) with a
    # couple of dozen gaps in all: its percentiles jump between the modes, so it is fitted without them (its E2EL,
    # the TTFT plus three such gaps, is mostly the TTFT, and is fitted).
    # E2EL (first send to last token) is what a run's duration, and so goodput, hangs on: pooled ITL
    # percentiles are mostly the big batches' gaps, a request's end also counts its last, small-batch steps.
    fitted: tuple[str, ...] = ("ttft_ms", "itl_ms", "e2el_ms")
    take: int | None = None  # run the workload's first `take` requests (None: all it builds)
    primer: int = 0  # a burst's primer: a request of this many prompt tokens, one out, PRIMER_LEAD_S ahead


def design_requests(workload: dict, take: int | None, primer: int, max_model_len: int) -> list[WorkloadRequest]:
    """A design's requests (its fields as recorded in a run): the workload, cut, behind its primer."""
    requests = build_workload(WorkloadSpec(**workload), max_model_len)[:take]
    if not primer:
        return requests
    return [WorkloadRequest(primer, 1, 0.0)] + [dataclasses.replace(w, arrival_time=w.arrival_time + PRIMER_LEAD_S)
                                                 for w in requests]


def designs(spec: TuneSpec, num_requests: int = 8) -> list[Design]:
    """The four calibration runs for this tune. In the three designed ones every request arrives at once,
    behind its primer: the schedule then does not hinge on where an arrival falls against a step boundary, so
    the figures move smoothly with the constants (Poisson arrivals make the fit's objective jagged; the workload
    run adds them back, anchored by the three). Budgets come from the search space so the server
    accepts them; only the token budget varies (a --launch template may not pass other knobs through)."""
    budgets = sorted(spec.space.values.get("max_num_batched_tokens", [512]))
    max_len = spec.base_config().scheduler.max_model_len
    big = max([b for b in budgets if b <= 2048] or budgets[:1])
    long_prompt = max(64, min(1024, max_len // 2, big))

    def burst(n: int, prompt: str, output: str) -> WorkloadSpec:
        return WorkloadSpec(name="synthetic", num_requests=n, arrival="all-at-once", seed=spec.seed,
                            prompt_len=prompt, output_len=output)
    # The tune's own workload, its first requests at its own arrivals, at the space's middle budget: the load
    # the trials will see. Bursts alone fitted a per-step overhead that was too high at light load (measured:
    # simulated p99 TTFT 3.3 s against 2.0 s on the verified configuration).
    # Built whole, then cut: a synthetic workload of fewer requests would draw other lengths and arrivals.
    # Mixed: prompts of up to three of the smallest budget's chunks, sharing steps with the decodes of the prompts
    # before them; one output length, so the order of the burst cannot matter.
    mixed_prompt = max(16, min(long_prompt, 3 * budgets[0]))
    return [Design("prefill", {"max_num_batched_tokens": big}, burst(num_requests, f"fixed:{long_prompt}", "fixed:4"),
                   ("ttft_ms", "e2el_ms"), primer=long_prompt),
            Design("decode", {"max_num_batched_tokens": big}, burst(num_requests + 4, "fixed:32", "uniform:16:96"),
                   primer=long_prompt),
            Design("mixed", {"max_num_batched_tokens": budgets[0]}, burst(num_requests + 2, f"fixed:{mixed_prompt}",
                                                                          "fixed:32"), primer=long_prompt),
            Design("workload", {"max_num_batched_tokens": budgets[len(budgets) // 2]}, spec.workload,
                   take=WORKLOAD_REQUESTS)]


def primer_outran_burst(run: dict) -> bool:
    """The run's primer got its token before its burst's last request was sent: the server was idle when
    the burst came, and its first step may have caught only part of it (the client cannot see which)."""
    sends, ttfts = run.get("send_s") or [], run["ttft_ms"]
    return bool(run.get("primer")) and bool(sends) and bool(ttfts) and ttfts[0] < 1e3 * (max(sends) - sends[0])


def run_figures(result) -> dict:
    """Per-request TTFTs and E2ELs and pooled ITLs (ms) of one run, and the server's figures when it had any."""
    done = [r for r in result.requests if r.error is None and r.token_times]
    return {"ttft_ms": [1e3 * r.ttft for r in done], "itl_ms": [1e3 * g for r in done for g in r.itls],
            "e2el_ms": [1e3 * r.e2el for r in done],
            "server": dict(result.server or {}),
            "send_s": [r.arrival_time if r.send_time is None else r.send_time for r in result.requests]}


def measure_design(backend: Backend, spec: TuneSpec, design: Design, log: Path | None = None) -> dict:
    """Run one design on the (launched) server: its figures, with the design to simulate it again. `log`:
    where a launched server's output goes."""
    config = spec.base_config(**design.knobs)
    with backend.session(config, log=log) as serve:
        return run_design(serve, spec, design, config.scheduler.max_model_len)


def run_design(serve, spec: TuneSpec, design: Design, max_model_len: int) -> dict:
    """Run one design on a session's server."""
    workload = design_requests(asdict(design.workload), design.take, design.primer, max_model_len)
    result = serve(workload, seed=spec.seed, warmup_steps=0, progress=False, label=design.name)
    return {"name": design.name, "knobs": design.knobs, "workload": asdict(design.workload), "take": design.take,
            "primer": design.primer, "fitted": list(design.fitted)} | run_figures(result)


def drift_check(backend: Backend, spec: TuneSpec, calibrated: dict) -> dict | None:
    """Is the server as fast as when it was calibrated? The calibration's decode run again, as recorded, on a
    launch of its own (the same configuration, and like it the first run on a fresh server: on `chunkbench
    serve` the first run of a launch is the slowest, so a check after other runs reads a warm server against
    a cold one: x0.75-0.89 in four tunes here). Its median ITL now over then is the server's change of speed (a
    host or GPU that slowed down, a neighbour), measured, with no model in between. None when a run has no
    ITLs."""
    design = Design("decode", calibrated["knobs"], WorkloadSpec(**calibrated["workload"]),
                    tuple(calibrated.get("fitted", ())), calibrated.get("take"), calibrated.get("primer", 0))
    now = measure_design(backend, spec, design)
    if not now["itl_ms"] or not calibrated.get("itl_ms"):
        return None
    then_ms, now_ms = float(np.median(calibrated["itl_ms"])), float(np.median(now["itl_ms"]))
    return {"median_itl_ms_calibrated": then_ms, "median_itl_ms_now": now_ms, "ratio": now_ms / then_ms}


def simulate_design(calibration: ServerCalibration, spec: TuneSpec, run: dict) -> dict:
    """The same run in the simulator under `calibration`, with the server-style figures it can give."""
    config = spec.base_config(**run["knobs"])
    workload = design_requests(run["workload"], run.get("take"), run.get("primer", 0), config.scheduler.max_model_len)
    if len(run.get("send_s", ())) == len(workload) and run["workload"].get("arrival") != "all-at-once":
        # Simulate the arrivals the server saw (the client's send times), not the ones the workload planned.
        # Not for a burst: its sends spread over a few milliseconds, and which of them the server's steps
        # caught the client cannot see; a burst is simulated as designed (its primer, then the burst at once).
        first = min(run["send_s"])
        workload = sorted((dataclasses.replace(w, arrival_time=t - first) for w, t in zip(workload, run["send_s"])),
                          key=lambda w: w.arrival_time)
    with SimBackend(server_calibration=calibration).session(config) as serve:
        result = serve(workload, seed=spec.seed, warmup_steps=0, progress=False, label=run["name"])
    figures = run_figures(result)
    delays = [1e3 * (r.first_scheduled_time - r.arrival_time) for r in result.requests
              if r.first_scheduled_time is not None]
    tokens = [s.prefill_tokens + s.decode_tokens for s in result.steps]
    # The client's untimed warm-up (request 0's lengths, alone) is inside the server's counters: count its
    # steps (whole-budget prefill chunks, then one token a step) and tokens here too.
    first = workload[0] if workload else None
    warm_steps = -(-first.prompt_len // config.scheduler.max_num_batched_tokens) + first.output_len - 1 if first else 0
    warm_tokens = first.prompt_len + first.output_len - 1 if first else 0
    figures["server"] = {"median_scheduling_delay_ms": float(np.median(delays)) if delays else 0.0,
                         "server_mean_step_tokens": (sum(tokens) + warm_tokens) / max(1, len(tokens) + warm_steps)}
    return figures


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {"mean": float(array.mean())} | {f"p{p}": float(np.percentile(array, p)) for p in STAT_PCTS}


def relative(simulated: float, measured: float) -> float:
    """log(simulated / measured): the relative error near zero, but symmetric, so 10x too slow does not weigh
    nine times 10x too fast (which would let one bimodal percentile steer the whole fit)."""
    return math.log(max(simulated, 1e-9) / measured)


def residuals(measured: dict, simulated: dict) -> tuple[list[float], list[float]]:
    """(TTFT/ITL/E2EL relative errors, server-figure errors) of one run."""
    main = []
    for key in measured.get("fitted", ("ttft_ms", "itl_ms")):
        m, s = stats(measured[key]), stats(simulated[key])
        main += [relative(s.get(k, 0.0), v) for k, v in m.items() if v > 0]
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
        num_blocks: int | None = None, grid: int = 3,
        max_evaluations: int = 500, restarts: int = 4) -> ServerCalibration:
    """Least squares of the runs' relative errors over the four constants (module docstring)."""
    from scipy.optimize import minimize

    def calibration(x) -> ServerCalibration:
        return ServerCalibration(device, *np.exp(x).tolist(), model=spec.model, server=server, num_blocks=num_blocks)

    def vector(x, with_server: bool = True, only=None) -> np.ndarray:
        if box is not None and np.any(np.abs(x - box) > BOX):  # outside: constants no server has
            return np.full(len(reference_vector), 1e3)
        main, extra = [], []
        for run in only or runs:
            m, e = residuals(run, simulate_design(calibration(x), spec, run))
            main += m
            extra += e
        return np.asarray(main + ([SERVER_WEIGHT * v for v in extra] if with_server else []))

    def descend(x, only=None):
        """Nelder-Mead from x. The valley between bandwidth and the two overheads is long and narrow: it
        shrinks its simplex before it reaches the bottom, so it restarts from where it stopped while that helps."""
        value = float("inf")
        for _ in range(restarts):
            solution = minimize(lambda x: float(np.sum(vector(x, only=only) ** 2)), x, method="Nelder-Mead",
                                options={"xatol": 1e-3, "fatol": 1e-9, "maxfev": max_evaluations,
                                         "initial_simplex": x + 0.3 * np.vstack([np.zeros(len(x)), np.eye(len(x))])})
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
    def rms_pct(errors) -> float:
        return float(100 * math.sqrt(np.mean(errors ** 2))) if len(errors) else float("inf")

    best = calibration(x)
    errors = np.expm1(vector(x, with_server=False))  # back to (simulated - measured) / measured
    best.fit_error_pct = rms_pct(errors)
    best.max_error_pct = float(100 * np.max(np.abs(errors))) if len(errors) else float("inf")
    own = [run for run in runs if run["name"] == "workload"]
    if own:
        best.workload_error_pct = rms_pct(np.expm1(vector(x, with_server=False, only=own)))
    for run in runs:  # what the report plots: measured against fitted, per run
        simulated = simulate_design(best, spec, run)
        run["simulated"] = {k: simulated[k] for k in ("ttft_ms", "itl_ms", "e2el_ms", "server")}
    best.runs = runs
    return best


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
