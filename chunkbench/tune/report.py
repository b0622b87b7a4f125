"""What `chunkbench tune` leaves in results/tune/<study>/: configs, trials.csv, plots, report.html. The texts
and tables are report_text.py's, the page report_html.py's, search.png search_plot.py's."""

from __future__ import annotations

from pathlib import Path

import optuna

from chunkbench import servers
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS
from chunkbench.files import write_text
from chunkbench.tune.node_report import importance_line, importances
from chunkbench.tune.objectives import get
from chunkbench.tune.plots import plot_knobs
from chunkbench.tune.report_html import write_html
from chunkbench.tune.report_text import knobs_text, margin, measured_text, sla_misses
from chunkbench.tune.search_plot import plot_search
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import closest_trial, feasible_trials


def outputs() -> list[str]:
    """The files a study's folder may hold: each server kind's configs, then the study's own."""
    own = ["capacity.json", "trials.csv", "search.png", "knobs.png", "pareto_gpu.png", "report.html"]
    return [name for kind in servers.kinds() for name in kind.outputs or (f"{kind.name}.txt",)] + own


def trial_config(spec: TuneSpec, trial: optuna.trial.FrozenTrial) -> EngineConfig:
    return spec.base_config(**trial.user_attrs["knobs"])


def write_outputs(
    spec: TuneSpec,
    study: optuna.Study,
    out_dir: Path,
    verified: dict[int, dict],
    command: str,
    backend_note: str | None = None,
    measured: dict | None = None,
    confirmed: list[str] = (),
) -> tuple[optuna.trial.FrozenTrial | None, list[str]]:
    """Write every output; return the winner (None when nothing met the SLAs) and lines for the terminal.
    `measured`: the winner picked on re-measured figures (tune/verify.py's first row), not the search's best.
    `confirmed`: what the winner's confirmation runs showed (tune/settle.py), for the headers and terminal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if measured is None:
        winners = feasible_trials(study)
        winner = winners[0] if winners else None
        chosen, ahead = winner or closest_trial(study, spec.slos), margin(spec, study)
    else:  # the re-measured table says how far ahead it is
        chosen, ahead = study.trials[measured["trial"]], None
        winner = chosen if measured["feasible"] else None
    lines = [ahead] if ahead else []
    slo_text = ", ".join(map(str, spec.slos)) or "no SLA"
    if winner is None:
        lines.append(f"No {'re-measured configuration' if measured else 'trial'} met {slo_text}.")
        if chosen is not None:
            lines.append(
                f"Closest: trial {chosen.number} ({knobs_text(chosen)}): "
                + "; ".join(sla_misses((measured or {}).get("constraints", chosen.constraints), spec.slos))
            )
    if chosen is not None:
        config = trial_config(spec, chosen)
        header = [
            f"chunkbench tune: {'best feasible' if winner else 'CLOSEST (no trial met the SLA)'} trial "
            f"{chosen.number} of study '{study.study_name}'",
            f"SLA: {slo_text}",
            f"workload: {spec.workload.name} at {spec.workload.rate} req/s; figures {spec.backend}",
        ]
        if measured is not None:
            header[0] = (
                f"chunkbench tune: trial {chosen.number} of study '{study.study_name}', the best re-measured "
                + measured.get("where", "on a launched server")
                + ("" if winner else " (it MISSED the SLA when measured)")
            )
            header += [f"command: {command}", measured_text(measured)]
        header += list(confirmed)
        lines += list(confirmed)
        served, note = server_trial(spec, study, chosen)
        if note:
            lines.append(note)
        for kind in servers.kinds():  # a server without a step-time target gets the best trial without one
            own = kind.expresses(KNOBS["step_time_target_ms"])
            cfg, version = (config if own else trial_config(spec, served)), spec.versions.get(kind.name, "")
            for name, text in kind.files(cfg, header + ([note] if note and not own else []), version).items():
                write_text(text, out_dir / name)
            lines.append(f"{kind.name}: {kind.command(cfg, version)}")
    frame = study.trials_dataframe(attrs=("number", "state", "values", "params", "user_attrs", "duration"))
    write_text(frame.to_csv(index=False), out_dir / "trials.csv")
    plot_search(spec, study, out_dir)
    knob_plot = plot_knobs(spec, study, winner, out_dir / "knobs.png")
    if not knob_plot:
        (out_dir / "knobs.png").unlink(missing_ok=True)  # a resumed study's old plot would be stale
    notes = not_verified(spec, study, verified, backend_note)
    write_html(spec, study, out_dir, winner, chosen, verified, command, ahead, notes, knob_plot, measured)
    lines.append(importance_line(importances(spec, study)))
    return winner, lines


def add_runs_to_csv(out_dir: Path, remeasured: list[dict]) -> None:
    """trials.csv gains a row per re-measurement run (state REMEASURED, `number` the trial whose configuration
    it ran, `run` its index, `slot` where): the runs behind each median, not only the medians."""
    import pandas as pd

    rows = [
        {"number": row["trial"], "state": "REMEASURED", "run": i, "knobs": row["knobs"]} | run
        for row in remeasured
        for i, run in enumerate(row.get("repeats") or [row["metrics"]])
    ]
    if rows:
        path = out_dir / "trials.csv"
        frame = pd.concat([pd.read_csv(path), pd.DataFrame(rows)], ignore_index=True)
        write_text(frame.to_csv(index=False), path)


def server_trial(
    spec: TuneSpec, study: optuna.Study, chosen: optuna.trial.FrozenTrial
) -> tuple[optuna.trial.FrozenTrial, str | None]:
    """The trial vLLM and SGLang configs carry, and why when it is not `chosen`: they have no step-time
    target, so a winner with one is replaced by the best feasible trial without one (a fixed token budget),
    and the note says how much the time budget gains over it."""
    if not chosen.user_attrs["knobs"].get("step_time_target_ms"):
        return chosen, None
    fixed = [t for t in feasible_trials(study) if not t.user_attrs["knobs"].get("step_time_target_ms")]
    if not fixed:
        return chosen, (
            f"vLLM and SGLang have no step-time target and no trial without one met the SLA: their "
            f"configs carry trial {chosen.number}'s token budget without the target"
        )
    objective = get(spec.objective)
    index, what = objective.headline, objective.headline_name
    best, a, b = fixed[0], chosen.values[index], fixed[0].values[index]
    gain = f"{100 * (a / b - 1):+.0f}%" if b > 0 else "from nothing"
    return best, (
        f"vLLM and SGLang have no step-time target: their configs carry trial {best.number} "
        f"({knobs_text(best)}), the best fixed budget; the time budget gains {gain} {what} over it "
        f"({a:.2f} vs {b:.2f})"
    )


def not_verified(spec: TuneSpec, study: optuna.Study, verified: dict[int, dict], backend_note: str | None) -> list[str]:
    """What the report's figures do not establish, and why."""
    notes = []
    if not verified:
        notes.append(
            f"No trial was re-measured: every figure is {spec.backend}"
            + (f" ({backend_note})." if backend_note else ".")
        )
    if spec.backend.simulated and not getattr(spec.backend, "cost_model", None):
        notes.append(
            "The roofline's kernel constants are fitted to operator profiles of reference GPUs (or are "
            "datasheet constants where the GPU is uncalibrated), not measured on this deployment: it ranks "
            "configurations, its absolute figures are estimates."
        )
    notes += get(spec.objective).notes(spec)
    points = len(spec.space.points())
    done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if done < points:
        notes.append(
            f"The search is not exhaustive: {done} trials over a space of {points} configurations "
            "(TPE); a configuration never tried may do better."
        )
    notes.append(
        "Knobs outside the search space keep their defaults; other workloads or rates may rank "
        "configurations differently."
    )
    return notes
