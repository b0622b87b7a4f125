"""`chunkbench gate`: the CI performance gate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from chunkbench.commands.common import console
from chunkbench.files import check_writable, write_text


def gate(
    suite: Annotated[
        str,
        typer.Option(
            help="Suite file: named cases, each a workload, policy, knobs, backend "
            "and the metrics it guards; or a built-in suite by name (ci)."
        ),
    ] = "ci",
    baseline: Annotated[Path, typer.Option(help="Baseline JSON recorded with --update.")] = Path(
        "results/baselines/ci.json"
    ),
    update: Annotated[
        bool,
        typer.Option(
            "--update", help="Run the suite and rewrite the baseline (with this machine's description and the date)."
        ),
    ] = False,
    junit: Annotated[
        Path | None, typer.Option(help="Write a JUnit XML report: one testcase per guarded metric.")
    ] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown table (e.g. to $GITHUB_STEP_SUMMARY).")
    ] = None,
) -> None:
    """Run the benchmark suite and compare with the baseline: exit 1 on a regression, 0 when clean, 2 on a
    usage error."""
    from chunkbench import gate as gating

    for path, flag in ((junit, "--junit"), (markdown_out, "--markdown"), (baseline if update else None, "--baseline")):
        check_writable(path, flag)
    cases = gating.load_suite(suite)
    verdicts = gating.run_gate(cases, baseline, update)
    table = Table(title=f"chunkbench gate: {suite} against {baseline}")
    for column in ("case", "metric", "baseline", "now", "change", "95% interval", "verdict"):
        table.add_column(column, overflow="fold")
    style = {"REGRESSED": "bold red", "improved": "green", "ok": "default"}
    for v in verdicts:
        table.add_row(
            v.case,
            v.metric,
            f"{v.baseline:.4g}",
            f"{v.now:.4g}",
            f"{v.change:+.1%}",
            f"{v.interval[0]:.4g}..{v.interval[1]:.4g}",
            f"[{style[v.verdict]}]{v.verdict}[/]",
        )
    console.print(table)
    for path, text in ((junit, gating.junit_xml(verdicts)), (markdown_out, gating.markdown(verdicts))):
        if path:
            write_text(text, path)
    regressions = [v for v in verdicts if v.verdict == "REGRESSED"]
    if update:
        console.print(f"baseline written to {baseline}")
    elif regressions:
        for v in regressions:
            print(f"chunkbench gate: REGRESSION {gating.describe(v)}", file=sys.stderr)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(gate)
