"""Fit the per-GPU kernel constants (sim/kernel_times.py) to measured operator profiles, and say how well they hold.

Data: Vidur's per-operator profiles of one Llama decoder layer (microsoft/vidur, MIT License, Copyright (c)
Microsoft Corporation; data/profiling/compute/<gpu>/<model>/mlp.csv at commit 7d47513), one row per
(num_tokens, tensor-parallel workers), median milliseconds per operator. A subset ships in
tests/data/gpu-profiles/ with its ORIGIN.md; scripts/calibrate.py takes the full files with --data and writes
sim/calibration.json. The package never reads these files at run time.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chunkbench.engine.config import ModelConfig
from chunkbench.files import write_text
from chunkbench.sim.gpus import GPUS, GPUSpec
from chunkbench.sim.kernel_times import KernelConstants, gemm_seconds, layer_elementwise_seconds, layer_gemms

# File name -> (GPU key in sim/gpus.py, model). ORIGIN.md names the GPUs: A100-80GB SXM and H100 SXM.
PROFILES = {
    "a100_Meta-Llama-3-8B_mlp.csv": ("a100-80g", "Meta-Llama-3-8B"),
    "h100_Llama-2-7b-hf_mlp.csv": ("h100-sxm", "Llama-2-7b-hf"),
}
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # the order of layer_gemms
ELEMENTWISE_OPS = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_rope": 1, "mlp_act": 1, "add": 2}
TILE_CHOICES = (16, 32, 64, 128, 256)  # CUTLASS/cuBLAS M tiles for bf16 tensor-core GEMMs
FIT_MIN, FIT_MAX = 1, 8192  # the tuner's budgets and chunk caps lie well inside; beyond, GEMMs are at peak
START = (0.7, 0.8, 3.0, 5e-6)  # the old roofline's datasheet efficiencies, a mild blend, 5 us floor


@dataclass(frozen=True)
class Row:
    tokens: int
    tp: int
    gemm_ms: tuple[float, ...]  # medians, GEMM_OPS order
    elementwise_ms: float  # the layer's norm, rope, activation and two adds, summed
    model: ModelConfig


def profile_model(row: dict, name: str) -> ModelConfig:
    heads, hidden = int(row["n_head"]), int(row["n_embd"])
    return ModelConfig(
        name,
        vocab_size=int(row["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(row["n_expanded_embd"]),
        num_layers=1,
        num_heads=heads,
        num_kv_heads=int(row["n_kv_head"]),
        head_dim=hidden // heads,
        max_model_len=4096,
    )


def load_rows(path: Path) -> list[Row]:
    """One Row per CSV line; the profiles repeat some token counts, each repeat is kept (it is data)."""
    name = PROFILES[Path(path).name][1]
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            med = lambda op: float(r[f"time_stats.{op}.median"])  # noqa: E731
            rows.append(
                Row(
                    int(r["num_tokens"]),
                    int(r["num_tensor_parallel_workers"]),
                    tuple(med(op) for op in GEMM_OPS),
                    sum(n * med(op) for op, n in ELEMENTWISE_OPS.items()),
                    profile_model(r, name),
                )
            )
    return rows


def constants_from(x, tile: int, elementwise=(0.5, 2e-6)) -> KernelConstants:
    return KernelConstants(
        float(x[0]), float(x[1]), float(x[2]), int(tile), float(x[3]), float(elementwise[0]), float(elementwise[1])
    )


def predict_gemms_ms(rows: list[Row], c: KernelConstants, gpu: GPUSpec) -> np.ndarray:
    return np.array(
        [
            [
                1e3 * gemm_seconds(r.tokens, k, n, c, gpu.bf16_flops, gpu.mem_bandwidth)
                for k, n in layer_gemms(r.model, r.tp)
            ]
            for r in rows
        ]
    )


def predict_elementwise_ms(rows: list[Row], c: KernelConstants, gpu: GPUSpec) -> np.ndarray:
    return np.array([1e3 * layer_elementwise_seconds(r.model, r.tp, r.tokens, c, gpu.mem_bandwidth) for r in rows])


def _in_range(rows: list[Row], lo: int = FIT_MIN, hi: int = FIT_MAX) -> list[Row]:
    return [r for r in rows if lo <= r.tokens <= hi]


def fit(rows: list[Row], gpu: GPUSpec) -> tuple[KernelConstants, dict]:
    """The constants that best explain `rows` on `gpu`, and the fit's own summary. For each token tile in
    TILE_CHOICES, scipy.optimize.least_squares (soft-L1 loss, f_scale 0.05) on the RELATIVE error of each of the
    four GEMMs of every row with FIT_MIN..FIT_MAX tokens at every TP degree, over (gemm efficiency, memory
    efficiency, smoothness k, per-GEMM floor); the tile with the least cost wins. The elementwise pair
    (efficiency, per-kernel floor) is fitted the same way to the sum of the norm, rope, activation and add
    columns (the add column counted twice: a layer has two residual adds)."""
    from scipy.optimize import least_squares

    rows = _in_range(rows)
    measured = np.array([r.gemm_ms for r in rows])
    best: tuple[Any, int] | None = None  # (scipy's solution, its tile)
    for tile in TILE_CHOICES:

        def residuals(x, tile=tile):
            return (predict_gemms_ms(rows, constants_from(x, tile), gpu) / measured - 1.0).ravel()

        sol = least_squares(
            residuals,
            START,
            bounds=([0.05, 0.05, 1.0, 0.0], [1.0, 1.0, 12.0, 50e-6]),
            loss="soft_l1",
            f_scale=0.05,
            x_scale=[0.1, 0.1, 1.0, 1e-5],
        )
        if best is None or sol.cost < best[0].cost:
            best = (sol, tile)
    assert best is not None  # TILE_CHOICES is not empty
    sol, tile = best
    elementwise = np.array([r.elementwise_ms for r in rows])

    def residuals_e(x):
        return predict_elementwise_ms(rows, constants_from(sol.x, tile, x), gpu) / elementwise - 1.0

    sol_e = least_squares(
        residuals_e, (0.5, 2e-6), bounds=([0.02, 0.0], [1.0, 50e-6]), loss="soft_l1", f_scale=0.05, x_scale=[0.1, 1e-6]
    )
    constants = constants_from(sol.x, tile, sol_e.x)
    return constants, {"rows": len(rows), "tokens": [FIT_MIN, FIT_MAX], "tp": sorted({r.tp for r in rows})}


@dataclass(frozen=True)
class Errors:
    """Relative errors of the per-layer linear time (the four GEMMs summed), in percent."""

    rows: int
    mean_abs_pct: float
    max_abs_pct: float
    worst_tokens: int
    bias_pct: float  # mean signed error: > 0 predicts too slow

    def as_dict(self) -> dict:
        return asdict(self)


def linear_errors(
    rows: list[Row], c: KernelConstants, gpu: GPUSpec, lo: int, hi: int, tp: tuple[int, ...] = (1,)
) -> Errors:
    rows = [r for r in _in_range(rows, lo, hi) if r.tp in tp]
    predicted = predict_gemms_ms(rows, c, gpu).sum(axis=1)
    measured = np.array([sum(r.gemm_ms) for r in rows])
    err = 100 * (predicted / measured - 1.0)
    worst = int(np.argmax(np.abs(err)))
    return Errors(len(rows), float(np.abs(err).mean()), float(np.abs(err).max()), rows[worst].tokens, float(err.mean()))


def elementwise_errors(rows: list[Row], c: KernelConstants, gpu: GPUSpec, lo: int, hi: int) -> Errors:
    rows = [r for r in _in_range(rows, lo, hi) if r.tp == 1]
    err = 100 * (predict_elementwise_ms(rows, c, gpu) / np.array([r.elementwise_ms for r in rows]) - 1.0)
    worst = int(np.argmax(np.abs(err)))
    return Errors(len(rows), float(np.abs(err).mean()), float(np.abs(err).max()), rows[worst].tokens, float(err.mean()))


SHAPE_COLUMNS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)


def write_subset(src: Path, dst: Path) -> None:
    """The rows the fit uses (FIT_MIN..FIT_MAX tokens), shape and median columns only: what the tests read."""
    keep = list(SHAPE_COLUMNS) + [f"time_stats.{op}.median" for op in (*GEMM_OPS, *ELEMENTWISE_OPS)]
    out = io.StringIO()
    with open(src, newline="") as f:
        writer = csv.DictWriter(out, keep, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(r for r in csv.DictReader(f) if FIT_MIN <= int(r["num_tokens"]) <= FIT_MAX)
    write_text(out.getvalue(), dst)  # atomic, as every output


def gpu_of(path: Path) -> GPUSpec:
    return GPUS[PROFILES[Path(path).name][0]]
