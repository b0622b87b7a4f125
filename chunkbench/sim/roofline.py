"""The roofline cost model: a step's time from the GPU's datasheet peaks and the model's shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.errors import UserError
from chunkbench.sim.gpus import GPUS, GPUSpec
from chunkbench.sim.shape import StepShape

# Roofline constants. Sources: dense bf16 GEMMs in cuBLAS reach about 70% of the datasheet peak on
# A100/H100 at serving sizes (NVIDIA's published GEMM benchmarks; vLLM and Vidur profiles agree within
# ~10%); FlashAttention-2 reaches 50-73% of peak in its forward pass (Dao 2023, fig. 5), we take 50% for
# short chunks; streaming kernels reach ~80-90% of HBM bandwidth (STREAM-like copies), we take 80%.
GEMM_EFFICIENCY = 0.70
ATTENTION_EFFICIENCY = 0.50
MEMORY_EFFICIENCY = 0.80
TOKEN_TILE = 64  # GEMM tiles quantize the token dimension (CUTLASS/cuBLAS M tiles of 64-128)
STEP_OVERHEAD_S = 0.003  # scheduling, input preparation, launch and sampling per step (vLLM v1 on H100, eager)
ACTIVATION_RESERVE = 0.05  # share of GPU memory kept for activations when sizing the simulated KV cache


@dataclass(frozen=True)
class RooflineCostModel:
    model: ModelConfig
    gpu: GPUSpec
    dtype_bytes: int = 2
    idle_factor: float = 1.0  # no cold-start term: datasheets say nothing of it

    def __str__(self) -> str:
        return f"roofline on {self.gpu.name}"

    def predict(self, step: StepShape) -> float:
        m, gpu = self.model, self.gpu
        tokens = math.ceil(step.num_tokens / TOKEN_TILE) * TOKEN_TILE
        sampled = math.ceil(step.num_sampled / TOKEN_TILE) * TOKEN_TILE
        weights = m.num_linear_params
        head = m.vocab_size * m.hidden_size
        linear_flops = 2 * tokens * weights + 2 * sampled * head
        linear_bytes = (weights + head) * self.dtype_bytes
        t_linear = max(linear_flops / (gpu.bf16_flops * GEMM_EFFICIENCY),
                       linear_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        per_key_bytes = m.kv_bytes_per_token(self.dtype_bytes)
        per_pair_flops = 4 * m.num_layers * m.num_heads * m.head_dim  # QK^T and PV
        t_prefill_attn = max(step.prefill_attention_pairs * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                             step.prefill_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        t_decode_attn = max(step.decode_keys * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                            step.decode_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        return STEP_OVERHEAD_S + t_linear + t_prefill_attn + t_decode_attn

    def kv_blocks(self, config: EngineConfig) -> int:
        """KV blocks that fit beside the weights, as vLLM sizes its cache."""
        m = self.model
        weight_bytes = m.num_params * self.dtype_bytes
        free = self.gpu.mem_bytes * (config.cache.gpu_memory_utilization - ACTIVATION_RESERVE) - weight_bytes
        per_block = config.cache.kv_bytes_per_block(m, self.dtype_bytes)
        if free < per_block:
            raise UserError(f"{m.name} ({weight_bytes / 1e9:.0f} GB of bf16 weights) does not fit on one "
                            f"{self.gpu.name} ({self.gpu.mem_bytes / 1e9:.0f} GB) with room for a KV cache")
        return int(free // per_block)


def gpu_spec(name: str) -> GPUSpec:
    if name not in GPUS:
        raise UserError(f"--gpu: unknown GPU '{name}'; use one of {', '.join(GPUS)}")
    return GPUS[name]
