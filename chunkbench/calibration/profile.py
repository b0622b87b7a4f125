"""`chunkbench profile`: time real engine steps over a designed grid and fit the simulator's cost model.

Each grid point is one step shape (prefill chunks with cached context, decodes with context lengths) run
straight through the model executor. A warm-up pass over the grid, then `repeats` timed passes, each in a
fresh random order, and the median per point: a slow spell of a shared machine (they last seconds) then
lands on different points in each pass instead of biasing a few. Points whose keys would not fit in the KV
cache are left out: no real run can make them.
"""

from __future__ import annotations

import random
import statistics
import time

from rich.progress import Progress

from chunkbench.engine.block_manager import cdiv
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import CpuClock
from chunkbench.engine.outputs import ScheduledChunk, SchedulerOutput
from chunkbench.engine.request import SamplingParams
from chunkbench.errors import UserError
from chunkbench.sim.cost_model import COLD_AFTER_S, StepShape
from chunkbench.sim.fitted import FittedCostModel

CHUNKS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)  # shapes the KV cache cannot hold are left out
CONTEXTS = (0, 1024, 4096)
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (128, 1024, 4096)
MIXED_DECODES = (
    (4096, 256),
    (2048, 256, 256),
    (4096, 1024, 256, 128),
    (3000, 1500, 700, 300, 128, 128),
    (4096,) + (256,) * 15,
    (2048,) * 4 + (128,) * 28,
)  # several length buckets in one step


def profile_grid(max_model_len: int, max_chunk: int, num_blocks: int, block_size: int) -> list[StepShape]:
    """The profiled shapes that fit the model's context, the chunk cap and the KV cache (step_blocks)."""

    def shape(prefills=(), decodes=()):
        return StepShape(tuple(prefills), tuple(decodes), len(prefills) + len(decodes))

    grid = [shape([(q, ctx)]) for q in CHUNKS for ctx in CONTEXTS if q <= max_chunk and q + ctx <= max_model_len]
    grid += [shape(decodes=[ctx] * b) for b in DECODE_BATCHES for ctx in DECODE_CONTEXTS if ctx < max_model_len]
    grid += [
        shape([(q, ctx)], [512] * b)
        for b in (4, 16)
        for q in (64, 256, 1024)
        for ctx in (0, 1024)
        if q <= max_chunk and q + ctx <= max_model_len
    ]
    grid += [shape(decodes=d) for d in MIXED_DECODES if max(d) < max_model_len]
    grid += [shape([(q, 0)] * k) for q, k in ((128, 2), (128, 4), (64, 8), (256, 4)) if q * k <= max_chunk]
    return [step for step in grid if step_blocks(step, block_size) <= num_blocks]


def step_blocks(step: StepShape, block_size: int) -> int:
    """The KV blocks step_output gives a step of this shape: each request its own, for its whole context."""
    return sum(cdiv(q + ctx, block_size) for q, ctx in step.prefills) + sum(
        cdiv(ctx, block_size) for ctx in step.decodes
    )


def step_output(step: StepShape, block_size: int) -> SchedulerOutput:
    """A SchedulerOutput of this shape. Every request gets blocks of its own, as in a real run: requests
    sharing blocks would read the same memory, which caches well and makes steps look cheaper."""
    sampling = SamplingParams(max_tokens=1)
    next_block = 0

    def chunk(i, tokens, start, decode):
        nonlocal next_block
        blocks = list(range(next_block, next_block + cdiv(start + tokens, block_size)))
        next_block += len(blocks)
        return ScheduledChunk(
            f"r{i}",
            [1] * tokens,
            start,
            blocks,
            sample=True,
            is_decode=decode,
            sampling=sampling,
            sample_index=0,
            sample_seed=0,
        )

    chunks = [chunk(i, q, ctx, False) for i, (q, ctx) in enumerate(step.prefills)]
    chunks += [chunk(len(chunks) + i, 1, ctx - 1, True) for i, ctx in enumerate(step.decodes)]
    return SchedulerOutput(chunks=chunks)


def run_profile(
    config: EngineConfig, repeats: int = 5, max_chunk: int = 2048, progress: bool = True, cpu_time: bool = False
) -> tuple[FittedCostModel, list[tuple[StepShape, float]]]:
    """`cpu_time`: time steps in this thread's CPU time on one torch thread, as the engine does under
    engine.CpuClock (the gate's clock): a profile for runs timed that way, which other processes on a
    shared machine cannot stretch. Such runs never sleep, so nothing goes cold: the idle factor is 1."""
    from chunkbench.engine.executor import one_torch_thread

    with one_torch_thread(cpu_time):
        return _profile(config, repeats, max_chunk, progress, cpu_time)


def _profile(
    config: EngineConfig, repeats: int, max_chunk: int, progress: bool, cpu_time: bool
) -> tuple[FittedCostModel, list[tuple[StepShape, float]]]:
    from chunkbench.engine.executor import ModelExecutor, resolve_device

    if cpu_time and resolve_device(config.device).type != "cpu":  # before the model takes GPU memory
        raise UserError("--cpu-time times steps in this thread's CPU time: it is for the CPU engine only")
    executor = ModelExecutor(config)
    if cpu_time:
        executor.timer = CpuClock.timer  # as the engine times steps on its CPU clock
    block_size = config.cache.block_size
    grid = profile_grid(config.scheduler.max_model_len, max_chunk, executor.num_blocks, block_size)
    wanted = profile_grid(config.scheduler.max_model_len, max_chunk, 1 << 62, block_size)
    if not wanted:
        raise UserError(
            f"no step shape of the profile fits --max-model-len {config.scheduler.max_model_len} and "
            f"--max-chunk {max_chunk} (the smallest is a 16-token chunk, or a decode at 128 tokens of "
            "context): raise them"
        )
    if 2 * len(grid) < len(wanted):  # a fit on the few smallest shapes would say little of the rest
        raise UserError(
            f"the KV cache ({executor.num_blocks} blocks of {block_size} tokens) holds only {len(grid)} "
            f"of the {len(wanted)} step shapes the profile times: give --num-blocks "
            f"{sorted(step_blocks(step, block_size) for step in wanted)[(len(wanted) - 1) // 2]} or more"
        )
    outputs = [step_output(step, block_size) for step in grid]
    times: list[list[float]] = [[] for _ in grid]
    rng = random.Random(config.seed)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("profiling steps", total=(repeats + 1) * len(grid))
        for timed in [False] + [True] * repeats:
            order = list(range(len(grid)))
            rng.shuffle(order)
            for i in order:
                seconds = executor.execute(outputs[i]).seconds
                if timed:
                    times[i].append(seconds)
                bar.advance(task)
    measured = [(step, statistics.median(t)) for step, t in zip(grid, times)]
    spread = [(max(t) - min(t)) / statistics.median(t) for t in times]
    device = str(executor.device) if executor.device.type == "cpu" else _cuda_name()
    model = FittedCostModel.fit_steps(
        [s for s, _ in measured],
        [t for _, t in measured],
        model_name=config.model.name,
        device=device,
        num_blocks=executor.num_blocks,
        noise_pct=100 * statistics.median(spread),
        idle_factor=1.0 if cpu_time else idle_factor(executor, block_size, max_chunk),
        clock="cpu" if cpu_time else "wall",
    )
    return model, measured


def idle_factor(executor, block_size: int, max_chunk: int, repeats: int = 5) -> float:
    """How much slower a step runs after the engine sat idle (clocks and caches go cold; measured:
    docs/guides/simulator.md): the median over a few shapes of (step after an idle pause) / (the same step hot)."""
    shapes = [
        StepShape(((min(256, max_chunk), 0),), (), 1),
        StepShape(((min(64, max_chunk), 0),), (), 1),
        StepShape((), (256,) * 3, 3),
    ]
    shapes = [step for step in shapes if step_blocks(step, block_size) <= executor.num_blocks]
    ratios = []
    for step in shapes:
        output = step_output(step, block_size)
        hot = statistics.median(executor.execute(output).seconds for _ in range(repeats))
        cold = []
        for _ in range(repeats):
            time.sleep(2 * COLD_AFTER_S)
            cold.append(executor.execute(output).seconds)
        ratios.append(statistics.median(cold) / hot)
    return max(1.0, statistics.median(ratios)) if ratios else 1.0


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def profile_path(device: str, model: str, clock: str = "wall") -> str:
    """Where `profile` saves and `tune` looks: results/profiles/<device>-<model>.json; a CPU-time profile
    (--cpu-time) beside it as <device>-<model>-cpu-time.json, so runs timed in wall time never pick it up."""
    safe = device.lower().replace(" ", "-").replace("/", "-")
    return f"results/profiles/{safe}-{model}{'-cpu-time' if clock == 'cpu' else ''}.json"
