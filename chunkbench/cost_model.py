"""Step cost models for the simulator: a GPU roofline from specs, and a model fitted to profiled steps.

Both map a StepShape (prefill chunks with their cached context, decodes with theirs) to seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkbench.engine.config import ModelConfig
from chunkbench.engine.sim_executor import StepShape
from chunkbench.errors import UserError
from chunkbench.gpus import GPUS, GPUSpec
from chunkbench.kernels.buckets import length_buckets

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


def linear_params(model: ModelConfig) -> int:
    """Weights that every token goes through (all decoder layers), excluding embeddings and the LM head."""
    h = model.hidden_size
    per_layer = h * (model.q_size + 2 * model.kv_size) + model.q_size * h + 3 * h * model.intermediate_size
    return model.num_layers * per_layer


@dataclass(frozen=True)
class RooflineCostModel:
    model: ModelConfig
    gpu: GPUSpec
    dtype_bytes: int = 2
    idle_factor: float = 1.0  # no cold-start term: datasheets say nothing of it

    def predict(self, step: StepShape) -> float:
        m, gpu = self.model, self.gpu
        tokens = math.ceil(step.num_tokens / TOKEN_TILE) * TOKEN_TILE
        sampled = math.ceil(step.num_sampled / TOKEN_TILE) * TOKEN_TILE
        weights = linear_params(m)
        head = m.vocab_size * m.hidden_size
        linear_flops = 2 * tokens * weights + 2 * sampled * head
        linear_bytes = (weights + head) * self.dtype_bytes
        t_linear = max(linear_flops / (gpu.bf16_flops * GEMM_EFFICIENCY),
                       linear_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        per_key_bytes = 2 * m.num_layers * m.kv_size * self.dtype_bytes  # K and V, every layer
        per_pair_flops = 4 * m.num_layers * m.num_heads * m.head_dim  # QK^T and PV
        t_prefill_attn = max(step.prefill_attention_pairs * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                             step.prefill_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        t_decode_attn = max(step.decode_keys * per_pair_flops / (gpu.bf16_flops * ATTENTION_EFFICIENCY),
                            step.decode_keys * per_key_bytes / (gpu.mem_bandwidth * MEMORY_EFFICIENCY))
        return STEP_OVERHEAD_S + t_linear + t_prefill_attn + t_decode_attn

    def kv_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        """KV blocks that fit beside the weights, as vLLM sizes its cache."""
        m = self.model
        weight_bytes = m.num_params * self.dtype_bytes
        free = self.gpu.mem_bytes * (gpu_memory_utilization - ACTIVATION_RESERVE) - weight_bytes
        per_block = 2 * m.num_layers * block_size * m.kv_size * self.dtype_bytes
        if free < per_block:
            raise UserError(f"{m.name} ({weight_bytes / 1e9:.0f} GB of bf16 weights) does not fit on one "
                            f"{self.gpu.name} ({self.gpu.mem_bytes / 1e9:.0f} GB) with room for a KV cache")
        return int(free // per_block)


# ---------- fitted ----------

# Piecewise-linear token terms let a non-negative fit bend both ways: min(T, k) flattens (CPU GEMMs get
# more efficient with more rows), max(0, T - k) steepens (GPU GEMMs leave the memory-bound regime).
# multi_row: a step of one token runs its linear layers as matrix-vector products, any other as GEMMs,
# which on a CPU cost a jump (35 ms for one decode of `small` here, 61 ms for two).
# Attention: prefill_attention_pairs are what a causal kernel computes; prefill_dense_pairs (chunk x all its
# keys) what a masked dense softmax computes, as the CPU reference path does for chunks with cached context.
# Decodes: decode_keys is what a paged kernel reads; decode_padded_keys and decode_groups describe the CPU
# reference path, which pads decodes in buckets of similar length and makes one call per bucket.
KNOTS = (32, 128, 512)


def features(step: StepShape) -> list[float]:
    t = step.num_tokens
    groups = length_buckets(sorted(range(len(step.decodes)), key=step.decodes.__getitem__), step.decodes)
    padded = sum(len(g) * step.decodes[g[-1]] for g in groups)
    return ([1.0, float(t > 1), t] + [min(t, k) for k in KNOTS] + [max(0, t - k) for k in KNOTS]
            + [step.num_sampled, step.prefill_attention_pairs, sum(q * (q + ctx) for q, ctx in step.prefills),
               step.prefill_keys, step.decode_keys, padded, len(groups), len(step.prefills), len(step.decodes)])


FEATURE_NAMES = (["step", "multi_row", "tokens"] + [f"min(tokens,{k})" for k in KNOTS]
                 + [f"max(0,tokens-{k})" for k in KNOTS]
                 + ["sampled_rows", "prefill_attention_pairs", "prefill_dense_pairs", "prefill_keys", "decode_keys",
                    "decode_padded_keys", "decode_groups", "prefill_chunks", "decodes"])


@dataclass(frozen=True)
class FittedCostModel:
    coefficients: tuple[float, ...]
    model_name: str = ""
    device: str = ""
    num_blocks: int | None = None  # the profiled engine's KV cache, so simulation preempts as it did
    fit: dict | None = None
    points: tuple = ()  # the measured (prefills, decodes, seconds) it was fitted to, so it can be refitted
    idle_factor: float = 1.0  # a step after the engine sat idle takes this many times longer (profiled)

    def predict(self, step: StepShape) -> float:
        return float(np.dot(self.coefficients, features(step)))

    @classmethod
    def fit_steps(cls, steps: list[StepShape], seconds: list[float], noise_pct: float | None = None,
                  **meta) -> "FittedCostModel":
        """Non-negative least squares on relative error (each row weighted by 1/seconds). `noise_pct`, the
        median spread (max - min over median) of the repeated timings, is kept beside the fit error: a fit
        cannot be trusted closer than the machine repeats itself."""
        from scipy.optimize import nnls

        x = np.array([features(s) for s in steps], dtype=float)
        y = np.asarray(seconds, dtype=float)
        weights = 1.0 / y
        scale = np.abs(x).max(axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls((x / scale) * weights[:, None], y * weights, maxiter=50 * x.shape[1])
        coef = coef / scale
        predicted = x @ coef
        errors = np.abs(predicted - y) / y
        fit = {"points": len(y), "mean_abs_error_pct": float(100 * errors.mean()),
               "max_abs_error_pct": float(100 * errors.max()), "timing_spread_pct": noise_pct}
        points = tuple((s.prefills, s.decodes, float(t)) for s, t in zip(steps, seconds))
        return cls(tuple(float(c) for c in coef), fit=fit, points=points, **meta)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "kind": "fitted", "model": self.model_name, "device": self.device, "num_blocks": self.num_blocks,
            "features": FEATURE_NAMES, "coefficients": list(self.coefficients), "fit": self.fit,
            "idle_factor": self.idle_factor,
            "points": [[list(map(list, p)), list(d), t] for p, d, t in self.points]}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "FittedCostModel":
        try:
            data = json.loads(Path(path).read_text())
            if data.get("kind") != "fitted" or data.get("features") != FEATURE_NAMES:
                raise ValueError("not a chunkbench profile of this version")
            return cls(tuple(data["coefficients"]), data.get("model", ""), data.get("device", ""),
                       data.get("num_blocks"), data.get("fit"),
                       tuple((tuple(map(tuple, p)), tuple(d), t) for p, d, t in data.get("points", ())),
                       float(data.get("idle_factor", 1.0)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--cost-model: cannot use {path}: {exc}") from None


def gpu_spec(name: str) -> GPUSpec:
    if name not in GPUS:
        raise UserError(f"--gpu: unknown GPU '{name}'; use one of {', '.join(GPUS)}")
    return GPUS[name]
