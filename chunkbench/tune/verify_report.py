"""How re-measured configurations (tune/verify.py's rows) are shown: searched against measured per figure, the
run-to-run spread and each median's bootstrap interval, whether the winner is ahead beyond the noise; on the
terminal and as report.html's "Verified by launching" section."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import scipy.stats
from rich.console import Console
from rich.table import Table

from chunkbench.files import write_text
from chunkbench.tune.report_text import runs

console = Console()


def compared(rows: list[dict]) -> list[tuple[str, str]]:
    """The figures shown searched against measured: the objective's (capacity or goodput), p99 TTFT, p99 ITL."""
    first = (
        ("capacity_rps", "capacity (req/s)")
        if any("capacity_rps" in r["metrics"] for r in rows)
        else ("request_goodput", "goodput (req/s)")
    )
    return [first, ("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_itl_ms", "p99 ITL (ms)")]


def measured_range(row: dict, key: str) -> tuple[float, float] | None:
    """The lowest and highest of a verified configuration's repeated runs for one figure (None: one run)."""
    values = [run[key] for run in row.get("repeats") or [] if run.get(key) is not None]
    return (min(values), max(values)) if len(values) > 1 else None


def run_to_run_spread(verified: list[dict]) -> float | None:
    """The largest (highest - lowest) / median of a compared figure over one configuration's repeated runs."""
    figures = compared(verified)
    spreads = [
        (span[1] - span[0]) / row["metrics"][key]
        for row in verified
        for key, _ in figures
        if (span := measured_range(row, key)) and row["metrics"].get(key)
    ]
    return max(spreads, default=None)


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A bootstrap interval (percentile method, seeded) of the median of repeated runs; None below 2 runs."""
    if len(values) < 2:
        return None
    if min(values) == max(values):
        return values[0], values[0]
    result = scipy.stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.median,
        confidence_level=confidence,
        method="percentile",
        n_resamples=2000,
        random_state=0,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def run_values(row: dict, key: str) -> list[float]:
    return [run[key] for run in row.get("repeats") or [] if run.get(key) is not None]


def verdict(verified: list[dict]) -> str | None:
    """Whether the winner (the first row) is ahead of the runner-up beyond the measured noise: its 95% interval
    of the median objective clears the runner-up's; else a tie within the noise, and what picked the winner."""
    if len(verified) < 2:
        return None
    key, label = compared(verified)[0]
    winner, runner = verified[0], verified[1]
    if winner["feasible"] and not runner["feasible"]:
        return (
            f"winner ahead: trial {winner['trial']} met the SLAs on its measured medians, the runner-up "
            f"(trial {runner['trial']}) did not"
        )
    w, r = winner["metrics"].get(key) or 0.0, runner["metrics"].get(key) or 0.0
    wi, ri = median_interval(run_values(winner, key)), median_interval(run_values(runner, key))
    if wi is None or ri is None:
        return (
            f"winner ahead of trial {runner['trial']} by {w - r:.3f} on {label} in one run each: no "
            "interval to judge it by (--verify-repeats 3 measures one)"
        )
    span = f"95% intervals of the median {wi[0]:.3f}-{wi[1]:.3f} vs {ri[0]:.3f}-{ri[1]:.3f}"
    if wi[0] > ri[1]:
        return f"winner ahead of trial {runner['trial']} on {label}: {w:.3f} vs {r:.3f} ({span})"
    picked = "the higher median" if round(w, 9) != round(r, 9) else "more SLA headroom (equal medians)"
    return (
        f"tied within the measured noise with trial {runner['trial']} on {label}: {w:.3f} vs {r:.3f} "
        f"({span}); picked on {picked}"
    )


def slots_text(row: dict) -> str:
    """Where a verified configuration's runs were measured, e.g. 'slot 0 x2, slot 1 x1'."""
    counts: dict[str, int] = {}
    for run in row.get("repeats") or [row["metrics"]]:
        if run.get("slot"):
            name = run["slot"].split(" (")[0]
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def repeat_count(verified: list[dict]) -> int:
    """Runs per verified configuration (--verify-repeats, as the rows recorded it; 0 before any)."""
    return max(map(runs, verified), default=0)


def change_pct(searched: float | None, measured: float | None, digits: int = 0) -> str:
    """(searched - measured) / measured, signed, or '-' when either is missing."""
    return "-" if searched is None or not measured else f"{100 * (searched - measured) / measured:+.{digits}f}%"


def print_remeasured(verified: list[dict], searched: str) -> None:
    """The terminal's account: searched -> measured per configuration, the run-to-run spread, the winner."""
    runs_each, figures = repeat_count(verified), compared(verified)
    table = Table(
        title=f"re-measured on launched servers: {searched} -> measured"
        + (f" (median of {runs_each} runs)" if runs_each > 1 else "")
    )
    where = any(slots_text(row) for row in verified)
    for column in ["trial", "knobs", *(label for _, label in figures), "SLAs met", *(["runs on"] if where else [])]:
        table.add_column(column, justify="left" if column in ("knobs", "runs on") else "right")
    for row in verified:
        cells = [
            "-"
            if (s := row["searched"].get(key)) is None or (m := row["metrics"].get(key)) is None
            else f"{s:,.2f} -> {m:,.2f} ({change_pct(s, m)})"
            for key, _ in figures
        ]
        table.add_row(
            str(row["trial"]),
            row["knobs"],
            *cells,
            "yes" if row["feasible"] else "NO",
            *([slots_text(row)] if where else []),
        )
    console.print(table)
    noise = run_to_run_spread(verified)
    if noise is not None:
        console.print(
            f"measured: the median of {runs_each} runs per configuration; between runs of one "
            f"configuration a figure moved by up to {100 * noise:.0f}% (the server's own noise)",
            soft_wrap=True,
        )
    if verified:
        winner = verified[0]
        console.print(
            f"winner on measured figures: trial {winner['trial']} ({winner['knobs']})"
            + ("" if winner["feasible"] else "; it MISSED the SLAs when measured"),
            soft_wrap=True,
        )
        said = verdict(verified)
        if said:
            console.print(said, soft_wrap=True)


def verified_section(verified: list[dict], searched: str, extra: str = "") -> str:
    """report.html's "Verified by launching" section: searched / measured per figure, the runs' range below."""
    figures = compared(verified)
    head = "".join(f"<th>{label}: {searched} / measured</th>" for _, label in figures)
    lines = ""
    for i, row in enumerate(verified):
        cells = "".join(
            f"<td>{row['searched'].get(k, 0):,.2f} / {row['metrics'].get(k, 0):,.2f} "
            f"({change_pct(row['searched'].get(k), row['metrics'].get(k), 1)})"
            + (f"<br>runs {span[0]:,.2f}-{span[1]:,.2f}" if (span := measured_range(row, k)) else "")
            + (
                f"<br>95% CI of the median {ci[0]:,.2f}-{ci[1]:,.2f}"
                if (ci := median_interval(run_values(row, k)))
                else ""
            )
            + "</td>"
            for k, _ in figures
        )
        lines += (
            f"<tr><td>{row['trial']}{' (winner)' if i == 0 else ''}</td><td>{html.escape(row['knobs'])}</td>"
            f"{cells}<td>{'yes' if row['feasible'] else 'NO'}</td><td>{html.escape(slots_text(row))}</td></tr>"
        )
    said = verdict(verified)
    return (
        "<h2>Verified by launching</h2><p>The winner is the best on the measured figures: with repeated runs "
        "(--verify-repeats), each figure's median over them, the lowest and highest run and a bootstrap 95% "
        "interval of the median below it. It is called ahead only when its interval clears the runner-up's."
        f"{html.escape(extra)}</p>"
        + (f"<p><b>{html.escape(said)}</b></p>" if said else "")
        + f"<table><tr><th>trial</th><th>knobs</th>{head}<th>SLAs met (measured)</th><th>runs on</th></tr>"
        f"{lines}</table>"
    )


def add_to_report(out: Path, body: str) -> None:
    """Append a section to the study's report.html (before </body>)."""
    report = out / "report.html"
    text = report.read_text()
    write_text(text.replace("\n</body>", "\n" + body + "\n</body>", 1), report)
