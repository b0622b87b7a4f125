"""Tables (rich, for the terminal), plots (matplotlib PNG) and a self-contained report.html."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import numpy as np
from rich.table import Table

from chunkbench.bench.runs import BenchRun
from chunkbench.files import write_figure, write_json, write_text

CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
    "margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
    "img{max-width:100%;margin:1em 0}pre{font-size:11px;background:#f6f6f6;padding:8px}"
)


def html_page(title: str, body: str) -> str:
    """A self-contained page: the reports of compare and tune share its look."""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def embedded_png(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display here or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# (summary key, label, lower is better?) rows of the tables.
HEADLINE = [
    ("completed", "completed requests", None),
    ("failed", "failed or rejected requests", True),
    ("request_throughput", "request throughput (req/s)", False),
    ("request_goodput", "request goodput (req/s)", False),
    ("output_throughput", "output throughput (tok/s)", False),
    ("median_ttft_ms", "median TTFT (ms)", True),
    ("p99_ttft_ms", "p99 TTFT (ms)", True),
    ("median_tpot_ms", "median TPOT (ms)", True),
    ("median_itl_ms", "median ITL (ms)", True),
    ("p99_itl_ms", "p99 ITL (ms)", True),
    ("p99_e2el_ms", "p99 E2EL (ms)", True),
    ("p99_scheduling_delay_ms", "p99 scheduling delay (ms)", True),
    ("num_paused_decodes", "paused decodes (stalls)", True),
    ("num_stalls", "token gaps with a stall", True),
    ("longest_stall_ms", "longest stall (ms)", True),
    ("num_slow_steps", "slow steps (> 5x median decode step)", None),
    ("median_step_ms", "median step time (ms)", True),
    ("p99_step_ms", "p99 step time (ms)", True),
    ("num_preemptions", "preemptions", True),
    ("peak_kv_usage_pct", "peak KV usage (%)", None),
    ("peak_activation_bytes", "peak activation memory (MiB/GPU)", True),
    ("sla_attainment_pct", "SLA attainment (%)", False),
    ("probe_completed", "probes completed (--probe-request-rate)", None),
    ("probe_median_e2el_ms", "median probe E2EL (ms)", True),
    ("probe_p99_e2el_ms", "p99 probe E2EL (ms)", True),
]

UNITS = {"peak_activation_bytes": 2**20}  # keys shown in a larger unit than the summary's: divide by this


def _fmt(value) -> str:
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer() and value > 100):
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def step_target_ms(run: BenchRun) -> float | None:
    """The run's --step-time-target (ms), or None."""
    return run.config.scheduler.step_time_target_ms if run.config else None


def comparison_rows(runs: list[BenchRun]) -> list[list[str]]:
    """Rows of metric, one value per run, and each later run's ratio against the first."""
    rows = []
    if any(step_target_ms(r) for r in runs):  # what the step-time rows below are held to
        rows.append(
            ["step-time target (ms)"]
            + [_fmt(step_target_ms(r)) if step_target_ms(r) else "-" for r in runs]
            + [""] * (len(runs) - 1)
        )
    for key, label, _ in HEADLINE:
        if not all(key in r.summary for r in runs):
            continue
        values = [r.summary[key] / UNITS.get(key, 1) for r in runs]
        row = [label] + [_fmt(v) for v in values]
        for v in values[1:]:
            row.append(f"{v / values[0]:.2f}x" if values[0] else "-")
        rows.append(row)
    return rows


def comparison_table(runs: list[BenchRun], title: str = "") -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for r in runs:
        table.add_column(r.label, justify="right")
    for r in runs[1:]:
        table.add_column(f"{r.label} / {runs[0].label}", justify="right", style="dim")
    for row in comparison_rows(runs):
        table.add_row(*row)
    return table


def failure_notes(runs: list[BenchRun]) -> list[str]:
    """A line per run that lost requests: how many, and the first one's error (each is in requests.parquet)."""
    notes = []
    for r in runs:
        failed = [(i, q) for i, q in enumerate(r.result.requests) if not q.ok]
        if failed:
            i, first = failed[0]
            notes.append(
                f"{r.label}: {len(failed)} of {len(r.result.requests)} requests failed, e.g. request {i}: "
                f"{first.error or 'no token'}; each one's error is in requests.parquet"
            )
    return notes


def markdown_table(runs: list[BenchRun]) -> str:
    header = ["metric"] + [r.label for r in runs] + [f"{r.label} / {runs[0].label}" for r in runs[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in comparison_rows(runs)]
    return "\n".join(lines)


def plot_comparison(runs: list[BenchRun], out_dir: Path) -> list[Path]:
    """TTFT CDF, ITL CDF and a per-step timeline (tokens per step, prefill/decode stacked)."""
    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, values_of in [
        ("ttft", lambda r: [q.ttft for q in r.result.requests if q.ok]),
        ("itl", lambda r: [g for q in r.result.requests if q.ok for g in q.itls]),
    ]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in runs:
            values = np.sort(np.asarray(values_of(r)) * 1000.0)
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=r.label)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name.upper()} (ms, log scale)")
        ax.set_ylabel("fraction of " + ("requests" if name == "ttft" else "token gaps"))
        ax.set_title(f"{name.upper()} CDF")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")  # a fixed place: "best" searches every point (slow, and it warns)
        fig.tight_layout()
        paths.append(out_dir / f"{name}_cdf.png")
        write_figure(fig, paths[-1])
        plt.close(fig)
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        starts = np.array([s.start for s in r.result.steps] + [r.result.duration])
        decode = np.array([s.decode_tokens for s in r.result.steps] + [0])
        total = decode + np.array([s.prefill_tokens for s in r.result.steps] + [0])
        ax.fill_between(starts, 0, decode, step="post", color="tab:blue", label="decode tokens", lw=0)
        ax.fill_between(starts, decode, total, step="post", color="tab:orange", label="prefill tokens", lw=0)
        ax.set_ylabel("tokens/step")
        ax.set_title(r.label, fontsize=9)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    paths.append(out_dir / "timeline.png")
    write_figure(fig, paths[-1])
    plt.close(fig)
    paths.append(plot_step_times(runs, out_dir / "step_times.png"))
    return paths


def plot_step_times(runs: list[BenchRun], path: Path) -> Path:
    """Each step's duration over the run, with the run's --step-time-target as a dashed line: steps that
    hold the target stay under it."""
    plt = pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.2 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        starts = [s.start for s in r.result.steps]
        ms = [s.seconds * 1000.0 for s in r.result.steps]
        prefill = [s.prefill_tokens > 0 for s in r.result.steps]
        ax.scatter(
            [t for t, p in zip(starts, prefill) if p],
            [m for m, p in zip(ms, prefill) if p],
            s=3,
            color="tab:orange",
            label="with prompt tokens",
        )
        ax.scatter(
            [t for t, p in zip(starts, prefill) if not p],
            [m for m, p in zip(ms, prefill) if not p],
            s=3,
            color="tab:blue",
            label="decodes only",
        )
        target = step_target_ms(r)
        if target and target <= 1000 * max(ms, default=0.0):  # a target far above every step: no line to see
            ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target:g} ms")
        if ms and max(ms) > 20 * max(min(ms), 1e-3):
            ax.set_yscale("log")
        ax.set_ylabel("step (ms)")
        ax.set_title(r.label, fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
    return path


def write_html(runs: list[BenchRun], images: list[Path], path: Path, title: str, command: str) -> None:
    """One file with the table, the plots (embedded) and each run's config."""
    header = "".join(
        f"<th>{html.escape(c)}</th>"
        for c in ["metric"] + [r.label for r in runs] + [f"{r.label} / {runs[0].label}" for r in runs[1:]]
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in comparison_rows(runs)
    )
    configs = "".join(
        f"<h3>{html.escape(r.label)}</h3><pre>{html.escape(json.dumps(r.summary, indent=1))}</pre>" for r in runs
    )
    write_text(
        html_page(
            title,
            f"""<h1>{html.escape(title)}</h1><p><code>{html.escape(command)}</code></p>
<table><tr>{header}</tr>{body}</table>{"".join(embedded_png(p) for p in images)}
<details><summary>full summaries</summary>{configs}</details>""",
        ),
        path,
    )


def folder_name(label: str) -> str:
    """A policy spec as a folder name: 'chunked:budget=512' -> 'chunked_budget-512'."""
    return re.sub(r"[^A-Za-z0-9_.#-]", "_", label.replace("=", "-")).strip(".") or "run"


def write_comparison(runs: list[BenchRun], out: Path, spec, title: str, command: str) -> dict:
    """One folder per policy (as `run` writes), then comparison.md, the plots, report.html and, last,
    comparison.json. Returns the comparison's JSON payload."""
    from chunkbench.bench.runs import save_run

    for r in runs:
        save_run(r, out / folder_name(r.label), spec)
    summaries = {"runs": {r.label: r.summary for r in runs}}
    write_text(markdown_table(runs) + "\n", out / "comparison.md")
    write_html(runs, plot_comparison(runs, out), out / "report.html", title, command)
    write_json(summaries, out / "comparison.json")
    return summaries
