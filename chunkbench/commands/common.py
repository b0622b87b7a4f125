"""What several commands share: the console, building the workload from its flags, telling the user which
backend runs, default output folders and JSON files."""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path

from rich.console import Console

from chunkbench.bench.backend_choice import Resolved
from chunkbench.bench.workload import WorkloadSpec, build_workload
from chunkbench.errors import UserError
from chunkbench.files import write_json

console = Console()


def load_workload(max_model_len: int | None, workload: str, **fields):
    """The workload spec from the flags and its requests; clipping warnings are shown, not raised."""
    spec = WorkloadSpec(name=workload, **fields)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requests = build_workload(spec, max_model_len)
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    if not requests:
        raise UserError(f"--workload {spec.name}: no requests (check --num-requests and --duration)")
    return spec, requests


def announce(resolved: Resolved) -> Resolved:
    if resolved.note:
        console.print(f"[bold yellow]{resolved.note}[/]")
    return resolved


def default_out(kind: str) -> Path:
    return Path("results/runs") / f"{kind}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def save_json(path: Path | None, payload) -> None:
    """--json: the summary, also at this path."""
    if path:
        write_json(payload, path)


def parse_int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} must list integers >= 1, got '{text}'")
    return values
