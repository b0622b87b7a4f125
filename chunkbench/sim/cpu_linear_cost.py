"""The `linear-cpu` family (registered in sim/families.py): the linear step cost (sim/linear_cost.py) plus the
terms of a vLLM served on a CPU, kept apart so that a GPU server's fit is not shaped by them. A calibration
that names `linear` on the `cpu` reference gets this family. No torch, no scipy.

Its step terms beyond the linear family's are each set by the step's place in its session (session_features;
the cost model remembers the session's steps as it prices them), and a client term beyond `latency_s` delays
each token on its way out: CpuLinearStepCost says what each prices. Measured: docs/guides/simulator.md ("Server
calibration families") and docs/measurements/ (server calibration).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from chunkbench.engine.config import EngineConfig
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.linear_cost import PAIRS, SEQUENCES, STEP_TERMS, LinearFamily, LinearStepCost, step_features

if TYPE_CHECKING:
    from chunkbench.sim.server_calibration import ServerCalibration

STEP_COEFFICIENTS = STEP_TERMS + ("stall_s", "new_step_s", "fresh_pair_s", "first_pair_s")
COEFFICIENTS = STEP_COEFFICIENTS + ("latency_s", "jitter_s")
OPTIONAL = ("stall_s", "latency_s", "stall_every", "new_step_s", "jitter_s", "fresh_pair_s", "first_pair_s")
STALL, NEW_STEP, FRESH_PAIRS, FIRST_PAIRS = (STEP_COEFFICIENTS.index(k) for k in STEP_COEFFICIENTS[len(STEP_TERMS) :])
TOKENS = STEP_TERMS.index("token_s")
FRESH_WINDOW = 100  # fresh_pair_s: a step's attention pairs beyond the most of this many steps before it
FIRST_WINDOW = 5  # first_pair_s: a step's first chunks' pairs beyond the most of this many steps before it


def cpu_step_features(step: StepShape) -> tuple[float, ...]:
    """The features STEP_COEFFICIENTS multiply. The session's columns are 0 here (session_features sets them),
    but for FIRST_PAIRS, which holds the step's first-chunk pairs for session_features to window."""
    return step_features(step) + (0.0, 0.0, 0.0, first_chunk_pairs(step))


def first_chunk_pairs(step: StepShape) -> float:
    """The causal pairs of the step's chunks that have no context before them (a prompt's first chunk)."""
    return float(sum(q * (q + 1) // 2 for q, ctx in step.prefills if ctx == 0))


def stalls(sequences, every: int) -> np.ndarray:
    """Which of a session's steps, with these many sequences each (in order), stall."""
    done = np.cumsum(sequences)
    return (done // every > (done - np.asarray(sequences)) // every) if every else np.zeros(len(done), dtype=bool)


def new_counts(tokens) -> np.ndarray:
    """Which of a session's steps, with these many tokens each (in order), run a count no step before them ran."""
    _, first = np.unique(np.asarray(tokens), return_index=True)
    new = np.zeros(len(tokens), dtype=bool)
    new[first] = True
    return new


def fresh_pairs(pairs, window: int = FRESH_WINDOW) -> np.ndarray:
    """A session's steps' attention pairs (in order) beyond the most any of the `window` steps before each
    computed."""
    pairs = np.asarray(pairs, dtype=float)
    padded = np.concatenate((np.zeros(window), pairs))
    recent = np.lib.stride_tricks.sliding_window_view(padded[:-1], window).max(axis=1) if len(pairs) else pairs
    return np.maximum(pairs - recent, 0.0)


def beyond_recent(recent: deque, pairs: float) -> float:
    """fresh_pairs for the next step of a session: its `pairs` beyond the most in `recent` (the window's steps,
    a deque of the window's length), which then remembers them. None beyond a step of none (a decode step's):
    the window's counts are never negative, and its max is most of a simulated decode step's time."""
    extra = max(pairs - max(recent, default=0.0), 0.0) if pairs > 0 else 0.0
    recent.append(pairs)
    return extra


def session_features(features, stall_every: int) -> np.ndarray:
    """A session's step features (rows of cpu_step_features, in order) with the session's columns filled in."""
    features = np.array(features, dtype=float)
    features[:, STALL] = stalls(features[:, SEQUENCES].astype(int), stall_every)
    features[:, NEW_STEP] = new_counts(features[:, TOKENS])
    features[:, FRESH_PAIRS] = fresh_pairs(features[:, PAIRS])
    features[:, FIRST_PAIRS] = fresh_pairs(features[:, FIRST_PAIRS], FIRST_WINDOW)
    return features


@dataclass(frozen=True)
class CpuLinearStepCost(LinearStepCost):
    """LinearStepCost over STEP_COEFFICIENTS, remembering its session's steps (a session's cost model prices
    them in order; --step-time-target's candidate steps would count too, a chunkbench-only knob that a vLLM
    calibration never searches). Its terms beyond the linear family's:

    - `stall_s`: a step takes this much longer each time the session's count of sequences stepped passes a
      multiple of `stall_every`: periodic work paced by how much the server does (Python's collector runs every
      so many allocations). Deterministic, so a simulated run stays repeatable.
    - `new_step_s`: a step whose token count the session has not run before: the CPU build's oneDNN matmuls
      build a primitive for each row count they meet and keep it for the process.
    - `fresh_pair_s`: per attention pair of a step beyond the most that any of the FRESH_WINDOW steps before it
      computed: the CPU attention holds a prefill's scores in memory taken for the step, memory that after
      smaller steps is new to the process, and a virtual machine backs a page only when it is first touched.
    - `first_pair_s`: per causal pair of a step's first chunks (no context before them) beyond the most that any
      of the FIRST_WINDOW steps before it had: a prompt's first chunk is what takes that memory, a later one not.

    And a client term beyond `latency_s`: `jitter_s`, the mean of an exponential delay each token takes on its
    way out, in stream order (a token delayed holds back the ones behind it): the API server, the engine core
    and the client share one core (server_calibration.delayed; the draws: server_calibration.jitter_draws)."""

    stall_every: int = 0
    _stepped: list = field(default_factory=lambda: [0], compare=False, repr=False)  # sequences stepped so far
    _counts: set = field(default_factory=set, compare=False, repr=False)  # the token counts it has run
    _recent: deque = field(default_factory=lambda: deque(maxlen=FRESH_WINDOW), compare=False, repr=False)  # pairs
    _first: deque = field(default_factory=lambda: deque(maxlen=FIRST_WINDOW), compare=False, repr=False)

    def _session(self, sequences: int, tokens: int, pairs: float = 0.0, first: float = 0.0) -> float:
        """The session terms' seconds of the next step of the session, which it then remembers."""
        before = self._stepped[0]
        self._stepped[0] = before + sequences
        every, seconds = self.stall_every, 0.0
        if every and (before + sequences) // every > before // every:
            seconds += self.coefficients[STALL]
        if tokens not in self._counts:
            self._counts.add(tokens)
            seconds += self.coefficients[NEW_STEP]
        return (
            seconds
            + self.coefficients[FRESH_PAIRS] * beyond_recent(self._recent, pairs)
            + self.coefficients[FIRST_PAIRS] * beyond_recent(self._first, first)
        )

    def predict(self, step: StepShape) -> float:
        return super().predict(step) + self._session(
            len(step.prefills) + len(step.decodes),
            step.num_tokens,
            float(step.prefill_attention_pairs),
            first_chunk_pairs(step),
        )

    def decode_step_cost(self, batch: int) -> Callable[[int], float]:
        steps = super().decode_step_cost(batch)
        return lambda keys: steps(keys) + self._session(batch, batch)


class CpuLinearFamily(LinearFamily):
    name = "linear-cpu"
    cpu_variant_of = "linear"
    fitter = "chunkbench.tune.presearch.linear:fit_cpu_linear"
    step_terms = STEP_COEFFICIENTS
    client_terms = ("latency_s", "jitter_s")
    optional = OPTIONAL
    settings = ("stall_every",)
    unusual = (STALL, NEW_STEP)

    def step_features(self, step: StepShape) -> tuple[float, ...]:
        return cpu_step_features(step)

    def session_features(self, features, coefficients: dict) -> np.ndarray:
        return session_features(features, coefficients["stall_every"])

    def cost_model(self, calibration: ServerCalibration, config: EngineConfig) -> CpuLinearStepCost:
        coefficients = calibration.coefficients or {}
        return CpuLinearStepCost(
            tuple(coefficients[k] for k in self.step_terms),
            calibration.roofline(config),
            calibration.label(),
            stall_every=coefficients["stall_every"],
        )

    def extra_text(self, coefficients: dict, c: dict) -> str:
        return (
            (
                f" + {c['stall_s'] * 1e3:.3g} ms every {int(coefficients['stall_every'])} sequences stepped"
                if coefficients.get("stall_every")
                else ""
            )
            + (f" + {c['new_step_s'] * 1e3:.3g} ms at a token count new to the server" if c["new_step_s"] else "")
            + (
                f" + {c['fresh_pair_s'] * 1e9:.3g} ns per attention pair beyond the last {FRESH_WINDOW} steps' most"
                if c["fresh_pair_s"]
                else ""
            )
            + (
                f" + {c['first_pair_s'] * 1e9:.3g} ns per first-chunk pair beyond the last {FIRST_WINDOW} steps' most"
                if c["first_pair_s"]
                else ""
            )
        )

    def client_text(self, c: dict) -> str:
        return f" (+ {c['jitter_s'] * 1e3:.3g} ms jitter on average)" if c["jitter_s"] else ""


CPU_LINEAR = CpuLinearFamily()
