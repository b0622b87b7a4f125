"""The roofline cost model: a step's time from the GPU's datasheet peaks and the model's shapes, on one GPU or
split over N GPUs by tensor parallelism (engine/sharding.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from chunkbench.engine.activation import step_activation_bytes
from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.engine.sharding import (ALL_REDUCES_PER_LAYER, check_tensor_parallel, heads_per_gpu,
                                        kv_bytes_per_token_per_gpu, linear_params_per_gpu, params_per_gpu)
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
# NCCL all-reduce reaches ~80% of the link's one-way bandwidth as bus bandwidth on large messages
# (nccl-tests busbw on DGX H100: ~360 of 450 GB/s).
LINK_EFFICIENCY = 0.80
TOKEN_TILE = 64  # GEMM tiles quantize the token dimension (CUTLASS/cuBLAS M tiles of 64-128)
STEP_OVERHEAD_S = 0.003  # scheduling, input preparation, launch and sampling per step (vLLM v1 on H100, eager)
MAX_TP = 64  # the largest --tensor-parallel-size suggested when a model does not fit


def ring_all_reduce_seconds(nbytes: float, tp: int, gpu: GPUSpec) -> float:
    """A ring all-reduce of `nbytes` over `tp` GPUs: a reduce-scatter and an all-gather, 2(N-1) steps that
    each send 1/N of the data: 2(N-1)/N * bytes / bandwidth + 2(N-1) * per-message latency."""
    if tp == 1:
        return 0.0
    steps = 2 * (tp - 1)
    return steps / tp * nbytes / (gpu.link_bandwidth * LINK_EFFICIENCY) + steps * gpu.link_latency


@dataclass(frozen=True)
class RooflineCostModel:
    model: ModelConfig
    gpu: GPUSpec
    dtype_bytes: int = 2
    idle_factor: float = 1.0  # no cold-start term: datasheets say nothing of it
    tensor_parallel_size: int = 1
    kv_dtype_bytes: int = 2  # 1 with --kv-cache-dtype fp8

    def __post_init__(self) -> None:
        check_tensor_parallel(self.model, self.tensor_parallel_size)

    @classmethod
    def for_config(cls, config: EngineConfig, gpu: GPUSpec) -> "RooflineCostModel":
        return cls(config.model, gpu, tensor_parallel_size=config.tensor_parallel_size,
                   kv_dtype_bytes=config.cache.kv_dtype_bytes(2))

    def __str__(self) -> str:
        tp = self.tensor_parallel_size
        return f"roofline on {self.gpu.name}" + (f" x{tp} (tensor parallel over {self.gpu.link})" if tp > 1 else "")

    def predict(self, step: StepShape) -> float:
        """Every GPU computes 1/N of the linear layers and of the attention heads at once, then the layers'
        all-reduces: the step takes one GPU's share plus the communication."""
        m, gpu, tp = self.model, self.gpu, self.tensor_parallel_size
        tokens = math.ceil(step.num_tokens / TOKEN_TILE) * TOKEN_TILE
        sampled = math.ceil(step.num_sampled / TOKEN_TILE) * TOKEN_TILE
        weights = linear_params_per_gpu(m, tp)
        head = m.vocab_size * m.hidden_size if tp == 1 else math.ceil(m.vocab_size / tp) * m.hidden_size
        linear_flops = 2 * tokens * weights + 2 * sampled * head
        linear_bytes = (weights + head) * self.dtype_bytes
        t_linear = max(linear_flops / (gpu.bf16_flops * GEMM_EFFICIENCY),
                       linear_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        per_key_bytes = kv_bytes_per_token_per_gpu(m, tp, self.kv_dtype_bytes)
        per_pair_flops = 4 * m.num_layers * heads_per_gpu(m, tp) * m.head_dim  # QK^T and PV
        t_prefill_attn = max(step.prefill_attention_pairs * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                             step.prefill_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        t_decode_attn = max(step.decode_keys * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                            step.decode_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        t_comm = ALL_REDUCES_PER_LAYER * m.num_layers * ring_all_reduce_seconds(
            step.num_tokens * m.hidden_size * self.dtype_bytes, tp, gpu)
        return STEP_OVERHEAD_S + t_linear + t_prefill_attn + t_decode_attn + t_comm

    def activation_bytes(self, step: StepShape) -> int:
        """Peak activation bytes of a step on one GPU: FlashAttention-style kernels, bf16 (engine/activation.py)."""
        return step_activation_bytes(self.model, step.prefills, step.decodes, step.num_sampled, self.dtype_bytes,
                                     self.tensor_parallel_size, "flash")

    def profile_activation_bytes(self, config: EngineConfig) -> int:
        """What vLLM's profiling run measures before it sizes the cache: one step of max_num_batched_tokens
        prompt tokens over max_num_seqs sequences, each sampled (gpu_model_runner.profile_run: _dummy_run
        then _dummy_sampler_run)."""
        s = config.scheduler
        seqs = min(s.max_num_seqs, s.max_num_batched_tokens)
        per_seq, extra = divmod(s.max_num_batched_tokens, seqs)
        prefills = tuple((per_seq + (i < extra), 0) for i in range(seqs))
        return self.activation_bytes(StepShape(prefills, (), seqs))

    def kv_blocks(self, config: EngineConfig) -> int:
        """KV blocks that fit beside the weights and the activation peak of the configured budget, as vLLM
        sizes its cache: per GPU, gpu_memory_utilization of its memory, less its shard of the weights, less
        the profiling run's activations; a block holds each GPU's share of the KV heads."""
        free = self._free_bytes(config, self.tensor_parallel_size)
        per_block = config.cache.block_size * kv_bytes_per_token_per_gpu(self.model, self.tensor_parallel_size,
                                                                         self.kv_dtype_bytes)
        if free < per_block:
            raise UserError(self._does_not_fit(config, per_block))
        return int(free // per_block)

    def _free_bytes(self, config: EngineConfig, tp: int) -> float:
        model = self if tp == self.tensor_parallel_size else _with_tp(self, tp)
        weights = params_per_gpu(self.model, tp) * self.dtype_bytes
        return self.gpu.mem_bytes * config.cache.gpu_memory_utilization - weights \
            - model.profile_activation_bytes(config)

    def _does_not_fit(self, config: EngineConfig, per_block: int) -> str:
        m, tp = self.model, self.tensor_parallel_size
        weight_gb = m.num_params * self.dtype_bytes / 1e9
        where = f"one {self.gpu.name}" if tp == 1 else f"{tp} x {self.gpu.name}"
        message = (f"{m.name} ({weight_gb:.0f} GB of bf16 weights) does not fit on {where} "
                   f"({self.gpu.mem_bytes / 1e9:.0f} GB{' each' if tp > 1 else ''}) with room for a KV cache")
        for n in range(tp + 1, MAX_TP + 1):
            try:
                candidate = _with_tp(self, n)
            except ValueError:  # heads do not divide
                continue
            block = config.cache.block_size * kv_bytes_per_token_per_gpu(m, n, self.kv_dtype_bytes)
            if candidate._free_bytes(config, n) >= block:
                return message + f"; it needs {n} GPUs: pass --tensor-parallel-size {n}"
        return message + f"; not even on {MAX_TP}"


def _with_tp(model: RooflineCostModel, tp: int) -> RooflineCostModel:
    return RooflineCostModel(model.model, model.gpu, model.dtype_bytes, model.idle_factor, tp, model.kv_dtype_bytes)


def gpu_spec(name: str) -> GPUSpec:
    if name not in GPUS:
        raise UserError(f"--gpu: unknown GPU '{name}'; use one of {', '.join(GPUS)}")
    return GPUS[name]
