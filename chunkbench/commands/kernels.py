"""`chunkbench kernels check|bench`: the Triton attention kernels against their torch reference."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table

from chunkbench.commands.common import console, save_json
from chunkbench.commands.options import Device, JsonOut
from chunkbench.errors import UserError

kernels_app = typer.Typer(no_args_is_help=True, help="Check and benchmark the Triton attention kernels.")


@kernels_app.command("check")
def kernels_check(device: Device = "auto") -> None:
    """Run the kernel correctness cases against the torch reference on this device (CPU: the Triton
    interpreter, fp32/fp16 only; CUDA: also bf16)."""
    import os

    import torch

    from chunkbench.engine.config import check_device

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available here")
    from chunkbench.kernels.check import compare_to_reference, standard_cases

    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.startswith("cuda") else [])
    table = Table("case", "max abs error", "result", title=f"paged_attention vs reference on {device}")
    failed = 0
    for name, case in standard_cases(dtypes):
        try:
            table.add_row(name, f"{compare_to_reference(device=device, **case):.2e}", "[green]ok")
        except AssertionError as exc:
            failed += 1
            table.add_row(name, "-", f"[red]FAIL {str(exc).splitlines()[0][:60]}")
    console.print(table)
    if failed:
        raise typer.Exit(1)


@kernels_app.command("bench")
def kernels_bench(json_out: JsonOut = None) -> None:
    """TFLOP/s and GB/s of paged_attention on prefill chunks (256-4096 tokens over 0-32k context) and decode
    batches, against torch SDPA (and flash-attn when installed), with % of the device's peak. CUDA only."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("kernels bench needs a CUDA device; on the CPU run `chunkbench kernels check`")
    from chunkbench.calibration.kernel_bench import run_kernel_bench

    rows = run_kernel_bench()
    table = Table(
        "kind",
        "shape",
        "ours ms",
        "SDPA ms",
        "flash-attn ms",
        "ours / SDPA",
        "TFLOP/s",
        "GB/s",
        "% of peak",
        title=f"paged_attention on {torch.cuda.get_device_name()}, bf16, llama-3-8b heads",
    )
    for r in rows:
        table.add_row(
            r.kind,
            r.shape,
            f"{r.ours_ms:.3f}",
            f"{r.sdpa_ms:.3f}" if r.sdpa_ms else "-",
            f"{r.flash_ms:.3f}" if r.flash_ms else "-",
            f"{r.sdpa_ms / r.ours_ms:.2f}x" if r.sdpa_ms else "-",
            f"{r.tflops:.1f}",
            f"{r.gbps:.0f}",
            f"{r.pct_of_peak:.0f}%" if r.pct_of_peak is not None else "-",
        )
    console.print(table)
    if json_out:
        save_json(json_out, {"device": torch.cuda.get_device_name(), "rows": [dataclasses.asdict(r) for r in rows]})


def register(app: typer.Typer) -> None:
    app.add_typer(kernels_app, name="kernels")
