"""The per-step overhead of the serving engine being simulated: scheduling, input preparation, kernel launches
and sampling that the GPU waits for. It belongs to the engine, not the GPU (`--engine-overhead`).

Each figure is the CPU-side time one step adds on top of its kernels, for a 7-8B model on one GPU:
- vllm 1.5 ms: vLLM's V1 blog puts Llama-8B's GPU time per step on an H100 at ~5 ms and names the CPU work
  around it (scheduling, input preparation, detokenizing) as the remaining bottleneck
  (https://blog.vllm.ai/2025/01/27/v1-alpha-release.html); against measured 1-request decode steps the
  overhead lies between 1.2 and 2.2 ms (docs/guides/simulator.md, "Calibration against real GPU kernels");
  we take the middle.
- sglang 0.4 ms: SGLang v0.4's overlap scheduler runs the CPU scheduling of step n+1 while the GPU runs step n
  (its release post on lmsys.org's blog, "zero-overhead batch scheduler", linked in docs/guides/simulator.md);
  what remains is the CUDA-graph replay and sampling hand-off, taken as a few hundred microseconds.
- trtllm 0.2 ms: C++ runtimes (TensorRT-LLM, lmdeploy's TurboMind) launch whole graphs from C++; their
  published batch-1 latency tables (docs/guides/simulator.md) fit within 0.1-0.3 ms of the kernels' time.
- chunkbench 3 ms: this repository's engine (Python scheduler, eager PyTorch launches).
"""

from __future__ import annotations

from chunkbench.errors import UserError

ENGINE_OVERHEAD_S = {"vllm": 1.5e-3, "sglang": 0.4e-3, "trtllm": 0.2e-3, "chunkbench": 3.0e-3}
DEFAULT_ENGINE = "vllm"  # the tuner's configs are emitted for vLLM first (tune/emit.py)


def engine_overhead(value: str | None) -> tuple[float, str]:
    """(seconds per step, label) from --engine-overhead: an engine name, or milliseconds ('0.8' or '0.8ms')."""
    value = (value or DEFAULT_ENGINE).strip().lower()
    if value in ENGINE_OVERHEAD_S:
        return ENGINE_OVERHEAD_S[value], value
    try:
        ms = float(value.removesuffix("ms"))
    except ValueError:
        raise UserError(
            f"--engine-overhead: '{value}' is neither an engine ({', '.join(ENGINE_OVERHEAD_S)}) "
            "nor milliseconds (e.g. 0.8ms)"
        ) from None
    if not 0 <= ms < 1000:
        raise UserError(f"--engine-overhead: {ms} ms is outside [0, 1000)")
    return ms / 1e3, f"{ms:g} ms"
