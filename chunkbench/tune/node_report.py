"""What a node owner reads in a tune's report: the measured trials' Pareto front of output tokens/s per user
against output tokens/s per GPU (the axes of `vllm bench sweep plot_pareto`), which knobs mattered (Optuna's
PED-ANOVA importance, which needs no scikit-learn), and the GPUs' memory, utilisation and power per launched trial where
NVML was read."""

from __future__ import annotations

import html
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from chunkbench.bench.report import embedded_png, pyplot
from chunkbench.files import write_figure
from chunkbench.tune.objectives import get
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.study import is_feasible

IMPORTANCE_METHOD = (
    "PED-ANOVA (optuna.importance.PedAnovaImportanceEvaluator): how much each knob's values "
    "differ between the best 10% of trials and all of them"
)
GPU_COLUMNS = ("gpu_peak_memory_mib", "gpu_mean_util_pct", "gpu_mean_power_w")


def gpus_per_server(spec: TuneSpec) -> int:
    """The GPUs one configuration runs on: its launch slot's, else its tensor-parallel size."""
    slot = getattr(spec.backend, "slot", None)
    return (
        len(slot.gpus) if slot is not None and slot.gpus else int(spec.engine_overrides.get("tensor_parallel_size", 1))
    )


def per_user_per_gpu(spec: TuneSpec, trial: optuna.trial.FrozenTrial) -> tuple[float, float] | None:
    """(output tokens/s per user, per GPU) of a trial: the decode speed one user sees (1000 / median TPOT in
    ms) and the output throughput over its GPUs. vLLM's plot_pareto divides throughput by the request rate
    instead, which at a tune's one rate only rescales the throughput."""
    metrics = trial.user_attrs.get("metrics", {})
    throughput, tpot = metrics.get("output_throughput"), metrics.get("median_tpot_ms")
    if not throughput or not tpot:
        return None
    return 1000.0 / tpot, throughput / gpus_per_server(spec)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on each)."""
    return [i for i, (x, y) in enumerate(points) if not any(a >= x and b >= y and (a, b) != (x, y) for a, b in points)]


def plot_user_gpu_pareto(spec: TuneSpec, study: optuna.Study, path: Path) -> bool:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if per_user_per_gpu(spec, t)]
    if not done:
        return False
    points = [per_user_per_gpu(spec, t) for t in done]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ok = [is_feasible(t) for t in done]
    for feasible, style in (
        (True, dict(color="tab:green", label="meets the SLA")),
        (False, dict(color="tab:red", marker="x", label="misses the SLA")),
    ):
        chosen = [p for p, f in zip(points, ok) if f == feasible]
        if chosen:
            ax.scatter([p[0] for p in chosen], [p[1] for p in chosen], **style)
    front = sorted(points[i] for i in pareto_front(points))
    ax.plot([p[0] for p in front], [p[1] for p in front], color="black", lw=1, label="Pareto front")
    ax.set_xlabel("output tokens/s per user (1000 / median TPOT in ms)")
    ax.set_ylabel(f"output tokens/s per GPU ({gpus_per_server(spec)} per server)")
    ax.set_title("measured trials")
    ax.legend()
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
    return True


def importances(spec: TuneSpec, study: optuna.Study) -> dict[str, float] | str:
    """Each searched knob's importance to the objective's headline value over the complete trials (PED-ANOVA),
    highest first; or why there are none."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varied = {name for t in done for name in t.params if len({u.params.get(name) for u in done}) > 1}
    if len(done) < 3 or not varied:
        return f"{len(done)} complete trials{'' if varied else ' with no knob varied'}: too few to tell"
    index = get(spec.objective).headline  # pareto: output throughput
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental, and its notes on few trials: said below instead
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), target=lambda t: t.values[index]
            )
    except (RuntimeError, ValueError) as exc:
        return f"not computed: {exc}"
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def importance_line(found: dict[str, float] | str, top: int = 3) -> str:
    if isinstance(found, str):
        return f"knob importance: {found}"
    return "knobs that mattered most (PED-ANOVA importance): " + ", ".join(
        f"{name} {share:.2f}" for name, share in list(found.items())[:top]
    )


def gpu_note(study: optuna.Study) -> str:
    """Why the trials have GPU columns, or why not."""
    recorded = [t for t in study.trials if any(k in t.user_attrs.get("metrics", {}) for k in GPU_COLUMNS)]
    if recorded:
        return (
            f"GPU figures (peak memory, mean utilisation, mean power) read through NVML during {len(recorded)} "
            "launched trials: columns user_attrs_metrics in trials.csv."
        )
    from chunkbench.launch.gpu_monitor import unavailable

    return f"No GPU figures: {unavailable() or 'no trial ran on --gpus'}."


def node_section(spec: TuneSpec, study: optuna.Study, out_dir: Path) -> str:
    """report.html's section: the per-user/per-GPU front, the importances, the GPU figures' note."""
    found = importances(spec, study)
    body = "<h2>Throughput per user against per GPU</h2>"
    if plot_user_gpu_pareto(spec, study, out_dir / "pareto_gpu.png"):
        body += (
            "<p>Each complete trial's decode speed per user (1000 / median TPOT in ms) against its output "
            "throughput per GPU; the black line is the Pareto front: no other trial is better on both.</p>"
            + embedded_png(out_dir / "pareto_gpu.png")
        )
    else:
        (out_dir / "pareto_gpu.png").unlink(missing_ok=True)
        body += "<p>No complete trial with an output throughput.</p>"
    body += f"<h2>Which knobs mattered</h2><p>Method: {html.escape(IMPORTANCE_METHOD)}.</p>"
    if isinstance(found, str):
        body += f"<p>{html.escape(found)}</p>"
    else:
        body += (
            "<table><tr><th>knob</th><th>importance</th></tr>"
            + "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>" for k, v in found.items())
            + "</table>"
        )
    return body + f"<h2>GPUs</h2><p>{html.escape(gpu_note(study))}</p>"
