"""`run`, `compare` and `bench`: one engine config, or several policies, over the same workload, on any
backend; and what they leave on disk (summary.json, requests.parquet, steps.parquet)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from chunkbench.bench.backend import Backend, Serve
from chunkbench.bench.gc_pause import gc_paused
from chunkbench.bench.harness import RunResult
from chunkbench.bench.metrics import probe_figures, step_table, summarize
from chunkbench.engine.config import EngineConfig, default_budget, parse_chunk_schedule
from chunkbench.engine.knobs import KNOBS
from chunkbench.engine.policies import chunks_prompts
from chunkbench.errors import UserError
from chunkbench.files import write_json, write_parquet
from chunkbench.workloads.spec import WorkloadRequest, WorkloadSpec


@dataclass
class BenchRun:
    label: str
    config: EngineConfig | None  # None: a server measured as it is configured
    summary: dict
    result: RunResult
    backend: str = "engine"


def run_benchmark(config: EngineConfig, workload: list[WorkloadRequest], *, backend: Backend, **options) -> BenchRun:
    """One config over one workload on a backend; see `measure` for options."""
    with backend.session(config) as serve:
        return measure(serve, config, workload, backend=str(backend), **options)


def measure(
    serve: Serve,
    config: EngineConfig,
    workload: list[WorkloadRequest],
    *,
    label: str = "run",
    goodput_ms: dict[str, float] | None = None,
    seed: int = 0,
    warmup_steps: int = 3,
    progress: bool = True,
    percentiles=(),
    backend: str = "engine",
    stop=None,
) -> BenchRun:
    """Serve the workload in an open backend session and summarize it (`percentiles`: extra ones to report,
    e.g. an SLA's p90). `stop` (engine and simulator sessions only; see harness.run_workload) may end the run
    early: then the summary is empty."""
    options = {} if stop is None else {"stop": stop}
    result = serve(workload, seed=seed, warmup_steps=warmup_steps, progress=progress, label=label, **options)
    if result.stopped:
        return BenchRun(label, config, {}, result, backend)
    load = [r for r in result.requests if not r.probe]
    summary = summarize(
        load, result.steps, result.duration, goodput_ms, result.num_kv_blocks or None, extra_percentiles=percentiles
    )
    if len(load) < len(result.requests):  # probes in the workload (--probe-request-rate): summarized apart
        summary |= probe_figures(
            [(r.e2el if r.ok else 0.0, None if r.ok else r.error or "no token") for r in result.requests if r.probe],
            percentiles,
        )
    summary |= result.server or {}  # what only the server can see (its queue time) replaces the client's proxy
    return BenchRun(label, config, summary, result, backend)


# 'policy:key=value,...': each knob by its short name (budget, chunk, ...) or its full name.
POLICY_KEYS = {alias: k.name for k in KNOBS.values() if k.short for alias in (k.short, k.name)}


def parse_policy_spec(spec: str) -> tuple[str, dict]:
    """'chunked:budget=512,schedule=2048,1024,512' -> ('chunked', {...}). A bare number continues the
    previous key's list (schedules contain commas)."""
    policy, _, rest = spec.partition(":")
    knobs: dict[str, str] = {}
    key = None
    for part in filter(None, rest.split(",")):
        if "=" in part:
            name, _, value = part.partition("=")
            if name not in POLICY_KEYS:
                raise UserError(f"policy '{spec}': unknown knob '{name}'; use {', '.join(sorted(set(POLICY_KEYS)))}")
            key = POLICY_KEYS[name]
            knobs[key] = value
        elif key is not None and KNOBS[key].type is tuple:
            knobs[key] += "," + part
        else:
            raise UserError(f"policy '{spec}': '{part}' is not key=value")
    overrides: dict = {"policy": policy}
    for key, value in knobs.items():
        if KNOBS[key].type is tuple:
            overrides[key] = parse_chunk_schedule(value)
            continue
        kind = KNOBS[key].type
        try:
            overrides[key] = kind(value)
        except ValueError:
            raise UserError(
                f"policy '{spec}': {key} needs {'a number' if kind is float else 'a whole number'}, got '{value}'"
            ) from None
    return policy, overrides


STEP_SIZING = ("max_num_batched_tokens", "step_time_target_ms")  # a chunked policy with either sizes its steps


def unsized_chunked(specs: list[str]) -> bool:
    """Whether a chunked policy among these specs sets neither a token budget nor a time target itself: only
    such a policy takes a CPU's default step-time target (config_for_policy), so only then is it chosen and
    said (the flags' own budget or target is fit_to_device's to see)."""
    return any(
        chunks_prompts(policy) and not any(knobs.get(k) for k in STEP_SIZING)
        for policy, knobs in map(parse_policy_spec, specs)
    )


def config_for_policy(base: dict, spec: str, chunked_defaults: dict | None = None) -> EngineConfig:
    """The base engine flags with one policy's knobs on top. Policies that never split a prompt get at least
    their default budget, max(2048, max_model_len), unless the spec sets one (vLLM without chunked prefill).
    `chunked_defaults` (device_defaults.fit_to_device: a CPU's step-time target) go to a chunked policy whose
    flags and spec set neither a token budget nor a time target."""
    policy, overrides = parse_policy_spec(spec)
    kwargs = {**base, **overrides}
    if chunks_prompts(policy) and chunked_defaults and not any(kwargs.get(k) for k in STEP_SIZING):
        kwargs |= chunked_defaults
    if "max_num_batched_tokens" not in overrides and not chunks_prompts(policy):
        max_model_len = EngineConfig.create(**{**kwargs, "max_num_batched_tokens": None}).scheduler.max_model_len
        if (kwargs.get("max_num_batched_tokens") or 0) < default_budget(policy, max_model_len):
            kwargs["max_num_batched_tokens"] = None  # the policy's default
    return EngineConfig.create(**kwargs)


def compare(
    base: dict,
    specs: list[str],
    workload: list[WorkloadRequest],
    backend: Backend,
    on_done=None,
    chunked_defaults: dict | None = None,
    **run_kwargs,
) -> list[BenchRun]:
    """The same requests through each policy, one after the other, on one backend (the real engine shares
    one model). `on_done(run)` is called as each policy finishes."""
    if not specs:
        raise UserError("compare: name at least one policy, e.g. static continuous chunked")
    configs = [(spec, config_for_policy(base, spec, chunked_defaults)) for spec in specs]  # validated before any run
    runs = []
    for i, (spec, config) in enumerate(configs):
        label = spec if specs.index(spec) == i else f"{spec}#{specs[: i + 1].count(spec)}"  # a repeat keeps its own
        runs.append(run_benchmark(config, workload, label=label, backend=backend, **run_kwargs))
        if on_done:
            on_done(runs[-1])
    return runs


# ---------- outputs ----------


def describe(config: EngineConfig) -> dict:
    """The config as plain JSON-able values."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def environment() -> dict:
    """Where the run ran. A run that never loaded torch (the simulator, an endpoint) does not import it for
    this (a slow import): torch's version then comes from its package metadata, the device from the platform, and
    threads is the CPU count."""
    if "torch" not in sys.modules:
        from importlib.metadata import PackageNotFoundError, version

        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            torch_version = None
        return {
            "python": platform.python_version(),
            "torch": torch_version,
            "device": platform.processor() or "cpu",
            "machine": platform.machine(),
            "threads": os.cpu_count(),
        }
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }


@gc_paused  # a frame row, a dict and a list per request of a trace
def save_run(run: BenchRun, out_dir: Path, workload_spec: WorkloadSpec | None = None, **extra) -> dict:
    """requests.parquet, steps.parquet, then summary.json (metrics, config, workload, environment, `extra`),
    each written atomically and the summary last: a complete summary.json means complete outputs."""
    write_parquet(requests_frame(run.result), out_dir / "requests.parquet")
    write_parquet(steps_frame(run.result), out_dir / "steps.parquet")
    payload = {
        "label": run.label,
        **run.summary,
        "config": describe(run.config) if run.config else None,
        "backend": run.backend,
        "workload": dataclasses.asdict(workload_spec) if workload_spec else None,
        "environment": environment(),
        "interrupted": run.result.interrupted,
        **extra,
    }
    write_json(payload, out_dir / "summary.json")
    return payload


def steps_frame(result: RunResult) -> pd.DataFrame:
    """One row per step (StepRecord's fields: float64 and int64 columns), and what the step computed, so a run
    compares step by step with another engine's log: `request_ids` (the requests, as workload indices, which
    are their engine ids and requests.parquet's row order when every request finished) and `request_tokens`
    (the tokens each computed), lists in step order."""
    if not result.steps:
        return pd.DataFrame([])  # endpoint runs: as before, a frame without columns
    frame = pd.DataFrame(step_table(result.steps))
    if len(result.step_requests) == len(result.steps):
        frame["request_ids"] = [list(ids) for ids, _ in result.step_requests]
        frame["request_tokens"] = [list(tokens) for _, tokens in result.step_requests]
    return frame


# In the order of requests_frame's row tuple.
REQUEST_COLUMNS = [
    "prompt_len",
    "output_len",
    "arrival_time",
    "first_scheduled_time",
    "ttft",
    "tpot",
    "e2el",
    "num_output_tokens",
    "num_preemptions",
    "num_cached_tokens",
    "num_paused_decodes",
    "error",
    "token_times",
    "send_time",
    "client_queue_time",
    "first_token_time",
    "end_time",
    "output_token_source",
    "response_id",
]


def requests_frame(result: RunResult) -> pd.DataFrame:
    """One row per request, times in s from the run's start. Engine runs fill the scheduler's columns
    (first_scheduled_time, preemptions, cached tokens, paused decodes); endpoint runs the client's (send,
    client queue, end, where the token count came from, the server's response id). A failed request keeps
    the token times it got, without latencies."""
    rows = [
        (
            r.prompt_len,
            r.output_len,
            r.arrival_time,
            r.first_scheduled_time,
            r.ttft if r.ok else None,
            r.tpot if r.ok else None,
            r.e2el if r.ok else None,
            r.output_tokens,
            r.num_preemptions,
            r.num_cached_tokens,
            r.num_paused_decodes,
            r.error,
            r.token_times,
            r.send_time,
            r.client_queue_time,
            r.token_times[0] if r.token_times else None,
            r.end_time,
            r.output_token_source,
            r.response_id,
        )
        for r in result.requests
    ]  # tuples, not a dict per row: a trace has tens of thousands of rows
    if not rows:
        return pd.DataFrame([])
    assert len(rows[0]) == len(REQUEST_COLUMNS), "requests_frame: a row and REQUEST_COLUMNS differ"
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)
