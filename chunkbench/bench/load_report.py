"""What `compare` across load shows and writes: the probes as they run, the table at the common rate with
each policy's capacity, the verdict, load.png (latency against achieved throughput, the SLA drawn) and the
load section of report.html and comparison.json."""

from __future__ import annotations

import html
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chunkbench.bench.load_sweep import PolicyLoad
from chunkbench.bench.probing import Probe
from chunkbench.bench.report import comparison_table, embedded_png, pyplot
from chunkbench.bench.runs import BenchRun
from chunkbench.bench.slo import SLO
from chunkbench.files import write_figure

CURVES = (
    ("p99_ttft_ms", "p99 TTFT (ms)", "ttft"),
    ("p99_itl_ms", "p99 ITL (ms)", "tbt"),
    ("median_itl_ms", "median ITL (ms)", None),
)


def probe_line(label: str, probe: Probe, slos: list[SLO]) -> str:
    """One probe as it ends: its rate and length, what the steady window served and measured, its verdict."""
    if math.isinf(probe.rate):
        return f"  {label} all at once: saturation throughput {probe.summary['request_throughput']:.3g} req/s"
    what = f"{probe.rate:.3g} req/s, {probe.requests:,} requests" + (
        f" x {probe.draws} draws" if probe.draws > 1 else ""
    )
    summary = probe.summary
    if summary is None:
        return f"  {label} at {what}: {probe.reason or 'stopped early'}"
    figures = ", ".join(f"{s.name.upper()} p{s.percentile:g} {summary[s.summary_key]:,.1f} ms" for s in slos)
    verdict = "held" if probe.feasible else f"did not hold ({probe.reason})"
    return (
        f"  {label} at {what}: {summary['request_throughput']:.3g} req/s served, {figures}, median "
        f"scheduling delay {summary['median_scheduling_delay_ms']:,.0f} ms: {verdict}"
        + ("" if probe.clear else " (not yet clear)")
    )


def load_table(
    runs: list[BenchRun], loads: list[PolicyLoad], rate: float, title: str, slos: list[SLO], max_sched_delay_ms: float
) -> Table:
    """The comparison table at the common rate, with the capacity, what limits it and the rate rows on top."""
    table = comparison_table(runs, title=title)
    first = loads[0].capacity
    ratios = [f"{load.capacity / first:.2f}x" if first > 0 else "-" for load in loads[1:]]
    table.add_section()
    table.add_row("capacity at the SLA (req/s)", *(load.found.interval() for load in loads), *ratios)
    table.add_row("limited by", *(load.limited_by(slos, max_sched_delay_ms) for load in loads), *[""] * len(ratios))
    table.add_row("figures above taken at (req/s)", *[f"{rate:.3g}"] * len(loads), *[""] * len(ratios))
    return table


def plot_load(loads: list[PolicyLoad], slos: list[SLO], path: Path) -> None:
    """Latency against achieved request throughput, one line per policy, one panel per figure; the SLA's
    limit drawn on its panel; each policy's capacity as a dotted vertical line."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 4))
    for ax, (key, name, slo_name) in zip(axes, CURVES):
        for load in loads:
            points = [(s["request_throughput"], s[key]) for _, s in load.points() if s and s.get(key) is not None]
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=load.label)
            at_capacity = dict(load.points()).get(load.capacity)
            if at_capacity is not None:  # where the capacity's run lies on this axis
                ax.axvline(at_capacity["request_throughput"], color=line.get_color(), ls=":", lw=1)
        for slo in slos:
            if slo.name == slo_name and slo.percentile == 99:
                ax.axhline(slo.limit_ms, color="black", ls="--", lw=1, label=str(slo))
        ax.set_xlabel("achieved throughput (req/s)")
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="upper left")  # latency rises to the right
    fig.suptitle(
        "latency against load (rightmost points: all requests at once; dotted: the run at each policy's capacity)"
    )
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)


def load_payload(loads: list[PolicyLoad], slos: list[SLO], rate: float | None, sla_note: str, verdict: str) -> dict:
    """comparison.json's "load": the SLA, the common rate, each policy's capacity and probes."""
    keys = (
        "request_throughput",
        "output_throughput",
        "p99_ttft_ms",
        "median_ttft_ms",
        "p99_itl_ms",
        "median_itl_ms",
        "median_scheduling_delay_ms",
    )
    return {
        "slas": [str(s) for s in slos],
        "sla_note": sla_note,
        "common_rate": rate,
        "verdict": verdict,
        "policies": {
            load.label: {
                "capacity_rps": load.capacity,
                "capacity_interval_rps": [load.found.low, None if math.isinf(load.found.high) else load.found.high],
                "confirmation": load.found.note,
                "probes": [
                    {"rate": p.rate, "requests": p.requests, "draws": p.draws, "feasible": p.feasible}
                    | {"clear": p.clear, "why": p.reason, "stopped_early": p.summary is None}
                    | {k: p.summary.get(k) for k in keys if p.summary}
                    for p in load.found.probes + load.found.confirmed + load.extra
                ],
                "saturation": {k: load.saturation.summary.get(k) for k in keys}
                | {"steady_throughput": load.saturation_rps},
            }
            for load in loads
        },
    }


def load_section(out: Path, sla_note: str, verdict: str) -> str:
    return f"<h2>Across load</h2><p>{html.escape(sla_note)}</p><p><b>{html.escape(verdict)}</b></p>" + embedded_png(
        out / "load.png"
    )


def announce_rates(
    console: Console, loads_planned: int, bisections: int, resolution: float, rates: list[float], count: int | None
) -> None:
    extra = (
        f"; and at {', '.join(f'{r:g}' for r in rates)} req/s"
        if rates
        else f"; and {count} rates up to its saturation throughput"
        if count
        else ""
    )
    console.print(
        f"rates: for each of {loads_planned} policies, a long run's requests all at once (its saturation "
        f"throughput), then its capacity search from there to {resolution:.1f}% ({bisections} bisections) on "
        "the steady window of each run (warm-up and drain left out), runs made longer until each verdict is "
        f"clear, the capacity confirmed on a run twice as long and refuted 15% above{extra}",
        soft_wrap=True,
    )
