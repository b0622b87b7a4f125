"""The time of one kernel class on one GPU, as a function of its shape: what the roofline (sim/roofline.py) sums
over a step and what the calibration (calibration/gpu_kernels.py) fits to measured operator times. No torch.

A GEMM of M token rows by a K x N weight is neither flat until the compute-bound knee nor a sharp max():
real kernels slow down well before it (fewer tiles than SMs, tile padding, the epilogue). We blend the two
bounds smoothly, t = (compute^k + memory^k)^(1/k) (a "soft max": k -> infinity is the classic roofline,
k = 2 adds ~41% where both bounds are equal), pad M to the GPU's token tile, and add a per-kernel floor (launch
and the smallest grid). Elementwise kernels (RMSNorm, rotary embedding, SiLU*mul, residual adds) stream bytes
per token at their own efficiency, plus the same kind of floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chunkbench.engine.config import ModelConfig
from chunkbench.engine.sharding import heads_per_gpu, intermediate_per_gpu, kv_heads_per_gpu


@dataclass(frozen=True)
class KernelConstants:
    """What the calibration fits per GPU (sim/calibration.json); datasheet defaults where no profile exists."""

    gemm_efficiency: float  # fraction of the dense bf16 peak a large GEMM reaches
    memory_efficiency: float  # fraction of HBM bandwidth a weight-streaming (small-M) GEMM reaches
    smoothness: float  # k of the soft max between the compute and memory bounds
    token_tile: int  # M is padded to this many rows (the GEMM's M tile)
    gemm_floor_s: float  # per GEMM kernel: launch and the smallest grid
    elementwise_efficiency: float  # fraction of HBM bandwidth the norm/rope/activation/add kernels reach
    elementwise_floor_s: float  # per elementwise kernel


def soft_max(compute: float, memory: float, k: float) -> float:
    """(compute^k + memory^k)^(1/k), computed without overflow."""
    top = compute if compute >= memory else memory  # max(), inlined: the simulator calls this every step
    if top <= 0:
        return 0.0
    return top * ((compute / top) ** k + (memory / top) ** k) ** (1.0 / k)


def gemm_seconds(
    rows: int, k: int, n: int, c: KernelConstants, flops: float, bandwidth: float, dtype_bytes: int = 2
) -> float:
    """One [rows, k] x [k, n] GEMM: tile-padded FLOPs against weight + activation bytes, blended, plus a floor."""
    if rows <= 0:
        return 0.0
    padded = math.ceil(rows / c.token_tile) * c.token_tile
    compute = 2.0 * padded * k * n / (flops * c.gemm_efficiency)
    memory = (k * n + rows * (k + n)) * dtype_bytes / (bandwidth * c.memory_efficiency)
    return c.gemm_floor_s + soft_max(compute, memory, c.smoothness)


def layer_gemms(model: ModelConfig, tp: int) -> list[tuple[int, int]]:
    """(K, N) of one decoder layer's GEMMs on one GPU under tensor parallelism (engine/sharding.py's splits):
    fused QKV, attention output, fused gate+up, down."""
    h, d = model.hidden_size, model.head_dim
    q, kv, inter = heads_per_gpu(model, tp) * d, kv_heads_per_gpu(model, tp) * d, intermediate_per_gpu(model, tp)
    return [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]


def layer_linear_seconds(
    model: ModelConfig, tp: int, rows: int, c: KernelConstants, flops: float, bandwidth: float, dtype_bytes: int = 2
) -> float:
    return sum(gemm_seconds(rows, k, n, c, flops, bandwidth, dtype_bytes) for k, n in layer_gemms(model, tp))


# The elementwise kernels of a Llama layer and the bytes each moves per token (read + write, bf16 elements):
# input and post-attention RMSNorm (read h, write h; the whole hidden state on every GPU), rotary embedding on
# q and k (read and write this GPU's q + kv), SiLU(gate) * up (read 2 x intermediate, write 1), and the two
# residual adds (read 2h, write h). Six kernels.
ELEMENTWISE_KERNELS = 6


def layer_elementwise_bytes_per_token(model: ModelConfig, tp: int, dtype_bytes: int = 2) -> int:
    h, d = model.hidden_size, model.head_dim
    q, kv, inter = heads_per_gpu(model, tp) * d, kv_heads_per_gpu(model, tp) * d, intermediate_per_gpu(model, tp)
    return dtype_bytes * (2 * 2 * h + 2 * (q + kv) + 3 * inter + 2 * 3 * h)


def layer_elementwise_seconds(
    model: ModelConfig, tp: int, rows: int, c: KernelConstants, bandwidth: float, dtype_bytes: int = 2
) -> float:
    if rows <= 0:
        return 0.0
    moved = rows * layer_elementwise_bytes_per_token(model, tp, dtype_bytes)
    # Small launches overlap their fixed cost with the streaming of larger ones: blended like the GEMMs, not added.
    return soft_max(
        ELEMENTWISE_KERNELS * c.elementwise_floor_s, moved / (bandwidth * c.elementwise_efficiency), c.smoothness
    )
