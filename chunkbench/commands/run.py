"""`chunkbench run`: one config over one workload; and the workload and run options it shares with `compare`
(chunkbench/commands/compare.py)."""

from __future__ import annotations

import dataclasses

import typer

from chunkbench.backends.choice import resolve
from chunkbench.bench.slo import parse_goodput
from chunkbench.commands.common import announce, console, default_out, load_workload, save_json
from chunkbench.commands.options import (
    ENGINE_OPTIONS,
    RUN_OPTIONS,
    WORKLOAD_OPTIONS,
    Model,
    pick,
    with_options,
)
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.policies import chunks_prompts
from chunkbench.errors import check_number
from chunkbench.files import check_writable


@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS, num_requests=None)
def run(model: Model = "small", **options) -> None:
    """Serve one workload with one engine config; print the metrics and write summary.json,
    requests.parquet and steps.parquet. Unset, the request count and (chunked on the CPU) the step size
    fit the device: the output says what was chosen."""
    from chunkbench.backends.device_defaults import fit_to_device
    from chunkbench.bench.report import comparison_table, failure_notes
    from chunkbench.bench.runs import run_benchmark, save_run

    o = run_options(options)
    slos = parse_goodput(o["goodput"])
    config = EngineConfig.create(model, **pick(options, ENGINE_OPTIONS))
    backend = announce(
        resolve(
            o["backend"],
            model,
            gpu=o["gpu"],
            cost_model=o["cost_model"],
            config=config,
            engine_overhead=o["engine_overhead"],
        )
    ).backend
    seed, workload = options["seed"], options["workload"]
    spec, requests = load_workload(config.scheduler.max_model_len, seed=seed, **workload_options(options))
    requests, knobs, notes = fit_to_device(
        backend, config, options, 1, chunks_prompts(config.scheduler.policy), requests
    )
    for note in notes:
        console.print(f"[bold yellow]{note}[/]")
    config = EngineConfig.create(model, **{**pick(options, ENGINE_OPTIONS), **knobs}) if knobs else config
    spec = dataclasses.replace(spec, num_requests=len(requests))
    result = run_benchmark(
        config,
        requests,
        label=config.scheduler.policy,
        goodput_ms=slos,
        seed=seed,
        warmup_steps=o["warmup_steps"],
        progress=not o["no_progress"],
        backend=backend,
    )
    out = o["out"] or default_out("run")
    payload = save_run(result, out, spec)
    console.print(comparison_table([result], title=f"{model}, {workload}, {len(requests)} requests"))
    for note in failure_notes([result]):
        console.print(f"[bold yellow]{note}[/]", soft_wrap=True)
    if backend.simulated:
        steps, wall = result.summary["num_steps"], result.result.wall_seconds
        console.print(
            f"simulated {steps:,} steps ({result.summary['duration']:,.0f} s of virtual time) in "
            f"{wall:.1f} s of wall time: {steps / max(wall, 1e-9):,.0f} steps/s"
        )
    save_json(o["json_out"], payload)
    console.print(f"wrote {out}/summary.json, requests.parquet, steps.parquet")
    if result.result.interrupted:
        raise typer.Exit(130)


def workload_options(options: dict) -> dict:
    """The workload flags; an unset --num-requests is the workload's default of 100 (fit_to_device may take
    fewer on the CPU)."""
    given = options.get("num_requests")
    fields = pick(options, WORKLOAD_OPTIONS) | {"num_requests": 100 if given is None else given}
    return {k: v for k, v in fields.items() if not (k == "rate" and v is None)}  # compare across load: its own


def run_options(options: dict) -> dict:
    """The options of how a run executes and where it writes, checked before any work."""
    o = pick(options, RUN_OPTIONS)
    check_writable(o["out"], "--out", folder=True)
    check_writable(o["json_out"], "--json")
    check_number("--warmup-steps", o["warmup_steps"], low=0)
    return o


def register(app: typer.Typer) -> None:
    app.command()(run)
