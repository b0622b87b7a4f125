"""What `chunkbench tune` leaves in results/tune/<study>/: configs, trials.csv, plots, report.html."""

from __future__ import annotations

import html
import json
from pathlib import Path

import optuna
from rich.table import Table

from chunkbench.bench.report import embedded_png, html_page, pyplot
from chunkbench.bench.slo import SLO
from chunkbench.engine.config import EngineConfig
from chunkbench.files import write_figure, write_text
from chunkbench.tune import emit
from chunkbench.tune.node_report import importance_line, importances, node_section
from chunkbench.tune.objectives import get
from chunkbench.tune.plots import plot_knobs
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import closest_trial, closest_trials, feasible_trials, is_feasible

OUTPUTS = (
    "recommended.toml",
    "vllm.yaml",
    "vllm_flags.txt",
    "sglang.txt",
    "trials.csv",
    "search.png",
    "knobs.png",
    "pareto_gpu.png",
    "report.html",
)


def trial_config(spec: TuneSpec, trial: optuna.trial.FrozenTrial) -> EngineConfig:
    return spec.base_config(**trial.user_attrs["knobs"])


def knobs_text(trial: optuna.trial.FrozenTrial) -> str:
    return emit.knobs_text(trial.user_attrs["knobs"])


def _ms(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def sla_misses(constraints: dict[str, float], slos: list[SLO]) -> list[str]:
    return [f"{slo} missed by {constraints[slo.name]:,.0f} ms" for slo in slos if constraints.get(slo.name, 0.0) > 0]


def results_table(spec: TuneSpec, study: optuna.Study, verified: dict[int, dict], top: int = 5) -> Table:
    winners = feasible_trials(study)
    keys = [s.summary_key for s in spec.slos]
    closest = [] if winners else closest_trials(study, spec.slos)
    what = (
        f"best of {len(study.trials)} trials"
        if winners or not closest
        else f"none of {len(study.trials)} trials met the SLAs; the closest"
    )
    winners = winners or closest
    title, metric = get(spec.objective).column
    table = Table(title=f"{spec.model}: {what} ({spec.objective}, {spec.backend})")
    for column in ["trial", "knobs", title, *keys, "output tok/s"] + (
        ["verified " + k for k in keys] if verified else []
    ):
        table.add_column(column, justify="left" if column == "knobs" else "right")
    shown: set[str] = set()
    for t in winners:  # distinct configurations only: TPE often samples the best point again
        knobs = knobs_text(t)
        if knobs in shown:
            continue
        if len(shown) == top:
            break
        shown.add(knobs)
        m = t.user_attrs["metrics"]
        value = m.get(metric, 0.0)
        row = (
            [str(t.number), knobs, f"{value:.2f}"]
            + [_ms(m.get(k)) for k in keys]
            + [f"{m.get('output_throughput', 0):,.0f}"]
        )
        if verified:
            real = verified.get(t.number)
            row += [_ms(real.get(k)) if real else "-" for k in keys]
        table.add_row(*row)
    return table


def margin(spec: TuneSpec, study: optuna.Study) -> str | None:
    """How far the winner is ahead of the runner-up (the best feasible trial with other knobs), or why they
    are equal. None without one winner (pareto: a front has no single runner-up) or when nothing is feasible."""
    winners, objective = feasible_trials(study), get(spec.objective)
    if not objective.one_winner or not winners:
        return None
    winner = winners[0]
    runner = next((t for t in winners[1:] if knobs_text(t) != knobs_text(winner)), None)
    what = objective.headline_name
    if runner is None:
        return f"Margin: trial {winner.number} is the only feasible configuration; no runner-up to compare."
    w, r = winner.values[0], runner.values[0]
    name = f"the runner-up (trial {runner.number}: {knobs_text(runner)})"
    if round(w, 9) > round(r, 9):
        return (
            f"Margin: the winner's {what} is {w:.3f} req/s, {w - r:.3f} req/s ({100 * (w - r) / r:.1f}%) "
            f"ahead of {name}."
        )
    if winner.user_attrs["metrics"] == runner.user_attrs["metrics"]:
        why = (
            "they ran identically (every metric equal): the knobs in which they differ never came into play "
            "on this workload"
        )
    else:
        why = objective.tie_reason(winner, runner)
    text = (
        f"Margin: none: the winner ties with {name} at {w:.3f} req/s, because {why}; the tie goes to the "
        "trial with more SLA headroom."
    )
    behind = next((t for t in winners if round(t.values[0], 9) < round(w, 9)), None)
    if behind is not None:
        v = behind.values[0]
        text += (
            f" The best configuration with a lower {what}, trial {behind.number} ({knobs_text(behind)}), "
            f"is {w - v:.3f} req/s ({100 * (w - v) / v:.1f}%) behind."
        )
    return text


def write_outputs(
    spec: TuneSpec,
    study: optuna.Study,
    out_dir: Path,
    verified: dict[int, dict],
    command: str,
    backend_note: str | None = None,
    measured: dict | None = None,
) -> tuple[optuna.trial.FrozenTrial | None, list[str]]:
    """Write every output; return the winner (None when nothing met the SLAs) and lines for the terminal.
    `measured`: the winner picked on re-measured figures (tune/verify.py's first row), not the search's best."""
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
                "on a launched server" + ("" if winner else " (it MISSED the SLA when measured)")
            )
            header += [f"command: {command}", measured_text(measured)]
        write_text(emit.chunkbench_toml(config, header), out_dir / "recommended.toml")
        served, note = server_trial(spec, study, chosen)
        if note:
            lines.append(note)
            header = header + [note]
            config = trial_config(spec, served)
        write_text(emit.vllm_yaml(config, header), out_dir / "vllm.yaml")
        write_text(emit.vllm_flags(config) + "\n", out_dir / "vllm_flags.txt")
        write_text(emit.sglang_flags(config) + "\n", out_dir / "sglang.txt")
        lines.append(f"vllm: {emit.vllm_flags(config)}")
        lines.append(f"sglang: {emit.sglang_flags(config)}")
    frame = study.trials_dataframe(attrs=("number", "state", "values", "params", "user_attrs", "duration"))
    write_text(frame.to_csv(index=False), out_dir / "trials.csv")
    _plot_search(spec, study, out_dir)
    knob_plot = plot_knobs(spec, study, winner, out_dir / "knobs.png")
    if not knob_plot:
        (out_dir / "knobs.png").unlink(missing_ok=True)  # a resumed study's old plot would be stale
    notes = not_verified(spec, study, verified, backend_note)
    _write_html(spec, study, out_dir, winner, chosen, verified, command, ahead, notes, knob_plot, measured)
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


def runs(record: dict) -> int:
    """How many runs a re-measured record's medians are of (one run keeps no `repeats`; tune/verify.py)."""
    return max(1, len(record.get("repeats") or []))


def measured_text(measured: dict) -> str:
    """A re-measured configuration's figures in a line (tune/verify.py's row)."""
    m, count = measured["metrics"], runs(measured)
    what = f"capacity {m['capacity_rps']:.3f}" if "capacity_rps" in m else f"goodput {m.get('request_goodput', 0):.3f}"
    return (
        f"measured{f' (median of {count} runs)' if count > 1 else ''}: {what} req/s, p99 TTFT "
        f"{m.get('p99_ttft_ms', 0):,.0f} ms, p99 ITL {m.get('p99_itl_ms', 0):,.0f} ms"
    )


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
    if spec.backend.kind == "sim" and not getattr(spec.backend, "cost_model", None):
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


def _plot_search(spec: TuneSpec, study: optuna.Study, out_dir: Path) -> None:
    """search.png: each trial's value by trial number and the best feasible so far; for a front (several
    values) its trials over the first two values, coloured by a third, also as pareto.png."""
    plt = pyplot()
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    ok = [is_feasible(t) for t in done]
    objective = get(spec.objective)
    labels = objective.value_labels
    if objective.multi:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        colour = dict(c=[t.values[2] for t in done], cmap="viridis") if len(labels) > 2 else {}
        points = ax.scatter(
            [t.values[0] for t in done],
            [t.values[1] for t in done],
            marker="o",
            edgecolors=["black" if f else "none" for f in ok],
            **colour,
        )
        if colour:
            fig.colorbar(points, label=labels[2])
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
        ax.set_title("trials (black edge: meets the SLA)")
        name = "pareto.png"
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        numbers = [t.number for t in done]
        values = [t.values[0] for t in done]
        ax.scatter(
            [n for n, f in zip(numbers, ok) if f],
            [v for v, f in zip(values, ok) if f],
            color="tab:green",
            label="meets the SLA",
        )
        ax.scatter(
            [n for n, f in zip(numbers, ok) if not f],
            [v for v, f in zip(values, ok) if not f],
            color="tab:red",
            marker="x",
            label="misses the SLA",
        )
        best, curve = float("-inf"), []
        for v, f in zip(values, ok):
            best = max(best, v) if f else best
            curve.append(best if best > float("-inf") else None)
        ax.plot(numbers, curve, color="black", lw=1, label="best feasible so far")
        ax.set_xlabel("trial")
        ax.set_ylabel(labels[0])
        ax.legend()
        name = "search.png"
    fig.tight_layout()
    write_figure(fig, out_dir / name)
    if name != "search.png":  # every objective leaves a search.png; a front also pareto.png
        write_figure(fig, out_dir / "search.png")
    plt.close(fig)


def _write_html(spec, study, out_dir, winner, chosen, verified, command, ahead, notes, knob_plot, measured) -> None:
    esc = html.escape
    slo_rows = ""
    if chosen is not None:
        m = measured["metrics"] if measured else chosen.user_attrs["metrics"]
        for slo in (s for s in spec.slos if s.summary_key in m):  # capacity: none when no rate met them
            value = m[slo.summary_key]
            slo_rows += (
                f"<tr><td>{esc(str(slo))}</td><td>{value:,.1f} ms</td>"
                f"<td>{'met' if value <= slo.limit_ms else 'MISSED'}</td></tr>"
            )

    def verified_cell(t) -> str:
        real = verified.get(t.number)
        return f"<td>{esc(json.dumps(real))}</td>" if verified else ""

    runners = "".join(
        f"<tr><td>{t.number}</td><td>{esc(knobs_text(t))}</td><td>{t.values[0]:.3f}</td>{verified_cell(t)}</tr>"
        for t in feasible_trials(study)[:10]
    )
    failed = [t for t in closest_trials(study, spec.slos) if not is_feasible(t)]
    why = "".join(
        f"<tr><td>{t.number}</td><td>{esc(knobs_text(t))}</td>"
        f"<td>{esc('; '.join(sla_misses(t.constraints, spec.slos)))}</td></tr>"
        for t in failed[:30]
    )
    crashed = "".join(
        f"<tr><td>{t.number}</td><td>{esc(t.user_attrs.get('error', 'unknown'))}</td></tr>"
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    )
    title = (
        f"winner: trial {winner.number}, {knobs_text(winner)}"
        if winner
        else f"no {'re-measured configuration' if measured else 'trial'} met the SLA"
        + (f"; closest: trial {chosen.number}, {knobs_text(chosen)}" if chosen else "")
    )
    if measured:
        title += " (on re-measured figures)"
    verified_note = (
        ""
        if verified
        else "<p>Not verified: these figures come from the backend named above "
        "only (verification re-measures the best trials on the real engine when the model runs "
        "on this machine, or relaunched with --backend launch).</p>"
    )
    body = f"""<h1>chunkbench tune: {esc(study.study_name)}</h1><p><code>{esc(command)}</code></p>
<p>{esc(spec.model)}, workload {esc(spec.workload.name)} at {spec.workload.rate} req/s, objective
{spec.objective}, {esc(str(spec.backend))}, {len(study.trials)} trials.</p>
<h2>{esc(title)}</h2>{f"<p><b>{esc(ahead)}</b></p>" if ahead else ""}
<table><tr><th>SLA</th><th>measured</th><th></th></tr>{slo_rows}</table>
{embedded_png(out_dir / "search.png")}
{
        "<h2>How each knob moves the objective and the SLA metrics</h2>" + embedded_png(out_dir / "knobs.png")
        if knob_plot
        else ""
    }
<h2>What was not verified, and why</h2><ul>{"".join(f"<li>{esc(n)}</li>" for n in notes)}</ul>
<h2>Feasible trials, best first</h2>{verified_note}<table><tr><th>trial</th><th>knobs</th><th>objective</th>
{"<th>verified (re-measured)</th>" if verified else ""}</tr>{runners}</table>
<h2>Why the others failed</h2><table><tr><th>trial</th><th>knobs</th><th>SLA misses</th></tr>{why}</table>"""
    body += node_section(spec, study, out_dir)
    if crashed:
        body += f"<h2>Crashed trials</h2><table><tr><th>trial</th><th>error</th></tr>{crashed}</table>"
    write_text(html_page(f"chunkbench tune {study.study_name}", body), out_dir / "report.html")
