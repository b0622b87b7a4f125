"""The end of a simulated capacity tune: the best few configurations, screened on short runs, settled on long
ones (bench/capacity.py: settle), racing the best steady capacity so far; then the winner's confirmed on a run
longer still, and a step above it (bench/capacity.py: confirm). The rows have tune/verify.py's shape, so the
outputs name the winner on the settled figures as they do on re-measured ones."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import optuna
from rich.console import Console
from rich.table import Table

from chunkbench.bench.capacity import CONFIRM_ABOVE
from chunkbench.bench.probing import Probe
from chunkbench.tune.objectives import get
from chunkbench.tune.objectives.trial import open_run
from chunkbench.tune.report_text import knobs_text
from chunkbench.tune.spec import TuneSpec
from chunkbench.tune.verify import best_distinct, measured_rank
from chunkbench.workloads.spec import build_workload

console = Console()
SETTLE_TOP = 3  # configurations settled on long runs
STEADY = "on long simulated runs (steady state)"


def settle_top(spec: TuneSpec, study: optuna.Study, deadline: float = math.inf) -> list[dict]:
    """The SETTLE_TOP best distinct configurations' steady capacities, best first; empty where nothing is settled
    (an objective other than capacity, a real server, no capacity found, --timeout reached: said)."""
    objective = get(spec.objective)
    if not hasattr(objective, "settle") or not spec.backend.simulated:
        return []
    if time.monotonic() > deadline:
        console.print(
            "[yellow]--timeout reached: the best configurations were not settled on long runs; their capacities "
            "are their short runs' (upper bounds)[/]",
            soft_wrap=True,
        )
        return []
    workload = build_workload(spec.workload, spec.base_config().scheduler.max_model_len)
    rows, floor = [], None
    for trial in best_distinct(spec, study, SETTLE_TOP):
        metrics = trial.user_attrs["metrics"]
        if not metrics.get("capacity_rps") or metrics.get("capacity_steady"):
            continue
        if rows and time.monotonic() > deadline:  # the best one settled; the others would pass --timeout
            break
        console.print(f"settling trial {trial.number} ({knobs_text(trial)}) on long runs ...", soft_wrap=True)
        with open_run(spec, trial.user_attrs["knobs"], workload) as run:
            out = objective.settle(run, metrics, floor)
        rows.append(
            {"trial": trial.number, "knobs": knobs_text(trial), "searched": metrics, "where": STEADY}
            | {"metrics": out.metrics, "values": out.values, "constraints": out.constraints, "feasible": out.feasible}
        )
        if out.metrics["capacity_steady"] and out.feasible:
            floor = max(floor or 0.0, out.values[0])
    limits = {s.name: s.limit_ms for s in spec.slos}
    return sorted(rows, key=lambda r: (not r["metrics"]["capacity_steady"], measured_rank(r, limits)))


def print_settled(rows: list[dict]) -> None:
    table = Table(title="settled on long runs: screened (short runs) -> steady capacity")
    for column in ("trial", "knobs", "capacity req/s", "interval", "steady"):
        table.add_column(column, justify="left" if column == "knobs" else "right")
    for row in rows:
        m = row["metrics"]
        table.add_row(
            str(row["trial"]),
            row["knobs"],
            f"{row['searched']['capacity_rps']:.3g} -> {m['capacity_rps']:.3g}",
            f"{m['capacity_low_rps']:.3g}-{m.get('capacity_high_rps', float('nan')):.3g}",
            "yes" if m["capacity_steady"] else "below the best (an upper bound)",
        )
    console.print(table)
    console.print(settled_margin(rows), soft_wrap=True)


def settled_margin(rows: list[dict]) -> str:
    """The winner against the runner-up on their steady capacities: ahead only where the intervals do not
    overlap."""
    if len(rows) < 2:
        return "Margin: none measured: one configuration was settled on long runs."
    r, (wm, rm) = rows[1], (rows[0]["metrics"], rows[1]["metrics"])
    runner = f"the runner-up (trial {r['trial']}: {r['knobs']})"
    if wm["capacity_low_rps"] > rm.get("capacity_high_rps", float("inf")):
        gain = wm["capacity_rps"] - rm["capacity_rps"]
        return (
            f"Margin: the winner's capacity is {gain:.3g} req/s ({100 * gain / rm['capacity_rps']:.1f}%) ahead of "
            f"{runner}; their intervals do not overlap."
        )
    return f"Margin: none: the winner ties with {runner}: their steady capacities' intervals overlap."


def settled_section(rows: list[dict]) -> str:
    """report.html's account of the settled configurations."""
    import html

    body = "".join(
        f"<tr><td>{r['trial']}</td><td>{html.escape(r['knobs'])}</td><td>{r['searched']['capacity_rps']:.3g}</td>"
        f"<td>{r['metrics']['capacity_rps']:.3g}</td><td>{'yes' if r['metrics']['capacity_steady'] else 'no'}</td></tr>"
        for r in rows
    )
    return (
        "<h2>Settled on long runs</h2><p>Each trial was screened on short runs, which flatter (a server that "
        "starts empty has not met its worst yet); the best few were run long until their verdicts were clear, "
        f"the winner picked on those capacities. {html.escape(settled_margin(rows))}</p><table><tr><th>trial</th>"
        f"<th>knobs</th><th>screened (req/s)</th><th>steady (req/s)</th><th>settled</th></tr>{body}</table>"
    )


@dataclass
class Confirmation:
    trial: int
    capacity: float  # what held over the long run (lowered when the settled one did not)
    low: float
    high: float
    runs: list[Probe]
    note: str

    def payload(self) -> dict:
        """capacity.json: the winner's capacity, its interval and each confirmation run."""
        return {
            "trial": self.trial,
            "capacity_rps": self.capacity,
            "interval_rps": [self.low, None if self.high == float("inf") else self.high],
            "note": self.note,
            "runs": [
                {"rate_rps": p.rate, "requests": p.requests, "draws": p.draws, "held": p.feasible, "why": p.reason}
                | {k: v for k, v in (p.summary or {}).items() if isinstance(v, (int, float)) and k.endswith("_ms")}
                for p in self.runs
            ],
        }

    def lines(self) -> list[str]:
        """What the report and the recommendation's header say."""
        held = next((p for p in self.runs if p.feasible and p.rate <= self.capacity * (1 + 1e-9)), None)
        high = "-" if self.high == float("inf") else f"{self.high:.3g}"
        out = [f"capacity {self.capacity:.3g} req/s ({self.low:.3g}-{high})"]
        if held is not None:
            out[0] += f", confirmed over {held.requests:,} requests" + (
                f" on each of {held.draws} workloads drawn with different seeds" if held.draws > 1 else ""
            )
        above = [p for p in self.runs if p.rate > self.capacity * (1 + CONFIRM_ABOVE / 2)]
        if above and not above[-1].feasible:
            out[0] += f"; {above[-1].rate:.3g} req/s ({CONFIRM_ABOVE:.0%} above) did not hold: {above[-1].reason}"
        if self.note:
            out.append(f"confirmation: {self.note}")
        return out


def confirm_winner(spec: TuneSpec, number: int, knobs: dict, metrics: dict) -> Confirmation | None:
    """The winner's capacity confirmed; None where the objective confirms nothing or nothing met the SLAs."""
    objective = get(spec.objective)
    if not hasattr(objective, "confirm") or not metrics.get("capacity_rps"):
        return None
    workload = build_workload(spec.workload, spec.base_config(**knobs).scheduler.max_model_len)
    with open_run(spec, knobs, workload) as run:
        out, runs, note = objective.confirm(run, metrics)
    m = out.metrics
    return Confirmation(
        number, m["capacity_rps"], m["capacity_low_rps"], m.get("capacity_high_rps", float("inf")), runs, note
    )


def confirmation_section(confirmed: Confirmation) -> str:
    """report.html's section: the confirmation runs, one row each."""
    import html

    rows = ""
    for p in confirmed.runs:
        s = p.summary or {}
        cells = [f"{p.rate:.3g}", f"{p.requests:,}", "yes" if p.feasible else "no", p.reason]
        cells += [
            f"{s[k]:,.0f}" if k in s else "-" for k in ("p99_ttft_ms", "p99_itl_ms", "median_scheduling_delay_ms")
        ]
        rows += "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
    head = "".join(
        f"<th>{h}</th>"
        for h in ("rate (req/s)", "requests", "held", "why not", "p99 TTFT (ms)", "p99 ITL (ms)", "median delay (ms)")
    )
    said = "".join(f"<p>{html.escape(line)}</p>" for line in confirmed.lines())
    return f"<h2>Capacity confirmed</h2>{said}<table><tr>{head}</tr>{rows}</table>"
