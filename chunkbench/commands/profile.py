"""`chunkbench profile`: time real steps and fit the simulator's cost model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from chunkbench.commands.common import console
from chunkbench.commands.options import Device, Dtype, MaxModelLen, Model, NoProgress, NumBlocks, Seed
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.files import check_writable


def profile(
    model: Model = "small",
    device: Device = "auto",
    dtype: Dtype = "auto",
    max_model_len: MaxModelLen = None,
    num_blocks: NumBlocks = None,
    max_chunk: Annotated[int, typer.Option(help="Largest prefill chunk to time (tokens).")] = 2048,
    repeats: Annotated[
        int,
        typer.Option(
            help="Timed passes over the grid, each in a new random order (after "
            "one warm-up pass); the median per point is kept."
        ),
    ] = 5,
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write the profile. Default: results/profiles/<device>-<model>.json."),
    ] = None,
    cpu_time: Annotated[
        bool,
        typer.Option(
            "--cpu-time",
            help="Time steps in this thread's CPU time on one torch thread (CPU engine only), as the gate "
            "times its engine cases: other processes on a shared machine cannot stretch them.",
        ),
    ] = False,
    seed: Seed = 0,
    no_progress: NoProgress = False,
) -> None:
    """Time real engine steps over a grid of prefill chunks, decode batches and context lengths, fit the
    simulator's cost model (non-negative least squares) and save it with its fit error."""
    from chunkbench.calibration.profile import profile_path, run_profile

    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    if max_chunk < 16:
        raise UserError(f"--max-chunk must be >= 16 tokens (the smallest profiled chunk), got {max_chunk}")
    check_writable(out, "--out")
    config = EngineConfig.create(
        model, max_model_len=max_model_len, num_blocks=num_blocks, device=device, dtype=dtype, seed=seed
    )
    fitted, measured = run_profile(
        config, repeats=repeats, max_chunk=max_chunk, progress=not no_progress, cpu_time=cpu_time
    )
    out = out or Path(profile_path(fitted.device, config.model.name, fitted.clock))
    fitted.save(out)
    table = Table(
        "prefill chunks (tokens@context)",
        "decodes",
        "measured ms",
        "fitted ms",
        "error",
        title=f"{config.model.name} on {fitted.device}: {len(measured)} step shapes",
    )
    for step, seconds in measured:
        predicted = fitted.predict(step)
        table.add_row(
            " ".join(f"{q}@{c}" for q, c in step.prefills) or "-",
            f"{len(step.decodes)} x {step.decodes[0]}" if step.decodes else "-",
            f"{seconds * 1e3:.1f}",
            f"{predicted * 1e3:.1f}",
            f"{(predicted - seconds) / seconds:+.0%}",
        )
    console.print(table)
    fit = fitted.fit
    console.print(
        f"fit: mean error {fit['mean_abs_error_pct']:.1f}%, max {fit['max_abs_error_pct']:.1f}% over "
        f"{fit['points']} shapes; repeated timings of one shape spread {fit['timing_spread_pct']:.1f}% "
        f"(median of max-min over median); a step after an idle pause takes "
        f"{fitted.idle_factor:.2f}x; wrote {out}"
    )


def register(app: typer.Typer) -> None:
    app.command()(profile)
