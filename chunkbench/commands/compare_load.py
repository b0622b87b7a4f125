"""`chunkbench compare` across load (chunkbench/bench/load_sweep.py): sweep each policy, take the table at the common
rate, say the verdict, write the outputs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from chunkbench.bench.backend import Backend
from chunkbench.bench.capacity import resolution_pct
from chunkbench.bench.load_report import announce_rates, load_payload, load_section, load_table, plot_load, probe_line
from chunkbench.bench.load_sweep import (
    common_rate,
    default_slo,
    run_at_common_rate,
    step_figures,
    sweep_policy,
    verdict,
)
from chunkbench.bench.runs import config_for_policy
from chunkbench.bench.slo import SLO
from chunkbench.commands.common import console, save_json
from chunkbench.errors import StudyFailed, UserError
from chunkbench.files import write_json, write_text


def compare_across_load(
    base: dict,
    policies: list[str],
    requests,
    spec,
    backend: Backend,
    slos: list[SLO],
    max_sched_delay_ms: float,
    rates: list[float],
    count: int | None,
    bisections: int,
    chunked_defaults: dict,
    *,
    seed: int,
    goodput_ms: dict,
    warmup_steps: int,
    out: Path,
    json_out: Path | None,
    title: str,
    probe_seconds: float | None = None,
) -> None:
    from chunkbench.bench.report import failure_notes, write_comparison

    configs = [(label, config_for_policy(base, label, chunked_defaults)) for label in policies]  # validated first
    labels = [
        label if policies.index(label) == i else f"{label}#{policies[: i + 1].count(label)}"
        for i, label in enumerate(policies)
    ]
    rates = list(dict.fromkeys(rates))  # a rate given twice is run once
    pool_note, pool = check_requests(requests, spec, slos, configs[0][1].scheduler.max_model_len, backend, rates)
    if slos:
        sla_note = "SLA: " + " and ".join(map(str, slos))
    else:  # on the requests the probes run: a simulator's own draws where the user's are too few
        slos, sla_note = default_slo(backend, configs[0][1], pool)
    console.print(sla_note, soft_wrap=True)
    announce_rates(console, len(policies), bisections, resolution_pct(bisections), rates, count)
    if pool_note:
        console.print(f"[bold yellow]{pool_note}[/]", soft_wrap=True)
    options = dict(seed=seed, goodput_ms=goodput_ms, warmup_steps=warmup_steps)
    loads = []
    for label, (_, config) in zip(labels, configs):
        console.print(f"{label}:")
        load = sweep_policy(
            label,
            config,
            backend,
            requests,
            slos,
            max_sched_delay_ms,
            rates,
            bisections,
            count,
            on_probe=lambda lb, probe: console.print(probe_line(lb, probe, slos), soft_wrap=True),
            spec=spec,
            probe_seconds=probe_seconds,
            **options,
        )
        console.print(f"{label}: capacity {load.found.interval()} at the SLA", soft_wrap=True)
        if load.found.note:
            console.print(f"{label}: {load.found.note}", soft_wrap=True)
        loads.append(load)
    rate = common_rate(loads)
    if rate is None:
        missed = [load.label for load in loads if load.capacity <= 0]
        run = [p.rate for load in loads for p in load.found.probes if not p.above_ceiling]
        lowest = f"down to {min(run):.3g} req/s" if run else "none is below the saturation throughput"
        raise StudyFailed(
            f"no common rate: {', '.join(missed)} met the SLA at no rate probed ({lowest}); relax the SLA "
            "(--sla-*) or compare at one rate with --rate"
        )
    runs = [
        run_at_common_rate(load, rate, backend, percentiles=[s.percentile for s in slos], **options) for load in loads
    ]
    steps = {run.label: figures for run in runs if (figures := step_figures(run))}
    said = verdict(loads, slos, max_sched_delay_ms, resolution_pct(bisections), steps)
    write_comparison(runs, out, spec, title + f" at {rate:.3g} req/s", "chunkbench " + " ".join(sys.argv[1:]))
    plot_load(loads, slos, out / "load.png")
    payload = load_payload(loads, slos, rate, sla_note, said)
    _add_to_outputs(out, payload, load_section(out, sla_note, said))
    console.print(load_table(runs, loads, rate, title, slos, max_sched_delay_ms))
    for note in failure_notes(runs):
        console.print(f"[bold yellow]{note}[/]", soft_wrap=True)
    console.print(said, soft_wrap=True)
    save_json(json_out, payload)
    console.print(
        f"wrote {out}/load.png, comparison.json, comparison.md, report.html, the CDF and step plots, and "
        "one folder per policy (at the common rate)"
    )


def check_requests(
    requests, spec, slos: list[SLO], max_model_len: int, backend: Backend, rates: list[float]
) -> tuple[str, list]:
    """Before any run: the requests each probe draws on can decide a capacity (else one line: too few, or all
    arriving at once), and each --rates rate's run spans no more time than its clock allows. Returns a note
    when the verdicts cannot be clear or the simulator draws its own requests ('' otherwise), and the requests
    that stand for the workload (the user's, or the simulator's draw where the user's are too few). Without
    --sla-* the SLA is a p99 (default_slo), judged the same way."""
    from chunkbench.bench.probing import check_probe_pool, load_size, probe_pools
    from chunkbench.bench.steady import min_requests
    from chunkbench.workloads.arrivals import MAX_REAL_WAIT_S, MAX_SPAN_S

    judged = slos or [SLO("tbt", 99.0, math.inf)]
    pool, _, _ = probe_pools(requests, spec, judged, max_model_len, backend.simulated)
    note = check_probe_pool(pool, judged)
    drawn = pool is not requests and load_size(requests) < min_requests(judged)  # the simulator's own draws
    if drawn:
        note = (
            f"{len(requests):,} requests are too few for a steady verdict: on the simulator each probe draws its "
            f"own from the workload, up to {load_size(pool):,}"
        )
    longest, limit = load_size(pool), MAX_SPAN_S if backend.simulated else MAX_REAL_WAIT_S
    for rate in rates:
        if longest / rate > limit:
            raise UserError(
                f"--rates {rate:g}: a run of {longest:,} requests at that rate spans {longest / rate:.3g} s of "
                f"arrivals, at most {limit:.3g} s here; give rates of at least {longest / limit:.3g} req/s"
            )
    return note, pool if drawn else requests


def _add_to_outputs(out: Path, payload: dict, section: str) -> None:
    import json

    summary = json.loads((out / "comparison.json").read_text())
    write_json(summary | {"load": payload}, out / "comparison.json")
    report = (out / "report.html").read_text()
    write_text(report.replace("</body>", section + "\n</body>", 1), out / "report.html")
