"""The per-step overhead of the serving engine being simulated: scheduling, input preparation, kernel launches
and sampling that the GPU waits for. It belongs to the engine, not the GPU (`--engine-overhead`).

Each figure is the CPU-side time one step adds on top of its kernels, for a 7-8B model on one GPU. Every server
kind declares its own beside its source (`overhead_s` in chunkbench/servers/); one engine chunkbench does not
launch is added here, trtllm (OTHER_ENGINES_S): C++ runtimes (TensorRT-LLM, lmdeploy's TurboMind) launch whole
graphs from C++, and their published batch-1 latency tables (docs/guides/simulator.md) fit within 0.1-0.3 ms of
the kernels' time.
"""

from __future__ import annotations

from chunkbench import servers
from chunkbench.errors import UserError

OTHER_ENGINES_S = {"trtllm": 0.2e-3}
DEFAULT_ENGINE = "vllm"  # the tuner's configs target vLLM first


def overheads() -> dict[str, float]:
    """Seconds per step by engine name: the server kinds', then the others'."""
    return {kind.name: kind.overhead_s for kind in servers.kinds()} | OTHER_ENGINES_S


def engine_overhead(value: str | None) -> tuple[float, str]:
    """(seconds per step, label) from --engine-overhead: an engine name, or milliseconds ('0.8' or '0.8ms')."""
    value = (value or DEFAULT_ENGINE).strip().lower()
    known = overheads()
    if value in known:
        return known[value], value
    try:
        ms = float(value.removesuffix("ms"))
    except ValueError:
        raise UserError(
            f"--engine-overhead: '{value}' is neither an engine ({', '.join(known)}) nor milliseconds (e.g. 0.8ms)"
        ) from None
    if not 0 <= ms < 1000:
        raise UserError(f"--engine-overhead: {ms} ms is outside [0, 1000)")
    return ms / 1e3, f"{ms:g} ms"
