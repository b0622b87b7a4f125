"""Calibrate the simulator on the user's own server (`tune --presearch sim`): launch it with a few designed
configurations and short workloads, measure per-request TTFT, ITL and E2EL over HTTP, and fit a cost-model
family's free constants (sim/families.py; the roofline's fitter in tune/presearch/roofline.py, the linear
families' in tune/presearch/linear.py) so that simulating those same runs gives the same distributions. The
designs, the warm-up before each and their simulation: tune/presearch/runs.py. The reported fit error is the
RMS relative error of the TTFT, ITL and E2EL figures alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from chunkbench.bench.backend import Backend
from chunkbench.sim import families
from chunkbench.sim.server_calibration import ServerCalibration

# Re-exported: search.py, report.py and the tests take the runs' names from here.
from chunkbench.tune.presearch.runs import (  # noqa: F401
    PRIMER_LEAD_S,
    WORKLOAD_REQUESTS,
    Design,
    design_requests,
    designs,
    from_burst_end,
    primer_outran_burst,
    residuals,
    run_figures,
    simulate_design,
    stats,
    warm_up,
    warmup_requests,
)
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadSpec

PAUSE_RATIO, PAUSE_MIN_MS, BUNCHED_SHARE = 20.0, 100.0, 0.02  # server_paused
LATE_GAP_MS, LATE_SHARE, LATE_MIN_GAPS = 0.05, 0.25, 100  # server_paused: a stream read in bunches all along
PAUSE_REMEASURES = 4  # a calibration run with a server pause (or unsteady) is measured again this many times at most
# unsteady: the copies of a repeated workload run (runs.design_requests) whose summed E2ELs differ by
# more than this factor caught the server changing speed within the run (copies_spread)
STEADY_RATIO = 1.15
DRIFT_TOLERANCE = 0.15  # drift_check: a server this much slower or faster than when calibrated is warned about


def measure_design(backend: Backend, spec: TuneSpec, design: Design, log: Path | None = None) -> dict:
    """Run one design on the (launched) server: its figures, with the design to simulate it again. `log`:
    where a launched server's output goes."""
    config = spec.base_config(**design.knobs)
    with backend.session(config, log=log) as serve:
        return run_design(serve, spec, design, config.scheduler.max_model_len)


def run_design(serve, spec: TuneSpec, design: Design, max_model_len: int) -> dict:
    """Run one design on a session's server, after its warm-up (warmup_requests; `warmed_up`: whether the server
    served all of it, else the run is simulated without one). A run that paused (server_paused) or, repeating
    its workload, was served unsteadily (copies_spread) is measured again."""
    warmed_up = warm_up(serve, spec.base_config(**design.knobs), spec.seed + 1, f"{design.name} warm-up")
    workload = design_requests(asdict(design.workload), design.take, design.primer, max_model_len, design.repeat)
    copy = len(design_requests(asdict(design.workload), None, 0, max_model_len)) if design.repeat else 0
    # (paused, a paused one's share of gaps at 0, spread beyond STEADY_RATIO, longest gap, figures): the bunched
    # share orders paused attempts only, else it would outrank steadiness among unpaused ones
    attempts = []
    for attempt in range(1 + PAUSE_REMEASURES):  # another seed: other prompt ids, no prefix-cache hits
        figures = run_figures(
            serve(workload, seed=spec.seed + 2 * attempt, warmup_steps=0, progress=False, label=design.name)
        )
        spread, paused = copies_spread(figures, copy), server_paused(figures)
        attempts.append(
            (
                paused,
                late_share(figures["itl_ms"]) if paused else 0.0,
                max(spread, STEADY_RATIO),
                max(figures["itl_ms"], default=0.0),
                (from_burst_end(figures) if design.primer else figures) | {"copies_spread": spread},
            )
        )
        if not paused and spread <= STEADY_RATIO:
            break
    # unpaused first, else the least bunched; of those, steady, else the least unsteady; then the shortest longest gap
    kept = min(range(len(attempts)), key=lambda k: attempts[k][:4])
    paused, *_, figures = attempts[kept]
    return {
        "name": design.name,
        "knobs": design.knobs,
        "workload": asdict(design.workload),
        "take": design.take,
        "primer": design.primer,
        "repeat": design.repeat,
        "fitted": list(design.fitted),
        "tails": list(design.tails),
        "warmed_up": warmed_up,
        "attempt": kept,
        "paused_runs": sum(a[0] for a in attempts),
        "unsteady_runs": sum(a[2] > STEADY_RATIO for a in attempts),
        "paused": paused,
    } | figures


def copy_sums(figures: dict, copy: int) -> list[float]:
    """Each copy's summed E2EL (ms) in a repeated workload run (copy: requests in one; runs.design_requests),
    over the requests every copy has (the last copy may be cut short); [] for a run of one copy or with failed
    requests."""
    sends, e2el = figures["send_s"], figures["e2el_ms"]
    if not copy or len(e2el) != len(sends) or len(sends) < 2 * copy:
        return []
    in_order = np.asarray(e2el)[np.argsort(sends, kind="stable")]
    shared = len(sends) % copy or copy
    return [float(in_order[k : k + shared].sum()) for k in range(0, len(sends) - shared + 1, copy)]


def copies_spread(figures: dict, copy: int) -> float:
    """How far the copies of a repeated workload run (copy: requests in one) disagree: the largest over the
    smallest of their summed E2ELs (copy_sums); 1.0 for a run of one copy or with failed requests. The same
    requests at the same gaps, so a steady server serves them alike (the first copy also meets token counts new
    to the server, which the simulator prices). STEADY_RATIO, measured: docs/guides/simulator.md ("Server
    calibration families") and docs/measurements/ (server calibration)."""
    sums = copy_sums(figures, copy)
    return max(sums) / min(sums) if sums and min(sums) > 0 else 1.0


def server_paused(figures: dict) -> bool:
    """The server stopped streaming for a while and then sent what it had made together: a gap PAUSE_RATIO
    times the run's mean gap and PAUSE_MIN_MS or more, and BUNCHED_SHARE of the gaps under a fifth of the mean.
    No step cost describes that. Such a run is measured again on its launch, up to PAUSE_REMEASURES times: the
    first without a pause is kept, else the least bunched (late_share), then the one whose longest gap is
    shortest. Also a run of LATE_MIN_GAPS gaps or more whose stream came in bunches all along, LATE_SHARE of
    its gaps under LATE_GAP_MS (late_share), a long gap or not (a prefill run's couple of dozen gaps are too few
    for it). The thresholds, measured: docs/guides/simulator.md ("Server calibration families")."""
    gaps = np.asarray(figures["itl_ms"])
    if len(gaps) < 20:
        return False
    mean = float(np.mean(gaps))  # not the median: after a long pause most gaps may be near zero
    return (
        float(gaps.max()) >= max(PAUSE_MIN_MS, PAUSE_RATIO * mean)
        and float(np.mean(gaps < 0.2 * mean)) >= BUNCHED_SHARE
    ) or (len(gaps) >= LATE_MIN_GAPS and late_share(gaps) >= LATE_SHARE)


def late_share(gaps) -> float:
    """The share of a run's gaps (ms) under LATE_GAP_MS: tokens read together (server_paused)."""
    return float(np.mean(np.asarray(gaps) < LATE_GAP_MS)) if len(gaps) else 0.0


def drift_check(backend: Backend, spec: TuneSpec, calibrated: dict) -> dict | None:
    """Is the server as fast as when it was calibrated? The calibration's decode run again, as recorded, on a
    launch of its own (the same configuration, and like it the first run on a fresh server: the first run of a
    launch is the slowest, so a check after other runs would read a warm server against a cold one). Its
    median ITL now over then is the server's change of speed (a
    host or GPU that slowed down, a neighbour), measured, with no model in between. None when a run has no
    ITLs, or a median ITL of 0 (a stream read in bunches: server_paused)."""
    design = Design(
        "decode",
        calibrated["knobs"],
        WorkloadSpec(**calibrated["workload"]),
        tuple(calibrated.get("fitted", ())),
        calibrated.get("take"),
        calibrated.get("primer", 0),
    )
    now = measure_design(backend, spec, design)
    if not now["itl_ms"] or not calibrated.get("itl_ms"):
        return None
    then_ms, now_ms = float(np.median(calibrated["itl_ms"])), float(np.median(now["itl_ms"]))
    if then_ms <= 0 or now_ms <= 0:
        return None
    return {"median_itl_ms_calibrated": then_ms, "median_itl_ms_now": now_ms, "ratio": now_ms / then_ms}


def fit(
    runs: list[dict],
    spec: TuneSpec,
    device: str = "cpu",
    server: str = "",
    num_blocks: int | None = None,
    grid: int = 3,
    max_evaluations: int = 500,
    restarts: int = 4,
    family: str = families.AUTO,
) -> ServerCalibration:
    """The constants of a cost-model family (sim/families.py; AUTO: the device's, families.fit_name) that best
    reproduce the runs, fitted by the family's fitter and scored by simulating every run again (module
    docstring). The fit's speed and error per family: docs/guides/simulator.md ("Server calibration
    families")."""
    name = families.fit_name(family, device)
    meta = dict(family=name, model=spec.model, server=server, num_blocks=num_blocks or served_kv_blocks(runs, spec))

    def errors(only, simulated: dict) -> np.ndarray:  # (simulated - measured) / measured of TTFT/ITL/E2EL figures
        return np.expm1(np.asarray([e for run in only for e in residuals(run, simulated[run["name"]])[0]]))

    def rms_pct(errors) -> float:
        return float(100 * math.sqrt(np.mean(errors**2))) if len(errors) else float("inf")

    def scored(calibration: ServerCalibration) -> tuple[ServerCalibration, dict]:
        simulated = {run["name"]: simulate_design(calibration, spec, run) for run in runs}
        every = errors(runs, simulated)
        calibration.fit_error_pct = rms_pct(every)
        calibration.max_error_pct = float(100 * np.max(np.abs(every))) if len(every) else float("inf")
        own = [run for run in runs if run["name"] == "workload"]
        if own:
            calibration.workload_error_pct = rms_pct(errors(own, simulated))
        return calibration, simulated

    best, simulated = families.resolve(name, device).fit(
        runs, spec, device, meta, scored, grid=grid, max_evaluations=max_evaluations, restarts=restarts
    )
    for run in runs:  # what the report plots: measured against fitted, per run
        run["simulated"] = {k: simulated[run["name"]][k] for k in ("ttft_ms", "itl_ms", "e2el_ms", "server")}
    best.runs = runs
    return best


def served_kv_blocks(runs: list[dict], spec: TuneSpec) -> int | None:
    """The server's KV cache in the simulator's blocks, where its /metrics said how many tokens it holds
    (server_metrics.kv_cache_tokens): the simulator then preempts where the server would, and builds the
    cache it simulates in milliseconds (the cpu reference's roofline alone sizes millions of blocks for a tiny
    model, built and freed again in each of the fit's simulated runs)."""
    tokens = max((run.get("server", {}).get("server_kv_cache_tokens") or 0 for run in runs), default=0)
    return tokens // spec.base_config().cache.block_size or None
