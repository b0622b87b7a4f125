"""The `linear` family of a server calibration (registered in sim/families.py): a step cost linear in what the
scheduler put in the step (LinearStepCost says what each term prices), and a latency outside the steps; fitted
by tune/presearch/linear.py. No torch, no scipy.

Where the roofline's shape misses a server (on a CPU it cannot make a large fixed step and a small per-token
cost at once), these terms take the server's shape directly; measured: docs/guides/simulator.md ("Server
calibration families"). Memory questions (KV blocks, activation peaks) go to the reference roofline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.sim.cost_family import CostFamily
from chunkbench.sim.cost_model import StepShape

if TYPE_CHECKING:
    from chunkbench.sim.roofline import RooflineCostModel
    from chunkbench.sim.server_calibration import ServerCalibration

STEP_TERMS = ("step_s", "prefill_step_s", "token_s", "pair_s", "seq_s", "key_s")
PAIRS, SEQUENCES = STEP_TERMS.index("pair_s"), STEP_TERMS.index("seq_s")


def step_features(step: StepShape) -> tuple[float, ...]:
    """The features STEP_TERMS multiply, in their order."""
    sequences = len(step.prefills) + len(step.decodes)
    return (
        1.0,
        float(bool(step.prefills)),
        float(step.num_tokens),
        float(step.prefill_attention_pairs),
        float(sequences),
        float(step.decode_keys),
    )


@dataclass(frozen=True)
class LinearStepCost:
    """The CostModel protocol of sim/cost_model.py over STEP_TERMS (the first of `coefficients`). A step's
    seconds = sum of STEP_TERMS[k] * feature k, each term >= 0:

    - `step_s`: every step (scheduling, the forward's fixed launches, sampling, the output's IPC);
    - `prefill_step_s`: a step with at least one prefill chunk (its input preparation and attention metadata);
    - `token_s`: per token computed (the GEMMs' rows);
    - `pair_s`: per causal (query, key) pair of the prefill chunks (StepShape.prefill_attention_pairs);
    - `seq_s`: per sequence in the step (per-request input preparation, detokenizing and streaming its token);
    - `key_s`: per key the decodes read (StepShape.decode_keys).

    And `latency_s`, outside the steps: every token reaches the client this long after its step ends (HTTP,
    input processing, the engine core's IPC, detokenizing, streaming). It moves TTFT and E2EL, never an ITL, and
    never the schedule (server_calibration.delayed adds it to the token times)."""

    coefficients: tuple[float, ...]  # the family's step terms, STEP_TERMS first
    memory: RooflineCostModel  # the reference roofline: KV blocks and activation peaks
    label: str = ""
    idle_factor: float = 1.0  # measured request latencies cannot separate a cold step from a slow one

    def predict(self, step: StepShape) -> float:
        return math.fsum(c * f for c, f in zip(self.coefficients, step_features(step)))

    def decode_step_cost(self, batch: int) -> Callable[[int], float]:
        """predict() of a decode-only step of `batch` decodes as a function of the keys it reads, bit for bit
        (the fast path, sim/fastforward.py)."""
        step_s, _, token_s, pair_s, seq_s, key_s = self.coefficients[: len(STEP_TERMS)]
        fixed = (step_s * 1.0, 0.0, token_s * float(batch), pair_s * 0.0, seq_s * float(batch))
        return lambda keys: math.fsum(fixed + (key_s * float(keys),))

    def rows_activation_bytes(self, rows: int, sampled: int) -> int:
        return self.memory.rows_activation_bytes(rows, sampled)

    def activation_bytes(self, step: StepShape) -> int:
        return self.memory.activation_bytes(step)

    def kv_blocks(self, config: EngineConfig) -> int:
        return self.memory.kv_blocks(config)

    def __str__(self) -> str:
        return self.label or "linear step cost"


class LinearFamily(CostFamily):
    """What the fit (tune/presearch/linear.py, tune/presearch/linear_trace.py) needs of a linear family besides the
    CostFamily interface: its terms, the features they multiply, and which columns mark a step as unusual."""

    name = "linear"
    fitter = "chunkbench.tune.presearch.linear:fit_linear_family"
    step_terms: tuple[str, ...] = STEP_TERMS
    client_terms: tuple[str, ...] = ("latency_s",)  # per token, outside the steps; latency_s first
    optional: tuple[str, ...] = ("latency_s",)  # 0 when a file lacks them
    settings: tuple[str, ...] = ()  # whole numbers stored beside the coefficients
    unusual: tuple[int, ...] = ()  # step-feature columns that make a step slow for its place in the session

    @property
    def terms(self) -> tuple[str, ...]:
        """The order of a coefficient vector in the fit: the step terms, then the client terms."""
        return self.step_terms + self.client_terms

    @property
    def latency_index(self) -> int:
        return self.terms.index("latency_s")

    @property
    def jitter_index(self) -> int | None:
        return self.terms.index("jitter_s") if "jitter_s" in self.terms else None

    def step_features(self, step: StepShape) -> tuple[float, ...]:
        return step_features(step)

    def session_features(self, features: list | np.ndarray, coefficients: dict) -> np.ndarray:
        """A session's step features (rows of step_features, in order), with what depends on the steps before
        each filled in: nothing here."""
        return np.array(features, dtype=float)

    def client_row(self, ttft: bool) -> tuple[float, ...]:
        """The client terms' features of a request-level row of the fit: the latency once in a TTFT."""
        return tuple(1.0 if ttft and k == "latency_s" else 0.0 for k in self.client_terms)

    def check(self, calibration: ServerCalibration) -> None:
        coefficients = self.checked(calibration.coefficients or {}, "server calibration")
        calibration.coefficients = coefficients
        calibration.step_overhead_s, calibration.seq_overhead_s = coefficients["step_s"], coefficients["seq_s"]

    def checked(self, coefficients: dict, where: str) -> dict:
        """The coefficients (`terms`, then `settings`); a missing, negative or non-finite one is refused (it would
        predict a negative or NaN step time), as is a non-zero one of another family. `optional` ones may be
        missing (0)."""
        names = self.terms + self.settings
        foreign = [k for k, v in coefficients.items() if k not in names and v]
        if foreign:
            raise UserError(f"{where}: the {self.name} family has no term {', '.join(foreign)}")
        try:
            values = {
                name: float(coefficients[name] if name not in self.optional else coefficients.get(name, 0.0))
                for name in names
            }
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{where}: a linear calibration needs the coefficients {', '.join(self.terms)}") from None
        whole = f" ({' and '.join(self.settings)} a whole number)" if self.settings else ""
        if not all(math.isfinite(v) and v >= 0 for v in values.values()) or any(values[s] % 1 for s in self.settings):
            raise UserError(f"{where}: linear coefficients must be finite and >= 0{whole}, got {coefficients}")
        return values | {s: int(values[s]) for s in self.settings}

    def cost_model(self, calibration: ServerCalibration, config: EngineConfig) -> LinearStepCost:
        coefficients = calibration.coefficients or {}
        return LinearStepCost(
            tuple(coefficients[k] for k in self.step_terms), calibration.roofline(config), calibration.label()
        )

    def describe(self, calibration: ServerCalibration) -> str:
        return f"fitted to the server, linear step cost: {self.text(calibration.coefficients or {})}"

    def text(self, coefficients: dict) -> str:
        """The coefficients in words."""
        c = {k: float(coefficients.get(k, 0.0)) for k in self.terms}
        return (
            f"{c['step_s'] * 1e3:.3g} ms per step + {c['prefill_step_s'] * 1e3:.3g} ms per prefill step + "
            f"{c['token_s'] * 1e6:.3g} us per token + {c['pair_s'] * 1e9:.3g} ns per attention pair + "
            f"{c['seq_s'] * 1e6:.3g} us per sequence + {c['key_s'] * 1e9:.3g} ns per decode key"
            + self.extra_text(coefficients, c)
            + f"; {c['latency_s'] * 1e3:.3g} ms to the client"
            + self.client_text(c)
        )

    def extra_text(self, coefficients: dict, c: dict) -> str:
        """Words for the step terms a family adds (text)."""
        return ""

    def client_text(self, c: dict) -> str:
        """Words for the client terms after the latency (text)."""
        return ""


LINEAR = LinearFamily()
