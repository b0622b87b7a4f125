"""search.png (and pareto.png for a front): the study's trials by their objective values, for report.html."""

from __future__ import annotations

from pathlib import Path

import optuna

from chunkbench.bench.report import pyplot
from chunkbench.files import write_figure
from chunkbench.tune.objectives import get
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import is_feasible


def plot_search(spec: TuneSpec, study: optuna.Study, out_dir: Path) -> None:
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
