"""report.html of a study: the winner and its SLAs, the plots, what was not verified, the feasible trials, why the
others failed, the node's section and the crashed trials."""

from __future__ import annotations

import html
import json

import optuna

from chunkbench.bench.report import embedded_png, html_page
from chunkbench.files import write_text
from chunkbench.tune.node_report import node_section
from chunkbench.tune.report_text import knobs_text, sla_misses, trials_text
from chunkbench.tune.study import closest_trials, feasible_trials, is_feasible


def write_html(spec, study, out_dir, winner, chosen, verified, command, ahead, notes, knob_plot, measured) -> None:
    esc = html.escape
    slo_rows = ""
    if chosen is not None:
        m = measured["metrics"] if measured else chosen.user_attrs["metrics"]
        for slo in (s for s in spec.slos if s.summary_key in m):  # capacity: none when no rate met them
            value = m[slo.summary_key]
            slo_rows += (
                f"<tr><td>{esc(str(slo))}</td><td>{value:,.1f} ms</td>"
                f"<td>{'met' if value <= slo.limit_ms else 'MISSED'}</td></tr>"
            )

    def verified_cell(t) -> str:
        real = verified.get(t.number)
        return f"<td>{esc(json.dumps(real))}</td>" if verified else ""

    runners = "".join(
        f"<tr><td>{t.number}</td><td>{esc(knobs_text(t))}</td><td>{t.values[0]:.3f}</td>{verified_cell(t)}</tr>"
        for t in feasible_trials(study)[:10]
    )
    failed = [t for t in closest_trials(study, spec.slos) if not is_feasible(t)]
    why = "".join(
        f"<tr><td>{t.number}</td><td>{esc(knobs_text(t))}</td>"
        f"<td>{esc('; '.join(sla_misses(t.constraints, spec.slos)))}</td></tr>"
        for t in failed[:30]
    )
    crashed = "".join(
        f"<tr><td>{t.number}</td><td>{esc(t.user_attrs.get('error', 'unknown'))}</td></tr>"
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    )
    title = (
        f"winner: trial {winner.number}, {knobs_text(winner)}"
        if winner
        else f"no {'re-measured configuration' if measured else 'trial'} met the SLA"
        + (f"; closest: trial {chosen.number}, {knobs_text(chosen)}" if chosen else "")
    )
    if measured:
        title += " (on re-measured figures)"
    verified_note = (
        ""
        if verified
        else "<p>Not verified: these figures come from the backend named above "
        "only (verification re-measures the best trials on the real engine when the model runs "
        "on this machine, or relaunched with --backend launch).</p>"
    )
    body = f"""<h1>chunkbench tune: {esc(study.study_name)}</h1><p><code>{esc(command)}</code></p>
<p>{esc(spec.model)}, workload {esc(spec.workload.name)} at {spec.workload.rate} req/s, objective
{spec.objective}, {esc(str(spec.backend))}, {trials_text(study)}.</p>
<h2>{esc(title)}</h2>{f"<p><b>{esc(ahead)}</b></p>" if ahead else ""}
<table><tr><th>SLA</th><th>measured</th><th></th></tr>{slo_rows}</table>
{embedded_png(out_dir / "search.png")}
{
        "<h2>How each knob moves the objective and the SLA metrics</h2>" + embedded_png(out_dir / "knobs.png")
        if knob_plot
        else ""
    }
<h2>What was not verified, and why</h2><ul>{"".join(f"<li>{esc(n)}</li>" for n in notes)}</ul>
<h2>Feasible trials, best first</h2>{verified_note}<table><tr><th>trial</th><th>knobs</th><th>objective</th>
{"<th>verified (re-measured)</th>" if verified else ""}</tr>{runners}</table>
<h2>Why the others failed</h2><table><tr><th>trial</th><th>knobs</th><th>SLA misses</th></tr>{why}</table>"""
    body += node_section(spec, study, out_dir)
    if crashed:
        body += f"<h2>Crashed trials</h2><table><tr><th>trial</th><th>error</th></tr>{crashed}</table>"
    write_text(html_page(f"chunkbench tune {study.study_name}", body), out_dir / "report.html")
