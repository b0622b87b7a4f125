"""StepShape: what a step's cost depends on, in plain tuples. No torch, no chunkbench.

It lives in engine/ because the scheduler describes candidate steps with it when it sizes a step to a time
target (`step_time_target_ms`); cost models (chunkbench/sim/) predict its seconds, and
chunkbench.sim.cost_model re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .outputs import SchedulerOutput


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step's cost depends on: its prefill chunks and its decodes."""

    prefills: tuple[tuple[int, int], ...]  # (chunk tokens, cached context before the chunk)
    decodes: tuple[int, ...]  # keys each decode reads (its context length)
    num_sampled: int  # rows that go through the LM head

    @classmethod
    def from_output(cls, output: SchedulerOutput) -> StepShape:
        prefills, decodes, sampled = [], [], 0
        for c in output.chunks:  # ScheduledChunk's num_tokens and context_len, inlined: this runs every step
            if c.is_decode:
                decodes.append(c.start_pos + len(c.token_ids))
            else:
                prefills.append((len(c.token_ids), c.start_pos))
            sampled += c.sample
        return cls(tuple(prefills), tuple(decodes), sampled)

    # Most simulated steps are decode-only: their prefill sums are 0 without running a generator.
    @property
    def num_tokens(self) -> int:
        if not self.prefills:
            return len(self.decodes)
        return sum(q for q, _ in self.prefills) + len(self.decodes)

    @property
    def prefill_attention_pairs(self) -> int:
        """Visible (query, key) pairs of the prefill chunks: each query sees the context and itself causally."""
        if not self.prefills:
            return 0
        return sum(q * ctx + q * (q + 1) // 2 for q, ctx in self.prefills)

    @property
    def prefill_keys(self) -> int:
        if not self.prefills:
            return 0
        return sum(q + ctx for q, ctx in self.prefills)

    @property
    def decode_keys(self) -> int:
        return sum(self.decodes)


StepCost = Callable[[StepShape], float]  # a step's predicted seconds: a cost model's `predict`
