"""Sizing a step to a time target (`step_time_target_ms`): the step being built as a cost model sees it, and
the largest prompt chunk that keeps its predicted time within the target. Also the online correction of a
cost model by measured step times. No torch: the scheduler uses this on every step of the simulator.

The cost model is any `step_cost(StepShape) -> seconds` callable: the simulator's roofline or profile, and
on the real engine a profile (chunkbench/sim/fitted.py) wrapped in `OnlineCorrection`.
"""

from __future__ import annotations

from .shape import StepCost, StepShape

MIN_CHUNK_TOKENS = 16  # the first prompt chunk of a step gets at least this many, so prefills always progress


class StepTimer:
    """The step under construction (its prefill chunks and decodes) and what a cost model predicts for it."""

    def __init__(self, cost: StepCost, target_s: float, min_chunk: int = MIN_CHUNK_TOKENS) -> None:
        self.cost = cost
        self.target_s = target_s
        self.min_chunk = min_chunk
        self.prefills: list[tuple[int, int]] = []
        self.decodes: list[int] = []
        self.sampled = 0

    def add(self, tokens: int, context: int, is_decode: bool, samples: bool) -> None:
        """A chunk of `tokens` at `context` cached tokens joins the step."""
        if is_decode:
            self.decodes.append(context + tokens)
        else:
            self.prefills.append((tokens, context))
        self.sampled += samples

    def predict(self, tokens: int = 0, context: int = 0, samples: bool = False) -> float:
        """Predicted seconds of the step with one more prompt chunk (none when tokens == 0)."""
        prefills = self.prefills + [(tokens, context)] if tokens else self.prefills
        return self.cost(StepShape(tuple(prefills), tuple(self.decodes), self.sampled + samples))

    def fit(self, n_max: int, context: int, remaining: int) -> int:
        """The most tokens (<= n_max) of a prompt chunk at `context` that keep the step within the target:
        exact, by bisection (cost grows with tokens). The step's first prompt chunk gets at least
        min_chunk tokens, whatever the decodes already cost."""
        if n_max <= 0:
            return 0
        floor = 0 if self.prefills else min(self.min_chunk, n_max)
        if self.predict(n_max, context, n_max == remaining) <= self.target_s:  # the common case: room for all
            return n_max
        lo, hi = 0, n_max  # invariant: lo fits (or is 0), hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.predict(mid, context) <= self.target_s:
                lo = mid
            else:
                hi = mid
        return max(lo, floor)


class OnlineCorrection:
    """A cost model corrected by measured step times: predictions are scaled by an exponentially weighted
    average of measured / predicted (weight `alpha` per observed step), so a profile taken on a quieter
    machine, or a quick calibration, converges to what steps take now. Only steps with prompt tokens are
    observed: those are the steps the target sizes, and decode-only steps would pull the ratio toward a
    regime the target never decides. Each ratio sample is clamped to [1/8, 8] so one outlier (a page fault,
    another process) cannot swing it."""

    def __init__(self, base: StepCost, alpha: float = 0.1) -> None:
        self.base = base
        self.alpha = alpha
        self.ratio = 1.0
        self.observed = 0

    def __call__(self, shape: StepShape) -> float:
        return self.base(shape) * self.ratio

    def observe(self, shape: StepShape, seconds: float) -> None:
        if not shape.prefills:
            return
        predicted = self.base(shape)
        if predicted <= 0 or seconds <= 0:
            return
        sample = min(8.0, max(0.125, seconds / predicted))
        self.ratio += self.alpha * (sample - self.ratio)
        self.observed += 1
