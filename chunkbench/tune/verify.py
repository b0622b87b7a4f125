"""Re-measure a study's best configurations on launched servers (`--verify-top K`, `--verify-repeats N`): each of
the K best distinct configurations launched once and run N times, judged by each figure's median, and the
winner picked on those measurements.

Two tunes use it. `--presearch sim` checks its simulated best this way. A tune that launches every trial
(`--backend launch`) does too, against the winner's curse: on a noisy server the best of 60 single runs is
partly the luckiest run (a measured case: docs/measurements/presearch-stand-in.md). Each finished re-measurement is
recorded in a JSON file in the study folder the moment it finishes, so a killed tune resumes without repeating it.
The terminal's and report.html's account of the re-measured rows is verify_report.py's.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from pathlib import Path

import optuna
from rich.console import Console

from chunkbench.bench.backend import Backend
from chunkbench.files import write_json
from chunkbench.launch.process import STOPPING
from chunkbench.launch.slots import SlotRun, slot_backends
from chunkbench.tune.objectives import evaluate_runs, median_outcome
from chunkbench.tune.report_text import knobs_text, runs
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import TRIAL_FAILURES, closest_trials, feasible_trials, headroom, is_feasible
from chunkbench.workloads.spec import build_workload

console = Console()

VERIFY_REPEATS = 3  # --verify-repeats: an odd count, so each median is a figure one run measured
SIM_TIE = 0.05  # simulated objectives this close to the best are ties: a calibration's error is ~10-15%


class State:
    """A JSON file of finished launches, written the moment each finishes (atomically); `verified` maps a
    configuration's knobs to its re-measured figures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("verified", {})

    def save(self) -> None:
        write_json(self.data, self.path)


def best_distinct(spec: TuneSpec, study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k best distinct configurations of the study. When none met the SLAs, the k that missed them by the
    least: a simulator's or a single run's miss of a few percent is within its error, and a launch may meet
    them."""
    candidates: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in feasible_trials(study) or closest_trials(study, spec.slos):
        if len(candidates) == k:
            break
        candidates.setdefault(knobs_text(trial), trial)
    return list(candidates.values())


def distance(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> float:
    """How far apart two configurations are in the searched knobs: per knob, the gap between their places in
    its list of values over the list's length (ordered numbers), or 0/1 (names)."""
    total = 0.0
    for name, dist in a.distributions.items():
        choices = list(dist.choices)
        if len(choices) < 2 or name not in b.params:
            continue
        x, y = a.params[name], b.params[name]
        numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)
        total += abs(choices.index(x) - choices.index(y)) / (len(choices) - 1) if numeric else float(x != y)
    return total


def spread_over_ties(
    spec: TuneSpec, study: optuna.Study, k: int, tie: float = SIM_TIE
) -> list[optuna.trial.FrozenTrial]:
    """The k configurations to launch when a simulator cannot rank them: its best, then, among the distinct
    feasible configurations whose simulated objective is within `tie` of the best, each time the one farthest
    from those chosen (farthest-point), so that the launches measure configurations that differ rather than
    near-copies of one; any left over, best first. Why: a calibrated simulator can tie most of a space, its
    best all alike, while launching finds a different winner (docs/measurements/presearch-stand-in.md)."""
    ranked = best_distinct(spec, study, len(study.trials))
    if not ranked or not is_feasible(ranked[0]):  # nothing met the SLAs: the closest ones
        return ranked[:k]
    best = ranked[0].values[0]
    ties = [t for t in ranked if t.values[0] >= best * (1 - tie)]
    chosen = [ties.pop(0)]
    while ties and len(chosen) < k:
        far = max(ties, key=lambda t: min(distance(t, c) for c in chosen))
        ties.remove(far)
        chosen.append(far)
    return chosen + [t for t in ranked if t not in chosen][: k - len(chosen)]


def split_runs(repeats: int, slots: int) -> list[int]:
    """A configuration's `repeats` runs as launches on up to `slots` slots, e.g. 3 over 2 -> [2, 1]."""
    parts = min(repeats, slots)
    return [repeats // parts + (i < repeats % parts) for i in range(parts)]


def verify_top(
    spec: TuneSpec,
    study: optuna.Study,
    launch: Backend,
    state: State,
    candidates: list[optuna.trial.FrozenTrial],
    repeats: int = VERIFY_REPEATS,
) -> list[dict]:
    """Launch the candidate configurations (best_distinct, spread_over_ties), each measured `repeats` times and
    scored by the medians (objectives.median_outcome); with several slots its runs are split over launches on
    different slots, and every run names its slot. One whose server fails is said and left out. Rows best
    first on the measured figures (SLAs met first, then the objective, then SLA headroom); `searched` holds
    the figures the search saw (simulated, or one run)."""
    workload = build_workload(spec.workload, spec.base_config().scheduler.max_model_len)
    backends = slot_backends(launch)
    todo = [
        t for t in candidates if (r := state.data["verified"].get(knobs_text(t))) is None or runs(r) != repeats
    ]  # not yet, or
    jobs, pinned, parts_of = [], [], {}  # by another --verify-repeats
    done: dict[int, list] = {}
    lock = threading.Lock()

    def finished(trial: optuna.trial.FrozenTrial, part: list | None) -> None:
        """A launch's runs; the configuration is recorded (atomically) the moment its last launch ends."""
        with lock:
            done.setdefault(trial.number, []).append(part)
            parts = done[trial.number]
            if len(parts) < parts_of[trial.number] or any(p is None for p in parts):
                return  # more to come, or one failed (said): left out
            every = [run for p in parts for run in p]
            outcome = every[0] if len(every) == 1 else median_outcome(every)
            state.data["verified"][knobs_text(trial)] = {
                "metrics": outcome.metrics,
                "values": outcome.values,
                "constraints": outcome.constraints,
                "feasible": outcome.feasible,
                "repeats": outcome.repeats,
            }
            state.save()

    for trial in todo:
        counts = split_runs(repeats, len(backends))
        parts_of[trial.number] = len(counts)
        for part, count in enumerate(counts):
            folder = state.path.parent / "verify" / str(trial.number) / (f"part{part}" if len(counts) > 1 else "")
            jobs.append(functools.partial(_remeasure, spec, trial, workload, count, folder / "launch.log", finished))
            pinned.append(len(pinned) % len(backends))
    SlotRun(backends).map(jobs, pinned)
    results = [
        {"trial": t.number, "knobs": knobs_text(t), "searched": t.user_attrs["metrics"]}
        | state.data["verified"][knobs_text(t)]
        for t in candidates
        if knobs_text(t) in state.data["verified"] and runs(state.data["verified"][knobs_text(t)]) == repeats
    ]
    limits = {s.name: s.limit_ms for s in spec.slos}
    results.sort(key=lambda r: measured_rank(r, limits))
    return results


def _remeasure(
    spec: TuneSpec, trial: optuna.trial.FrozenTrial, workload, count: int, log: Path, finished, backend: Backend
) -> None:
    """One launch of a re-measured configuration, `count` runs on it, handed to `finished` (None when its
    server failed: said)."""
    where = f" on {backend.slot}" if getattr(backend, "slot", None) is not None else ""
    console.print(
        f"re-measuring trial {trial.number} ({knobs_text(trial)}) on a launched server{where} ...", soft_wrap=True
    )
    try:
        runs_ = evaluate_runs(spec, trial.user_attrs["knobs"], workload, backend=backend, repeats=count, log=log)
    except TRIAL_FAILURES as exc:  # as a trial's: said, and the tune goes on
        if STOPPING.is_set():  # its server was stopped by an interrupt: the tune ends (tune/run.py says so)
            finished(trial, None)
            return
        console.print(
            f"[yellow]warning:[/] trial {trial.number} could not be re-measured{where} "
            f"({type(exc).__name__}: {exc}); left out",
            soft_wrap=True,
        )
        runs_ = None
    finished(trial, runs_)


def measured_rank(row: dict, limits: dict[str, float]) -> tuple:
    """Sort key of re-measured rows: those that met the SLAs first, by the objective, ties to more headroom;
    then the misses, the smallest first (the "closest" the outputs name), ties to the objective."""
    v = row["values"][0]
    value = float("-inf") if v is None or math.isnan(v) else round(v, 9)  # NaN (stored as null) ranks last
    room = headroom(row["constraints"], limits)
    return (False, -value, room) if row["feasible"] else (True, room, -value)
