"""How a study's results read, on the terminal and in the outputs: a trial's knobs, its SLA misses, the table of
the best trials, the winner's margin over the runner-up, and a re-measured configuration's figures in a line."""

from __future__ import annotations

import optuna
from rich.table import Table

from chunkbench.bench.slo import SLO
from chunkbench.engine.knobs import KNOBS
from chunkbench.tune.objectives import get
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import closest_trials, feasible_trials


def knobs_text(trial: optuna.trial.FrozenTrial) -> str:
    return point_text(trial.user_attrs["knobs"])


def point_text(knobs: dict) -> str:
    """'chunked, budget 2048, seqs 256, chunk 512' from a trial's knobs (engine keyword arguments)."""
    parts = [str(knobs.get("policy", "chunked"))]
    for knob in KNOBS.values():
        value = knobs.get(knob.name)
        if knob.label and value not in (None, (), [], 0, False) and not (knob.default_is_off and value == knob.default):
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            parts.append(f"{knob.label} {text}" if value is not True else knob.label)
    return ", ".join(parts)


def trials_text(study: optuna.Study) -> str:
    """'60 trials', or '58 trials (2 failed)': the complete trials a study holds (a resumed study's interrupted and
    replaced ones are not counted), its failed ones apart."""
    complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    failed = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
    return f"{complete} trials" + (f" ({failed} failed)" if failed else "")


def _ms(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def sla_misses(constraints: dict[str, float], slos: list[SLO]) -> list[str]:
    return [f"{slo} missed by {constraints[slo.name]:,.0f} ms" for slo in slos if constraints.get(slo.name, 0.0) > 0]


def results_table(spec: TuneSpec, study: optuna.Study, verified: dict[int, dict], top: int = 5) -> Table:
    winners = feasible_trials(study)
    keys = [s.summary_key for s in spec.slos]
    closest = [] if winners else closest_trials(study, spec.slos)
    counted = trials_text(study)
    what = f"best of {counted}" if winners or not closest else f"none of {counted} met the SLAs; the closest"
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
