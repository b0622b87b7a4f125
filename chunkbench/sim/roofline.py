"""The roofline cost model: a step's time from the GPU's peaks, kernel constants fitted to measured operator
profiles (sim/kernel_constants.py; datasheet defaults, marked uncalibrated, elsewhere) and the model's shapes, on one
GPU or split over N GPUs by tensor parallelism (engine/sharding.py), plus the simulated engine's step
overhead (sim/engine_overhead.py).

Per layer: four GEMMs and six elementwise kernels (sim/kernel_times.py: soft max of the compute and memory bounds,
token tile, per-kernel floor), attention (the same soft max over attention FLOPs and KV bytes, one launch floor
per layer), and under TP two ring all-reduces. Once per step: the LM head over the sampled rows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from chunkbench.engine.activation import step_activation_bytes
from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.engine.sharding import (
    ALL_REDUCES_PER_LAYER,
    check_tensor_parallel,
    heads_per_gpu,
    kv_bytes_per_token_per_gpu,
    params_per_gpu,
)
from chunkbench.errors import UserError
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.engine_overhead import engine_overhead
from chunkbench.sim.gpus import GPUS, GPUSpec
from chunkbench.sim.kernel_constants import Calibration, calibration_for
from chunkbench.sim.kernel_times import gemm_seconds, layer_elementwise_seconds, layer_linear_seconds, soft_max

# FlashAttention-2 reaches 50-73% of peak in its forward pass (Dao 2023, fig. 5); we take 50% for the short
# chunks the tuner explores. The profiles hold no attention kernel, so this one is not calibrated.
ATTENTION_EFFICIENCY = 0.50
# NCCL all-reduce reaches ~80% of the link's one-way bandwidth as bus bandwidth on large messages
# (nccl-tests busbw on DGX H100: ~360 of 450 GB/s).
LINK_EFFICIENCY = 0.80
STEP_OVERHEAD_S = engine_overhead(None)[0]  # the default engine's (sim/engine_overhead.py)
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
    step_overhead_s: float = STEP_OVERHEAD_S
    engine: str = "vllm"  # what step_overhead_s belongs to, for messages
    # None (the default): the GPU's (calibration_for), set by __post_init__, so never None after it
    calibration: Calibration = field(default=cast(Calibration, None), compare=False)
    # Memos, for speed only (a simulated run asks for hundreds of thousands of steps of few distinct sizes):
    # the terms that depend only on the step's rows, and activation peaks (by rows and sampled rows). Each value is the
    # float the formula computes, so predictions are bit-identical with or without them.
    _by_rows: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_sampled: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _activation: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _attention_rates: tuple = field(default=(), init=False, repr=False, compare=False)  # set from the above

    def __post_init__(self) -> None:
        check_tensor_parallel(self.model, self.tensor_parallel_size)
        if self.calibration is None:
            object.__setattr__(self, "calibration", calibration_for(self.gpu.name))
        m, tp, c = self.model, self.tensor_parallel_size, self.calibration.constants
        object.__setattr__(
            self,
            "_attention_rates",
            (  # per key bytes, per (query, key) FLOPs, the two rates
                kv_bytes_per_token_per_gpu(m, tp, self.kv_dtype_bytes) / m.num_layers,
                4 * heads_per_gpu(m, tp) * m.head_dim,  # QK^T and PV
                self.gpu.bf16_flops * ATTENTION_EFFICIENCY,
                self.gpu.mem_bandwidth * c.memory_efficiency,
            ),
        )

    @classmethod
    def for_config(cls, config: EngineConfig, gpu: GPUSpec, engine: str | None = None) -> RooflineCostModel:
        overhead, label = engine_overhead(engine)
        return cls(
            config.model,
            gpu,
            tensor_parallel_size=config.tensor_parallel_size,
            kv_dtype_bytes=config.cache.kv_dtype_bytes(2),
            step_overhead_s=overhead,
            engine=label,
        )

    def __str__(self) -> str:
        tp = self.tensor_parallel_size
        where = f"roofline on {self.gpu.name}" + (f" x{tp} (tensor parallel over {self.gpu.link})" if tp > 1 else "")
        return f"{where}, {self.calibration.label}, {self.engine} step overhead {self.step_overhead_s * 1e3:g} ms"

    def predict(self, step: StepShape) -> float:
        """Every GPU computes 1/N of the linear layers and of the attention heads at once, then the layers'
        all-reduces: the step takes one GPU's share plus the communication."""
        attention = (
            self._attention_per_layer(step.prefill_attention_pairs, step.prefill_keys, step.decode_keys)
            if step.prefills or step.decodes
            else 0.0
        )
        return self._step_seconds(step.num_tokens, step.num_sampled, attention)

    def decode_step_cost(self, batch: int) -> Callable[[int], float]:
        """predict() of decode-only steps of `batch` decodes, as a function of the keys they read in all, bit
        for bit, without building shapes (the fast path, sim/fastforward.py, asks it every step of a stretch):
        such a step's cost depends on nothing else, and the terms of the batch are looked up once."""
        per_layer, t_head, t_comm = self._row_terms(batch, batch)
        overhead, layers, floor, decode_attention = (
            self.step_overhead_s,
            self.model.num_layers,
            self.calibration.constants.gemm_floor_s,
            self._decode_attention,
        )

        def seconds(keys: int) -> float:  # _step_seconds over _attention_per_layer(0, 0, keys), in its order
            return overhead + layers * (per_layer + (floor + decode_attention(keys))) + t_head + t_comm

        return seconds

    def _step_seconds(self, rows: int, sampled: int, attention_per_layer: float) -> float:
        per_layer, t_head, t_comm = self._row_terms(rows, sampled)
        return self.step_overhead_s + self.model.num_layers * (per_layer + attention_per_layer) + t_head + t_comm

    def _row_terms(self, rows: int, sampled: int) -> tuple[float, float, float]:
        """One layer's GEMMs and elementwise kernels and the all-reduces (they depend only on the step's token
        rows), and the LM head (only on its sampled rows): each memoized by what it depends on."""
        terms = self._by_rows.get(rows)
        if terms is None:
            m, gpu, tp, c = self.model, self.gpu, self.tensor_parallel_size, self.calibration.constants
            per_layer = layer_linear_seconds(
                m, tp, rows, c, gpu.bf16_flops, gpu.mem_bandwidth, self.dtype_bytes
            ) + layer_elementwise_seconds(m, tp, rows, c, gpu.mem_bandwidth, self.dtype_bytes)
            t_comm = (
                ALL_REDUCES_PER_LAYER
                * m.num_layers
                * ring_all_reduce_seconds(rows * m.hidden_size * self.dtype_bytes, tp, gpu)
            )
            terms = self._by_rows[rows] = (per_layer, t_comm)
        t_head = self._by_sampled.get(sampled)
        if t_head is None:
            m, gpu, tp, c = self.model, self.gpu, self.tensor_parallel_size, self.calibration.constants
            vocab = m.vocab_size if tp == 1 else math.ceil(m.vocab_size / tp)
            t_head = self._by_sampled[sampled] = gemm_seconds(
                sampled, m.hidden_size, vocab, c, gpu.bf16_flops, gpu.mem_bandwidth, self.dtype_bytes
            )
        return terms[0], t_head, terms[1]

    def _attention_per_layer(self, prefill_pairs: int, prefill_keys: int, decode_keys: int) -> float:
        """Prefill chunks (causal over their cached context) and decodes (one query over its context): each the
        soft max of its FLOPs and its KV bytes, plus one launch floor for the layer's attention."""
        c = self.calibration.constants
        per_key_bytes, per_pair_flops, compute_rate, memory_rate = self._attention_rates
        prefill = (
            soft_max(
                prefill_pairs * per_pair_flops / compute_rate, prefill_keys * per_key_bytes / memory_rate, c.smoothness
            )
            if prefill_keys
            else 0.0
        )
        return c.gemm_floor_s + prefill + self._decode_attention(decode_keys)

    def _decode_attention(self, keys: int) -> float:
        """Decodes reading `keys` keys in all: one query each, so FLOPs and bytes both scale with the keys."""
        per_key_bytes, per_pair_flops, compute_rate, memory_rate = self._attention_rates
        return soft_max(
            keys * per_pair_flops / compute_rate,
            keys * per_key_bytes / memory_rate,
            self.calibration.constants.smoothness,
        )

    def activation_bytes(self, step: StepShape) -> int:
        """Peak activation bytes of a step on one GPU: FlashAttention-style kernels, bf16
        (engine/activation.py)."""
        return self.rows_activation_bytes(step.num_tokens, step.num_sampled)

    def rows_activation_bytes(self, rows: int, sampled: int) -> int:
        """activation_bytes() of any step of `rows` token rows and `sampled` sampled rows: flash kernels keep
        no per-chunk buffers and read the pages in place, so neither the chunks nor the contexts matter."""
        peak = self._activation.get((rows, sampled))
        if peak is None:
            # As one chunk of `rows` tokens: with flash kernels only the row count matters, and no tuple of
            # `rows` entries is built (a budget of 10**22 tokens must be refused, not exhaust memory).
            peak = self._activation[(rows, sampled)] = step_activation_bytes(
                self.model, ((rows, 0),), (), sampled, self.dtype_bytes, self.tensor_parallel_size, "flash"
            )
        return peak

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
        per_block = config.cache.block_size * kv_bytes_per_token_per_gpu(
            self.model, self.tensor_parallel_size, self.kv_dtype_bytes
        )
        if free < per_block:
            raise UserError(self._does_not_fit(config, per_block))
        return int(free // per_block)

    def _free_bytes(self, config: EngineConfig, tp: int) -> float:
        model = self if tp == self.tensor_parallel_size else _with_tp(self, tp)
        weights = params_per_gpu(self.model, tp) * self.dtype_bytes
        return (
            self.gpu.mem_bytes * config.cache.gpu_memory_utilization - weights - model.profile_activation_bytes(config)
        )

    def _does_not_fit(self, config: EngineConfig, per_block: int) -> str:
        m, tp = self.model, self.tensor_parallel_size
        weight_gb = m.num_params * self.dtype_bytes / 1e9
        activation_gb = self.profile_activation_bytes(config) / 1e9
        where = f"one {self.gpu.name}" if tp == 1 else f"{tp} x {self.gpu.name}"
        message = (
            f"{m.name} ({weight_gb:.0f} GB of bf16 weights, {activation_gb:,.1f} GB of activations for a "
            f"step of --max-num-batched-tokens {config.scheduler.max_num_batched_tokens:,}) does not fit on "
            f"{where} ({self.gpu.mem_bytes / 1e9:.0f} GB{' each' if tp > 1 else ''}) with room for a KV cache"
        )
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
    return dataclasses.replace(model, tensor_parallel_size=tp)


def gpu_spec(name: str) -> GPUSpec:
    if name not in GPUS:
        raise UserError(f"--gpu: unknown GPU '{name}'; use one of {', '.join(GPUS)}")
    return GPUS[name]
