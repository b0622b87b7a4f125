"""vLLM's environment as the vLLM tier runs it, in a module of its own (no pytest, no test set-up) for the
scripts that run vLLM too: tests/vllm/conftest.py, scripts/engine_vs_transformers.py and, through
`python -m tests.vllm.env` (which prints it as `export` lines for a shell), scripts/presearch_vs_launch_vllm.sh."""

from __future__ import annotations

import ctypes.util
import os
import shlex


def vllm_env(**extra: str) -> dict[str, str]:
    """What vLLM's CPU build needs to run here: a KV cache size (GiB), no hub, the CPU platform, and the model run
    inside the engine core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's uniprocess executor; `vllm serve`
    still starts the engine core as a process of its own beside the API server's). With a worker process of its
    own, handed each step through shared memory that both sides poll, `vllm serve` on these 2 cores stopped
    streaming for 100-1,200 ms and then sent what it had together in 12 of 16 runs of the calibration's
    workload run as started by default, and in 15 of 18 with no thread binding, one OpenMP thread, or niced to
    10 below the client, while the same requests stepped in one process never took a step over 62
    ms; without the worker process, 0 of 12 runs paused (longest gap 10-70 ms).

    And TCMalloc preloaded, as vLLM's CPU install guide says (scripts/vllm_env.sh installs it). On glibc's malloc
    a step of 2,040 tokens at a budget of 2,048 took 86-90 ms in-process where one of 2,016 took 29-38 (the
    --scan of scripts/vllm_step_costs.py); torch.profiler put the jump in oneDNN's matmuls (2.4x)
    and the elementwise ops (SiLU 4.4x), memory the allocator handed back fresh. With TCMalloc: 29.5-31 ms and
    29-30. The calibration's prefill run steps 2,048 tokens at a time.

    And one OpenMP thread (OMP_NUM_THREADS=1), as vLLM means to serve: its engine core calls
    set_torch_threads_for_runtime ("Reducing Torch threads from 2 to 1 for serving"), but the CPU worker has by
    then replaced torch.set_num_threads with a no-op ("doesn't allow to use `torch.set_num_threads` after the
    thread binding, skip it"), and without the worker process nothing binds: the engine served on two OpenMP
    threads, the second 44-69% busy, against the API server and the client on these 2 cores. Both engine
    threads on one core (taskset) made its median ITL 130 ms instead of 2.6. Set externally, vLLM leaves it
    alone. The tier calibration test with it: fit error 3.6-6.2% and all three held-out figures
    within 15% in 9 of 10 runs (7 within 10%); without it, 21 of 45 runs within 15%
    (docs/measurements/server-calibration-held-out.md)."""
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OMP_NUM_THREADS="1",
    )
    env.pop("TRITON_INTERPRET", None)  # ours, for our kernels' tests; never for vLLM
    tcmalloc = ctypes.util.find_library("tcmalloc_minimal")
    if tcmalloc:
        env["LD_PRELOAD"] = " ".join(filter(None, (tcmalloc, os.environ.get("LD_PRELOAD"))))
    return env | extra


if __name__ == "__main__":  # the variables vllm_env() sets or changes, for `eval "$(python -m tests.vllm.env)"`
    print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in vllm_env().items() if os.environ.get(k) != v))
