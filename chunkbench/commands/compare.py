"""`chunkbench compare`: several policies over the same requests, at one --rate or across load (each policy's
capacity at the SLA and its latency-load curves, chunkbench/commands/compare_load.py)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer

from chunkbench.backends.choice import resolve
from chunkbench.bench.slo import parse_goodput, parse_slas
from chunkbench.commands.common import announce, console, default_out, load_workload, save_json
from chunkbench.commands.options import (
    ENGINE_OPTIONS,
    RUN_OPTIONS,
    SLA_OPTIONS,
    WORKLOAD_OPTIONS,
    Model,
    pick,
    with_options,
)
from chunkbench.commands.run import run_options, workload_options
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError, check_number
from chunkbench.launch.process import WholeRunsBackend
from chunkbench.workloads.arrivals import MAX_REAL_WAIT_S


@with_options(SLA_OPTIONS)
@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS, workload="rag-mix", num_requests=None, rate=None)
def compare(
    policies: Annotated[
        list[str],
        typer.Argument(
            help="Policies to compare, each optionally with knobs: chunked:budget=512,schedule=2048,1024,512 "
            "(knobs: budget, chunk, schedule, tile, seqs, partial). The first is the baseline of the ratios."
        ),
    ],
    model: Model = "llama-3-8b",
    rates: Annotated[
        str | None,
        typer.Option(
            help="Across load (the default, without --rate): arrival rates "
            "to run each policy at besides its capacity search, e.g. "
            "0.5,1,2,4 (requests/s), or a count of rates spread up to each "
            "policy's saturation throughput, e.g. 4."
        ),
    ] = None,
    **options,
) -> None:
    """Run the same requests through several policies; print one table (a column per policy, ratios against
    the first) and write comparison.json, plots and report.html.

    Without --rate, across load: each policy's capacity at the SLA (the highest arrival rate it sustains,
    searched as `tune --objective capacity` does) and its latency-load curves (load.png); the table is taken at
    the highest rate every policy sustains, and a verdict line compares the capacities. Without an --sla-*,
    the SLA is Sarathi-Serve's relaxed p99 TBT (25x a decode iteration of 32 requests at 4k context, on this
    backend; their strict one is 5x). With --rate R: one run per policy at R req/s. Capacity is the highest rate
    sustained in steady state (docs/concepts/capacity.md), with its interval; a simulator's probes run long.

    Policies that never split a prompt get a budget of at least max-model-len. Unset, the request count and
    (chunked on the CPU) the step size fit the device: the output says what was chosen."""
    o = run_options(options)
    slos = parse_goodput(o["goodput"])
    base, base_config = compare_base(model, options)
    across_load = options["rate"] is None
    max_sched_delay = options["max_sched_delay"]
    slas, sweep_rates, count = check_load_options(
        across_load,
        rates,
        options["sla_percentile"],
        max_sched_delay,
        {k: options["sla_" + k] for k in ("ttft", "tbt", "tpot", "e2el")},
        options["probe_seconds"],
    )
    backend = announce(
        resolve(
            o["backend"],
            model,
            gpu=o["gpu"],
            cost_model=o["cost_model"],
            config=base_config,
            engine_overhead=o["engine_overhead"],
        )
    ).backend
    backend = WholeRunsBackend(backend)  # an interrupted run raises: no verdict from unfinished probes
    spec, requests, knobs = compare_workload(backend, base_config, options, policies, across_load)
    title = f"{model}, {options['workload']}, {len(requests):,} request{'' if len(requests) == 1 else 's'}"
    if across_load:
        compare_load_curves(
            base,
            policies,
            requests,
            spec,
            backend,
            base_config,
            knobs,
            slas,
            max_sched_delay,
            sweep_rates,
            count,
            slos,
            o,
            options["seed"],
            title,
            options["probe_seconds"],
        )
        return
    runs = compare_at_rate(base, policies, requests, backend, knobs, slos, o, options["seed"])
    report_comparison(runs, spec, title, o["out"] or default_out("compare"), o["json_out"])


def compare_base(model: str, options: dict) -> tuple[dict, EngineConfig]:
    """The engine options every compared policy shares (each positional policy sets its own), and their config."""
    engine = pick(options, ENGINE_OPTIONS)
    engine.pop("policy")  # each positional policy sets its own
    base = dict(model=model, **engine)
    return base, EngineConfig.create(**base)


def check_load_options(
    across_load: bool,
    rates: str | None,
    sla_percentile: float,
    max_sched_delay: float,
    slas_ms: dict,
    probe_seconds: float | None = None,
) -> tuple[dict, list[float], int | None]:
    """compare's across-load options, checked before any work: the SLAs, and --rates as rates or a count
    (both only without --rate)."""
    slas = parse_slas(slas_ms, sla_percentile)
    if not across_load and (rates or slas):
        raise UserError("--rates and --sla-* are for compare across load: leave out --rate")
    check_number("--max-sched-delay", max_sched_delay, low=0, low_open=True)
    if probe_seconds is not None:
        if not across_load:
            raise UserError("--probe-seconds is for compare across load: leave out --rate")
        check_number("--probe-seconds", probe_seconds, low=0, low_open=True, high=MAX_REAL_WAIT_S)
    sweep_rates, count = parse_rates(rates)
    return slas, sweep_rates, count


def compare_workload(backend, base_config: EngineConfig, options: dict, policies: list[str], across_load: bool):
    """The requests every policy serves, as many as fit the device for all of compare's runs (said), their
    spec, and the chunked knobs fit_to_device chose."""
    from chunkbench.backends.device_defaults import MIN_REQUESTS, fit_to_device
    from chunkbench.bench.runs import unsized_chunked

    spec, requests = load_workload(
        base_config.scheduler.max_model_len, seed=options["seed"], **workload_options(options)
    )
    runs_each, fewest = (RUNS_PER_POLICY, CPU_FEWEST) if across_load else (1, MIN_REQUESTS)
    requests, knobs, notes = fit_to_device(
        backend, base_config, options, len(policies) * runs_each, unsized_chunked(policies), requests, fewest
    )
    for note in notes:
        console.print(f"[bold yellow]{note}[/]")
    return dataclasses.replace(spec, num_requests=len(requests)), requests, knobs


def compare_load_curves(
    base: dict,
    policies: list[str],
    requests,
    spec,
    backend,
    base_config: EngineConfig,
    knobs: dict,
    slas: dict,
    max_sched_delay: float,
    sweep_rates: list[float],
    count: int | None,
    slos,
    o: dict,
    seed: int,
    title: str,
    probe_seconds: float | None = None,
) -> None:
    """compare across load: each policy's capacity at the SLA and its latency-load curves (one bisection on
    the CPU, where runs near capacity are long)."""
    from chunkbench.backends.device_defaults import on_cpu
    from chunkbench.bench.capacity import BISECTIONS
    from chunkbench.commands.compare_load import compare_across_load

    bisections = CPU_BISECTIONS if on_cpu(backend, base_config) else BISECTIONS
    compare_across_load(
        base,
        policies,
        requests,
        spec,
        backend,
        slas,
        max_sched_delay,
        sweep_rates,
        count,
        bisections,
        knobs,
        seed=seed,
        goodput_ms=slos,
        warmup_steps=o["warmup_steps"],
        out=o["out"] or default_out("compare"),
        json_out=o["json_out"],
        title=title,
        probe_seconds=probe_seconds,
    )


def compare_at_rate(base: dict, policies: list[str], requests, backend, knobs: dict, slos, o: dict, seed: int) -> list:
    """compare at one --rate: one run per policy over the same requests, each said when done."""
    from chunkbench.bench.runs import compare as compare_policies

    return compare_policies(
        base,
        policies,
        requests,
        backend=backend,
        goodput_ms=slos,
        seed=seed,
        chunked_defaults=knobs,
        warmup_steps=o["warmup_steps"],
        progress=not o["no_progress"],
        on_done=lambda r: console.print(
            f"{r.label}: {r.summary['completed']} requests in {r.result.wall_seconds:.1f} s of wall time"
        ),
    )


def report_comparison(runs: list, spec, title: str, out, json_out) -> None:
    """Write compare's files (comparison.json, plots, report.html, a folder per policy) and --json, and print
    the table, failure notes and each run's p99 step against its --step-time-target."""
    from chunkbench.bench.report import comparison_table, failure_notes, write_comparison

    summaries = write_comparison(runs, out, spec, title, "chunkbench compare " + " ".join(sys.argv[2:]))
    console.print(comparison_table(runs, title=title))
    for note in failure_notes(runs):
        console.print(f"[bold yellow]{note}[/]", soft_wrap=True)
    for r in runs:
        target = r.config.scheduler.step_time_target_ms if r.config else None
        if target and "p99_step_ms" in r.summary:
            console.print(
                f"{r.label}: p99 step {r.summary['p99_step_ms']:,.0f} ms against a {target:g} ms target "
                f"({r.summary['p99_step_ms'] / target:.2f}x), longest {r.summary['max_step_ms']:,.0f} ms"
            )
    save_json(json_out, summaries)
    console.print(
        f"wrote {out}/comparison.json, comparison.md, report.html, ttft_cdf.png, itl_cdf.png, "
        "timeline.png, step_times.png and one folder per policy"
    )


# Across load on the CPU engine, a run near capacity lasts its requests over the rate: each policy's sweep is
# sized for this many runs (fit_to_device), as few as CPU_FEWEST requests, and one bisection (said).
RUNS_PER_POLICY, CPU_FEWEST, CPU_BISECTIONS = 6, 4, 1


def parse_rates(text: str | None) -> tuple[list[float], int | None]:
    """--rates: '0.5,1,2' (req/s) or a count '4'."""
    if not text:
        return [], None
    if text.strip().isdigit():
        return [], int(check_number("--rates", int(text), low=1, high=20, integer=True))
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"--rates: '{text}' is neither a count nor a list of rates like 0.5,1,2") from None
    return [check_number("--rates", v, low=0, low_open=True) for v in values], None


def register(app: typer.Typer) -> None:
    app.command()(compare)
