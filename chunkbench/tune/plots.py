"""How the objective and the SLA metrics move with each knob: small multiples over the study's trials (the
same rows trials.csv holds), one column per searched knob, one row per figure, for report.html."""

from __future__ import annotations

import random
from pathlib import Path

import optuna

from chunkbench.bench.report import pyplot
from chunkbench.files import write_figure
from chunkbench.tune.objectives import get
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import is_feasible

KNOB_LABELS = {
    "policy": "policy",
    "max_num_batched_tokens": "token budget",
    "chunk_size": "chunk cap (0: none)",
    "chunk_schedule": "schedule family",
    "tile": "tile (0: none)",
    "max_num_seqs": "seats",
    "max_partial_prefills": "partial prefills (0: any)",
    "enable_prefix_caching": "prefix caching",
}


def rows(spec: TuneSpec) -> list[tuple[str, str]]:
    """(metric key, axis label) per row: the objective's, each SLA's metric, and the bounds the objective also
    checks (capacity: the median scheduling delay)."""
    objective = get(spec.objective)
    sla = [(s.summary_key, f"{s.summary_key.removesuffix('_ms').replace('_', ' ')} (ms)") for s in spec.slos]
    return [*objective.rows, *sla, *objective.extra_rows]


DOT_STYLES = {
    "met": dict(s=14, color="tab:green", alpha=0.7),
    "missed": dict(s=18, color="tab:red", marker="x", alpha=0.7),
    "winner": dict(marker="*", s=160, color="gold", edgecolors="black", zorder=3),
}


def plot_knobs(spec: TuneSpec, study: optuna.Study, winner: optuna.trial.FrozenTrial | None, path: Path) -> bool:
    """knobs.png: each complete trial as a dot (green: meets the SLAs, red x: misses) at its value of each
    knob that took more than one value; the winner as a star. Capacity trials report their metrics at the
    capacity found. False (nothing written) when no knob varied."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    knobs = [k for k in spec.space.values if len({repr(t.params.get(k)) for t in done if k in t.params}) > 1]
    if not done or not knobs:
        return False
    metric_rows = rows(spec)
    plt = pyplot()
    fig, axes = plt.subplots(
        len(metric_rows), len(knobs), figsize=(2.6 * len(knobs), 2.1 * len(metric_rows)), squeeze=False, sharey="row"
    )
    jitter = random.Random(0)  # spread dots that share a category, the same way every time
    for c, knob in enumerate(knobs):
        categories = [v for v in spec.space.values[knob] if any(t.params.get(knob) == v for t in done)]
        position = {repr(v): i for i, v in enumerate(categories)}
        for r, (key, label) in enumerate(metric_rows):
            ax = axes[r][c]
            points: dict[str, list[tuple[float, float]]] = {group: [] for group in DOT_STYLES}
            for t in done:
                value = t.user_attrs.get("metrics", {}).get(key)
                if value is None or knob not in t.params:
                    continue
                x = position[repr(t.params[knob])] + jitter.uniform(-0.18, 0.18)
                won = winner is not None and t.number == winner.number
                points["winner" if won else "met" if is_feasible(t) else "missed"].append((x, value))
            for group, style in DOT_STYLES.items():  # one collection per kind of dot: a scatter call each costs
                if points[group]:
                    ax.scatter(*zip(*points[group]), **style)
            for slo in spec.slos:  # the SLA's limit on its own row
                if slo.summary_key == key:
                    ax.axhline(slo.limit_ms, color="gray", lw=0.8, ls="--")
            if key == "median_scheduling_delay_ms":
                ax.axhline(spec.max_sched_delay_ms, color="gray", lw=0.8, ls="--")
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels([str(v) for v in categories], fontsize=7, rotation=30)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
            if r == len(metric_rows) - 1:
                ax.set_xlabel(KNOB_LABELS.get(knob, knob), fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
    fig.suptitle("each trial by knob (star: winner; green: meets the SLAs; red x: misses; dashed: limit)", fontsize=9)
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
    return True
