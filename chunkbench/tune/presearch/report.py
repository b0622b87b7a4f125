"""What `tune --presearch sim` adds to the study folder: calibration.png (measured against fitted CDFs of TTFT,
ITL and E2EL, per calibration run) and a "Calibration and verification" section in report.html."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from chunkbench.bench.report import embedded_png, pyplot
from chunkbench.files import write_figure
from chunkbench.sim.server_calibration import FIT_TOLERANCE_PCT, ServerCalibration
from chunkbench.tune.presearch.server import stats
from chunkbench.tune.verify_report import add_to_report, change_pct, verified_section

FIGURES = [("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)")]  # per calibration run


def plot_calibration(calibration: ServerCalibration, path: Path) -> None:
    """Empirical CDFs, one column per calibration run: TTFT, ITL and E2EL in rows; solid measured, dashed fitted."""
    plt = pyplot()
    runs = [r for r in calibration.runs if "simulated" in r]
    if not runs:
        return
    figures = [(key, label) for key, label in FIGURES if all(key in r and key in r["simulated"] for r in runs)]
    fig, axes = plt.subplots(len(figures), len(runs), figsize=(4 * len(runs), 3 * len(figures)), squeeze=False)
    for column, run in enumerate(runs):
        for row, (key, label) in enumerate(figures):
            ax = axes[row][column]
            for values, style, name in ((run[key], "-", "measured"), (run["simulated"][key], "--", "simulated")):
                if values:
                    x = np.sort(values)
                    ax.step(x, np.arange(1, len(x) + 1) / len(x), style, where="post", label=name)
            ax.set_xlabel(label)
            ax.set_title(f"{run['name']} run" if row == 0 else "")
            ax.set_ylabel("CDF" if column == 0 else "")
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"calibration fit: {calibration.label()}", fontsize=9)
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)


def drift_text(drift: dict) -> str:
    """server.drift_check's figures, in words."""
    return (
        f"server speed against the calibration: the decode burst's median ITL {drift['median_itl_ms_now']:,.1f} "
        f"ms now, {drift['median_itl_ms_calibrated']:,.1f} ms when calibrated (x{drift['ratio']:.2f})"
    )


def section(calibration: ServerCalibration, verified: list[dict], out: Path, drift: dict | None = None) -> str:
    esc = html.escape
    verdict = (
        "fits: searching in simulation"
        if calibration.fits
        else f"fits BADLY (limits: {FIT_TOLERANCE_PCT:g}% on the tune's workload, {2 * FIT_TOLERANCE_PCT:g}% over "
        "all runs): every trial was launched instead"
    )
    rows = ""
    for run in (r for r in calibration.runs if "simulated" in r):
        for key in (key for key, _ in FIGURES if key in run and key in run["simulated"]):
            m, s = stats(run[key]), stats(run["simulated"][key])
            cells = "".join(f"<td>{m[k]:,.1f} / {s.get(k, 0):,.1f} ({change_pct(s.get(k), m[k], 1)})</td>" for k in m)
            rows += f"<tr><td>{esc(run['name'])}</td><td>{key[:-3].upper()}</td>{cells}</tr>"
    plot = out / "calibration.png"
    body = (
        f"<h2>Calibration on the launched server</h2><p>{esc(calibration.label())}, step overhead "
        f"{calibration.step_overhead_s * 1e3:.2f} ms; max error {calibration.max_error_pct or 0:.1f}%: "
        f"{verdict}.</p>{embedded_png(plot) if plot.exists() else ''}"
        "<table><tr><th>run</th><th>figure</th><th>mean</th><th>median</th><th>p90</th><th>p99</th></tr>"
        f"{rows}</table><p>Cells: measured / simulated (ms).</p>"
    )
    if verified:
        speed = f" After the verifications, on a launch of its own, {drift_text(drift)}." if drift else ""
        body += verified_section(verified, "simulated", speed)
    return body


def write_presearch_outputs(
    out: Path, calibration: ServerCalibration, verified: list[dict], drift: dict | None = None
) -> None:
    """calibration.png and the report's section, after tune/report.py wrote the rest."""
    plot_calibration(calibration, out / "calibration.png")
    add_to_report(out, section(calibration, verified, out, drift))
