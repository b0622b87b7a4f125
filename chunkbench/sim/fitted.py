"""A cost model fitted to profiled steps (`chunkbench profile`): non-negative least squares over features
of a step's shape, so it follows whatever machine the profile was taken on."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.files import write_json
from chunkbench.kernels.buckets import length_buckets
from chunkbench.sim.cost_model import StepShape

# Piecewise-linear token terms let a non-negative fit bend both ways: min(T, k) flattens (CPU GEMMs get
# more efficient with more rows), max(0, T - k) steepens (GPU GEMMs leave the memory-bound regime).
# multi_row: a step of one token runs its linear layers as matrix-vector products, any other as GEMMs,
# which on a CPU cost a jump (measured: docs/guides/simulator.md, "Fidelity against the real engine").
# Attention: prefill_attention_pairs are what a causal kernel computes; prefill_dense_pairs (chunk x all its
# keys) what a masked dense softmax computes, as the CPU reference path does for chunks with cached context.
# Decodes: decode_keys is what a paged kernel reads; decode_padded_keys and decode_groups describe the CPU
# reference path, which pads decodes in buckets of similar length and makes one call per bucket.
KNOTS = (32, 128, 512)


def features(step: StepShape) -> list[float]:
    t = step.num_tokens
    groups = length_buckets(sorted(range(len(step.decodes)), key=step.decodes.__getitem__), step.decodes)
    padded = sum(len(g) * step.decodes[g[-1]] for g in groups)
    return (
        [1.0, float(t > 1), t]
        + [min(t, k) for k in KNOTS]
        + [max(0, t - k) for k in KNOTS]
        + [
            step.num_sampled,
            step.prefill_attention_pairs,
            sum(q * (q + ctx) for q, ctx in step.prefills),
            step.prefill_keys,
            step.decode_keys,
            padded,
            len(groups),
            len(step.prefills),
            len(step.decodes),
        ]
    )


FEATURE_NAMES = (
    ["step", "multi_row", "tokens"]
    + [f"min(tokens,{k})" for k in KNOTS]
    + [f"max(0,tokens-{k})" for k in KNOTS]
    + [
        "sampled_rows",
        "prefill_attention_pairs",
        "prefill_dense_pairs",
        "prefill_keys",
        "decode_keys",
        "decode_padded_keys",
        "decode_groups",
        "prefill_chunks",
        "decodes",
    ]
)


@dataclass(frozen=True)
class FittedCostModel:
    coefficients: tuple[float, ...]
    model_name: str = ""
    device: str = ""
    num_blocks: int | None = None  # the profiled engine's KV cache, so simulation preempts as it did
    fit: dict | None = None
    idle_factor: float = 1.0  # a step after the engine sat idle takes this many times longer (profiled)
    clock: str = "wall"  # what the steps were timed in: "wall", or "cpu" (`chunkbench profile --cpu-time`)

    def predict(self, step: StepShape) -> float:
        return float(np.dot(self.coefficients, features(step)))

    def kv_blocks(self, config: EngineConfig) -> int:
        """The profiled engine's KV cache, so a simulation preempts as the real run did."""
        if self.num_blocks is None:
            raise UserError(f"--cost-model: profile of {self.model_name} records no KV cache size; pass --num-blocks")
        return self.num_blocks

    def __str__(self) -> str:
        return f"profile of {self.model_name} on {self.device}"

    @classmethod
    def fit_steps(
        cls, steps: list[StepShape], seconds: list[float], noise_pct: float | None = None, **meta
    ) -> FittedCostModel:
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
        fit = {
            "points": len(y),
            "mean_abs_error_pct": float(100 * errors.mean()),
            "max_abs_error_pct": float(100 * errors.max()),
            "timing_spread_pct": noise_pct,
        }
        return cls(tuple(float(c) for c in coef), fit=fit, **meta)

    def save(self, path: Path) -> None:
        write_json(
            {
                "kind": "fitted",
                "model": self.model_name,
                "device": self.device,
                "num_blocks": self.num_blocks,
                "features": FEATURE_NAMES,
                "coefficients": list(self.coefficients),
                "fit": self.fit,
                "idle_factor": self.idle_factor,
                "clock": self.clock,
            },
            path,
        )

    @classmethod
    def load(cls, path: str | Path) -> FittedCostModel:
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict) or data.get("kind") != "fitted" or data.get("features") != FEATURE_NAMES:
                raise ValueError("not a chunkbench profile of this version")
            coefficients = tuple(float(c) for c in data["coefficients"])
            # NNLS fits are finite and non-negative; anything else would predict negative or NaN step times.
            if len(coefficients) != len(FEATURE_NAMES) or not all(math.isfinite(c) and c >= 0 for c in coefficients):
                raise ValueError("coefficients must be finite and >= 0, one per feature")
            idle = float(data.get("idle_factor", 1.0))
            blocks = data.get("num_blocks")
            if not (math.isfinite(idle) and idle >= 1) or not (blocks is None or (type(blocks) is int and blocks >= 1)):
                raise ValueError("idle_factor must be >= 1 and num_blocks a whole number >= 1")
            clock = data.get("clock", "wall")
            if clock not in ("wall", "cpu"):
                raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
            return cls(
                coefficients,
                str(data.get("model", "")),
                str(data.get("device", "")),
                blocks,
                data.get("fit"),
                idle,
                clock,
            )
        except OSError as exc:  # a folder, a missing or unreadable file: the reason, not Python's repr
            raise UserError(f"--cost-model: cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise UserError(f"--cost-model: cannot use {path}: {exc}") from None
