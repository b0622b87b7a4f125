"""`chunkbench run` and `chunkbench compare`: one config, or several policies, over one workload."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer

from chunkbench.backend_choice import resolve
from chunkbench.commands.common import announce, console, default_out, load_workload, save_json
from chunkbench.commands.options import ENGINE_OPTIONS, RUN_OPTIONS, WORKLOAD_OPTIONS, Model, pick, with_options
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import check_number
from chunkbench.outputs import check_writable
from chunkbench.slo import parse_goodput


@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS, num_requests=None)
def run(model: Model = "small", **options) -> None:
    """Serve one workload with one engine config; print the metrics and write summary.json,
    requests.parquet and steps.parquet. Unset, the request count and (chunked on the CPU) the step size
    fit the device: the output says what was chosen."""
    from chunkbench.device_defaults import fit_to_device
    from chunkbench.report import comparison_table, failure_notes
    from chunkbench.runs import run_benchmark, save_run

    o = run_options(options)
    slos = parse_goodput(o["goodput"])
    config = EngineConfig.create(model, **pick(options, ENGINE_OPTIONS))
    backend = announce(resolve(o["backend"], model, gpu=o["gpu"], cost_model=o["cost_model"], config=config,
                               engine_overhead=o["engine_overhead"])).backend
    seed, workload = options["seed"], options["workload"]
    spec, requests = load_workload(config.scheduler.max_model_len, seed=seed, **workload_options(options))
    requests, knobs, notes = fit_to_device(backend, config, options, 1, config.scheduler.policy == "chunked", requests)
    for note in notes:
        console.print(f"[bold yellow]{note}[/]")
    config = EngineConfig.create(model, **{**pick(options, ENGINE_OPTIONS), **knobs}) if knobs else config
    spec = dataclasses.replace(spec, num_requests=len(requests))
    result = run_benchmark(config, requests, label=config.scheduler.policy, goodput_ms=slos, seed=seed,
                           warmup_steps=o["warmup_steps"], progress=not o["no_progress"], backend=backend)
    out = o["out"] or default_out("run")
    payload = save_run(result, out, spec)
    console.print(comparison_table([result], title=f"{model}, {workload}, {len(requests)} requests"))
    for note in failure_notes([result]):
        console.print(f"[bold yellow]{note}[/]", soft_wrap=True)
    if backend.kind == "sim":
        steps, wall = result.summary["num_steps"], result.result.wall_seconds
        console.print(f"simulated {steps:,} steps ({result.summary['duration']:,.0f} s of virtual time) in "
                      f"{wall:.1f} s of wall time: {steps / max(wall, 1e-9):,.0f} steps/s")
    save_json(o["json_out"], payload)
    console.print(f"wrote {out}/summary.json, requests.parquet, steps.parquet")
    if result.result.interrupted:
        raise typer.Exit(130)


@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS, workload="rag-mix", num_requests=None)
def compare(
    policies: Annotated[list[str], typer.Argument(
        help="Policies to compare, each optionally with knobs: chunked:budget=512,schedule=2048,1024,512 "
        "(knobs: budget, chunk, schedule, tile, seqs, partial). The first is the baseline of the ratios.")],
    model: Model = "small",
    **options,
) -> None:
    """Run the same requests through several policies; print one table (a column per policy, ratios against
    the first) and write comparison.json, plots and report.html. Policies that never split a prompt get a
    budget of at least max-model-len. Unset, the request count and (chunked on the CPU) the step size fit
    the device: the output says what was chosen."""
    from chunkbench.device_defaults import fit_to_device
    from chunkbench.report import comparison_table, failure_notes, write_comparison
    from chunkbench.runs import compare as compare_policies, unsized_chunked

    o = run_options(options)
    slos = parse_goodput(o["goodput"])
    engine = pick(options, ENGINE_OPTIONS)
    engine.pop("policy")  # each positional policy sets its own
    base = dict(model=model, **engine)
    seed, workload = options["seed"], options["workload"]
    base_config = EngineConfig.create(**base)
    backend = announce(resolve(o["backend"], model, gpu=o["gpu"], cost_model=o["cost_model"],
                               config=base_config, engine_overhead=o["engine_overhead"])).backend
    spec, requests = load_workload(base_config.scheduler.max_model_len, seed=seed, **workload_options(options))
    requests, knobs, notes = fit_to_device(backend, base_config, options, len(policies), unsized_chunked(policies),
                                           requests)
    for note in notes:
        console.print(f"[bold yellow]{note}[/]")
    spec = dataclasses.replace(spec, num_requests=len(requests))
    runs = compare_policies(base, policies, requests, backend=backend, goodput_ms=slos, seed=seed,
                            chunked_defaults=knobs, warmup_steps=o["warmup_steps"], progress=not o["no_progress"],
                            on_done=lambda r: console.print(f"{r.label}: {r.summary['completed']} requests in "
                                                            f"{r.result.wall_seconds:.1f} s of wall time"))
    out = o["out"] or default_out("compare")
    title = f"{model}, {workload}, {len(requests)} requests"
    summaries = write_comparison(runs, out, spec, title, "chunkbench compare " + " ".join(sys.argv[2:]))
    console.print(comparison_table(runs, title=title))
    for note in failure_notes(runs):
        console.print(f"[bold yellow]{note}[/]", soft_wrap=True)
    for r in runs:
        target = r.config.scheduler.step_time_target_ms if r.config else None
        if target and "p99_step_ms" in r.summary:
            console.print(f"{r.label}: p99 step {r.summary['p99_step_ms']:,.0f} ms against a {target:g} ms target "
                          f"({r.summary['p99_step_ms'] / target:.2f}x), longest {r.summary['max_step_ms']:,.0f} ms")
    save_json(o["json_out"], summaries)
    console.print(f"wrote {out}/comparison.json, comparison.md, report.html, ttft_cdf.png, itl_cdf.png, "
                  "timeline.png, step_times.png and one folder per policy")


def workload_options(options: dict) -> dict:
    """The workload flags; an unset --num-requests is the workload's default of 100 (fit_to_device may take
    fewer on the CPU)."""
    given = options.get("num_requests")
    return pick(options, WORKLOAD_OPTIONS) | {"num_requests": 100 if given is None else given}


def run_options(options: dict) -> dict:
    """The options of how a run executes and where it writes, checked before any work."""
    o = pick(options, RUN_OPTIONS)
    check_writable(o["out"], "--out", folder=True)
    check_writable(o["json_out"], "--json")
    check_number("--warmup-steps", o["warmup_steps"], low=0)
    return o


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(compare)
