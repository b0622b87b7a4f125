"""What `tune --presearch sim` adds to the study folder: calibration.png (measured against fitted CDFs of TTFT,
ITL and E2EL, per calibration run), a "Calibration and verification" section in report.html, and the config files
rewritten for the winner on *measured* figures (tune/report.py writes them for the simulated best first)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from chunkbench.outputs import write_figure, write_text
from chunkbench.report import embedded_png, html_page, pyplot
from chunkbench.sim.server_calibration import FIT_TOLERANCE_PCT, ServerCalibration
from chunkbench.tune import emit
from chunkbench.tune.calibrate import stats
from chunkbench.tune.spec import TuneSpec

FIGURES = [("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)")]  # per calibration run
COMPARED = [("request_goodput", "goodput (req/s)"), ("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_itl_ms", "p99 ITL (ms)")]


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


def measured_range(row: dict, key: str) -> tuple[float, float] | None:
    """The lowest and highest of a verified configuration's repeated runs for one figure (None: one run)."""
    values = [run[key] for run in row.get("repeats") or [] if run.get(key) is not None]
    return (min(values), max(values)) if len(values) > 1 else None


def run_to_run_spread(verified: list[dict]) -> float | None:
    """The largest (highest - lowest) / median of a compared figure over one configuration's repeated runs."""
    spreads = [(span[1] - span[0]) / row["metrics"][key] for row in verified for key, _ in COMPARED
               if (span := measured_range(row, key)) and row["metrics"].get(key)]
    return max(spreads, default=None)


def repeat_count(verified: list[dict]) -> int:
    """Runs per verified configuration (--verify-repeats, as the rows recorded it; 0 before any)."""
    return max((len(row.get("repeats") or []) for row in verified), default=0)


def drift_text(drift: dict) -> str:
    """calibrate.drift_check's figures, in words."""
    return (f"server speed against the calibration: the decode burst's median ITL {drift['median_itl_ms_now']:,.1f} "
            f"ms now, {drift['median_itl_ms_calibrated']:,.1f} ms when calibrated (x{drift['ratio']:.2f})")


def _pct(s: float | None, m: float | None) -> str:
    return "-" if s is None or not m else f"{100 * (s - m) / m:+.1f}%"


def section(calibration: ServerCalibration, verified: list[dict], out: Path, drift: dict | None = None) -> str:
    esc = html.escape
    verdict = ("fits: searching in simulation" if calibration.fits else
               f"fits BADLY (limits: {FIT_TOLERANCE_PCT:g}% on the tune's workload, {2 * FIT_TOLERANCE_PCT:g}% over "
               "all runs): every trial was launched instead")
    rows = ""
    for run in (r for r in calibration.runs if "simulated" in r):
        for key in (key for key, _ in FIGURES if key in run and key in run["simulated"]):
            m, s = stats(run[key]), stats(run["simulated"][key])
            cells = "".join(f"<td>{m[k]:,.1f} / {s.get(k, 0):,.1f} ({_pct(s.get(k), m[k])})</td>" for k in m)
            rows += f"<tr><td>{esc(run['name'])}</td><td>{key[:-3].upper()}</td>{cells}</tr>"
    plot = out / "calibration.png"
    body = (f"<h2>Calibration on the launched server</h2><p>{esc(calibration.label())}, step overhead "
            f"{calibration.step_overhead_s * 1e3:.2f} ms; max error {calibration.max_error_pct or 0:.1f}%: "
            f"{verdict}.</p>{embedded_png(plot) if plot.exists() else ''}"
            "<table><tr><th>run</th><th>figure</th><th>mean</th><th>median</th><th>p90</th><th>p99</th></tr>"
            f"{rows}</table><p>Cells: measured / simulated (ms).</p>")
    if verified:
        head = "".join(f"<th>{label}: simulated / measured</th>" for _, label in COMPARED)
        lines = ""
        for i, row in enumerate(verified):
            cells = "".join(f"<td>{row['simulated'].get(k, 0):,.2f} / {row['metrics'].get(k, 0):,.2f} "
                            f"({_pct(row['simulated'].get(k), row['metrics'].get(k))})"
                            + (f"<br>runs {span[0]:,.2f}-{span[1]:,.2f}" if (span := measured_range(row, k)) else "")
                            + "</td>" for k, _ in COMPARED)
            lines += (f"<tr><td>{row['trial']}{' (winner)' if i == 0 else ''}</td><td>{esc(row['knobs'])}</td>"
                      f"{cells}<td>{'yes' if row['feasible'] else 'NO'}</td></tr>")
        speed = f" After the verifications, on a launch of its own, {drift_text(drift)}." if drift else ""
        body += ("<h2>Verified by launching</h2><p>The winner is the best on the measured figures: with repeated "
                 "runs (--verify-repeats), each figure's median over them, and the lowest and highest run below it."
                 f"{esc(speed)}</p><table>"
                 f"<tr><th>trial</th><th>knobs</th>{head}<th>SLAs met (measured)</th></tr>{lines}</table>")
    return body


def write_presearch_outputs(spec: TuneSpec, out: Path, calibration: ServerCalibration, verified: list[dict],
                            winner: dict | None, command: str = "", drift: dict | None = None) -> None:
    plot_calibration(calibration, out / "calibration.png")
    report = out / "report.html"
    body = section(calibration, verified, out, drift)
    if report.exists():
        text = report.read_text()
        write_text(text.replace("\n</body>", "\n" + body + "\n</body>", 1), report)
    else:
        write_text(html_page("chunkbench tune calibration", body), report)
    if winner is None:
        return
    config = spec.base_config(**_knobs(winner))
    m = winner["metrics"]
    header = [f"chunkbench tune --presearch sim: trial {winner['trial']}, the best of {len(verified)} verified "
              "on a launched server", f"SLA: {', '.join(map(str, spec.slos)) or 'no SLA'}"
              + ("" if winner["feasible"] else " (MISSED when measured)"),
              f"measured: goodput {m.get('request_goodput', 0):.3f} req/s, p99 TTFT {m.get('p99_ttft_ms', 0):,.0f} ms, "
              f"p99 ITL {m.get('p99_itl_ms', 0):,.0f} ms", f"command: {command}"]
    write_text(emit.chunkbench_toml(config, header), out / "recommended.toml")
    write_text(emit.vllm_yaml(config, header), out / "vllm.yaml")
    write_text(emit.vllm_flags(config) + "\n", out / "vllm_flags.txt")
    write_text(emit.sglang_flags(config) + "\n", out / "sglang.txt")


def _knobs(row: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in row["engine_knobs"].items()}
