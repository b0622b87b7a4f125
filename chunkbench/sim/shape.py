"""What a simulated step's cost depends on (StepShape), and what predicts it (the CostModel protocol). No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.outputs import SchedulerOutput


@dataclass(frozen=True)
class StepShape:
    """What a step's cost depends on: its prefill chunks and its decodes."""

    prefills: tuple[tuple[int, int], ...]  # (chunk tokens, cached context before the chunk)
    decodes: tuple[int, ...]  # keys each decode reads (its context length)
    num_sampled: int  # rows that go through the LM head

    @classmethod
    def from_output(cls, output: SchedulerOutput) -> "StepShape":
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


class CostModel(Protocol):
    """Predicts step times: the roofline (sim/roofline.py) or a fitted profile (sim/fitted.py)."""

    idle_factor: float  # a step after an idle pause of COLD_AFTER_S or more takes this many times longer

    def predict(self, step: StepShape) -> float: ...

    def kv_blocks(self, config: EngineConfig) -> int:
        """KV blocks of the simulated engine when --num-blocks does not say."""


COLD_AFTER_S = 0.2  # idle this long and the next step runs cold (clocks and caches); profiles measure by how much
