"""What several commands share: the console, building the workload from its flags, telling the user which
backend runs, default output folders and JSON files."""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path

from rich.console import Console

from chunkbench.backends.choice import Resolved
from chunkbench.errors import UserError
from chunkbench.files import write_json
from chunkbench.workloads.spec import WorkloadSpec, build_workload, clip_to_model

console = Console()


def load_workload(max_model_len: int | None, workload: str, **fields):
    """The workload spec from the flags and its requests; clipping warnings are shown, not raised. An unset
    --rate (None) is the spec's default; a rate given beside a ramp-up is refused, as vllm bench serve's
    main_async refuses it (its own default, inf, is the one rate it takes there)."""
    rate = fields.pop("rate", None)
    if fields.get("ramp_up_strategy") is not None and rate is not None and rate != float("inf"):
        raise UserError(
            "--request-rate: leave it out with --ramp-up-strategy, whose start and end rates set each request's "
            "rate (vllm bench serve refuses both too)"
        )
    spec = WorkloadSpec(name=workload, **fields, **({} if rate is None else {"rate": rate}))
    requests = _warnings_shown(build_workload, spec, max_model_len)
    if not requests:
        raise UserError(f"--workload {spec.name}: no requests (check --num-requests and --duration)")
    return spec, requests


def clip_shown(requests: list, max_model_len: int) -> list:
    """The requests clipped to max_model_len (workload.clip_to_model), how many said."""
    return _warnings_shown(clip_to_model, requests, max_model_len)


def _warnings_shown(build, *args):
    """build(*args), its warnings shown as lines, not raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build(*args)
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    return result


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
