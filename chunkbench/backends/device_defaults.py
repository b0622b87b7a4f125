"""Defaults that fit the device the real engine runs on, and the cost model it sizes steps with.

vLLM's default token budget (2048) is sized for GPUs: on a CPU a 2048-token step of `small` takes seconds,
so every decode sharing it stalls. On CUDA the defaults stay vLLM's, so results compare with vLLM's; on the
CPU, when neither --max-num-batched-tokens nor --step-time-target is given, `chunked` gets a step-time
target of a few decode steps, from this machine's profile of the model (`chunkbench profile`) or, without
one, a quick calibration of a few dozen steps. The same cost model, corrected online by measured step
times (engine/step_time.py: OnlineCorrection), is what the real engine sizes steps with.
"""

from __future__ import annotations

import os
import statistics

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.shape import StepShape
from chunkbench.errors import UserError
from chunkbench.sim.fitted import FittedCostModel

# A CPU step-time target of this many times the predicted step of DECODE_BATCH decodes: long enough for a
# useful prompt chunk beside a running batch, short enough that decodes never wait seconds (measured on the
# 2-core machine: docs/dynamic-chunking.md).
TARGET_DECODE_MULTIPLE = 1.2
DECODE_BATCH, DECODE_CONTEXT = 8, 512
# Quick calibration: prefill chunks (tokens, cached context), decode batches (size, context), mixed steps.
# Small shapes only (a CPU times each in well under a second): real steps under a target are small too.
QUICK_PREFILLS = [(q, c) for q in (16, 64, 256, 512) for c in (0, 1024)]
QUICK_DECODES = [(b, c) for b in (1, 2, 4, 8, 16) for c in (256, 1024)]
WALL_S, MIN_REQUESTS = 120.0, 8  # the CPU default request count: this much predicted work, at least this many
QUICK_MIXED = [(q, b) for q in (32, 128) for b in (4, 16)]  # a chunk at 0 beside b decodes at 512


def quick_grid(max_model_len: int, num_blocks: int, block_size: int) -> list[StepShape]:
    """The quick calibration's shapes that fit the model's context and the KV cache (sim/profile.step_blocks)."""
    from chunkbench.calibration.profile import step_blocks

    grid = [StepShape(((q, c),), (), 1) for q, c in QUICK_PREFILLS if q + c <= max_model_len]
    grid += [StepShape((), (c,) * b, b) for b, c in QUICK_DECODES if c < max_model_len]
    grid += [StepShape(((q, 0),), (512,) * b, b + 1) for q, b in QUICK_MIXED if 512 < max_model_len]
    return [step for step in grid if step_blocks(step, block_size) <= num_blocks]


def quick_profile(config: EngineConfig, executor, passes: int = 1) -> FittedCostModel:
    """Fit the profile's cost model (sim/fitted.py) to a small grid timed on `executor`: one warm-up pass
    and `passes` timed ones, the median per step. About ten seconds on a 2-core CPU; the online correction
    then absorbs what it gets wrong in scale."""
    from chunkbench.calibration.profile import step_output

    grid = quick_grid(config.scheduler.max_model_len, executor.num_blocks, config.cache.block_size)
    wanted = quick_grid(config.scheduler.max_model_len, 1 << 62, config.cache.block_size)
    if not wanted:
        raise UserError(
            f"--max-model-len {config.scheduler.max_model_len} is shorter than every step the quick "
            "calibration that sizes CPU defaults times: give --max-num-batched-tokens and --num-requests"
        )
    if any(
        any(getattr(s, kind) for s in wanted) and not any(getattr(s, kind) for s in grid)
        for kind in ("prefills", "decodes")
    ):  # the cache, not the context, left out a kind of step
        context = min(c for _, c in QUICK_DECODES)
        raise UserError(
            f"the KV cache ({executor.num_blocks} blocks of {config.cache.block_size} tokens) is too small "
            f"for the quick calibration that sizes CPU defaults (a decode at {context} tokens of context "
            f"needs {-(-context // config.cache.block_size)} blocks): give a larger --num-blocks, or "
            "--max-num-batched-tokens and --num-requests (and no --step-time-target), or run "
            "`chunkbench profile` first"
        )
    outputs = [step_output(step, config.cache.block_size) for step in grid]
    times = [[] for _ in grid]
    for timed in [False] + [True] * passes:
        for i, output in enumerate(outputs):
            seconds = executor.execute(output).seconds
            if timed:
                times[i].append(seconds)
    return FittedCostModel.fit_steps(
        grid,
        [statistics.median(t) for t in times],
        model_name=config.model.name,
        device=str(getattr(executor, "device", "")),
        num_blocks=executor.num_blocks,
    )


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def device_name() -> str:
    """The CUDA device's name, or "cpu": what a saved profile is filed under."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def saved_profile(config: EngineConfig) -> str | None:
    """This machine's `chunkbench profile` of the model, if there is one."""
    from chunkbench.calibration.profile import profile_path

    path = profile_path(device_name(), config.model.name)
    return path if os.path.exists(path) else None


def decode_step_seconds(cost: FittedCostModel) -> float:
    return cost.predict(StepShape((), (DECODE_CONTEXT,) * DECODE_BATCH, DECODE_BATCH))


def default_step_target(cost: FittedCostModel, source: str) -> tuple[float, str]:
    """The CPU default step-time target (ms) and why."""
    decode = decode_step_seconds(cost)
    target = round(TARGET_DECODE_MULTIPLE * decode * 1000)
    return target, (
        f"CPU: chunked sizes steps to --step-time-target {target} ms, {TARGET_DECODE_MULTIPLE:g}x a "
        f"{DECODE_BATCH}-decode step ({decode * 1000:.0f} ms by {source}), instead of vLLM's 2048-token "
        "budget, whose steps take seconds here; pass --max-num-batched-tokens or --step-time-target "
        "to choose"
    )


def request_seconds(cost: FittedCostModel, prompt_len: int, output_len: int) -> float:
    """Predicted work of one request: its prompt as one chunk, its decodes in batches of DECODE_BATCH."""
    prefill = cost.predict(StepShape(((prompt_len, 0),), (), 1))
    return prefill + output_len * decode_step_seconds(cost) / DECODE_BATCH


def default_num_requests(
    requests: list, cost: FittedCostModel, num_runs: int, wall_s: float = WALL_S, minimum: int = MIN_REQUESTS
) -> tuple[int, str]:
    """How many of the workload's requests fit `wall_s` of work over `num_runs` runs on this device, by the
    cost model (policies that batch worse, `static`, take up to twice the estimate: hence the factor 2)."""
    per_run, work, n = wall_s / num_runs, 0.0, 0
    for r in requests:
        work += 2 * request_seconds(cost, r.prompt_len, r.output_len)
        if work > per_run and n >= minimum:
            break
        n += 1
    return n, (
        f"CPU: the first {n} requests by default (about {per_run:.0f} s of predicted work per run, "
        f"{num_runs} run{'s' if num_runs > 1 else ''} in about {wall_s / 60:.0f} minutes); pass "
        "--num-requests to choose"
    )


def on_cpu(backend, config: EngineConfig) -> bool:
    """Whether the real engine runs this config on the CPU."""
    return backend.real_engine and (config.device == "cpu" or (config.device == "auto" and not has_cuda()))


def fit_to_device(
    backend,
    config: EngineConfig,
    options: dict,
    num_runs: int,
    chunked: bool,
    requests: list,
    minimum: int = MIN_REQUESTS,
) -> tuple[list, dict, list[str]]:
    """Defaults for what the user left unset, fitted to where the runs execute: on the CPU the first requests
    that fit a few minutes of work (unless --num-requests), and for `chunked` without a token budget or a
    time target a step-time target. Returns the requests, the chunked knobs to add and lines that say why."""
    sized_by_user = options.get("max_num_batched_tokens") or options.get("step_time_target_ms")
    if not on_cpu(backend, config) or (options.get("num_requests") is not None and (sized_by_user or not chunked)):
        return requests, {}, []  # nothing left to choose: no cost model needed (the quick one takes seconds)
    notes, knobs = [], {}
    cost, source = backend.step_cost_model(config)
    if options.get("num_requests") is None:
        n, note = default_num_requests(requests, cost, num_runs, minimum=minimum)
        requests = requests[:n]
        notes.append(note)
    if chunked and not sized_by_user:
        knobs["step_time_target_ms"], note = default_step_target(cost, source)
        notes.append(note)
    return requests, knobs, notes
