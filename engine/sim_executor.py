"""SimExecutor: the executor protocol without a model. A cost model predicts each step's seconds.

The scheduler, block manager and request logic are the real ones; only the step's duration is modelled.
Sampled ids are placeholders (0), so simulated requests run with ignore_eos semantics. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .outputs import SchedulerOutput, StepResult


@dataclass(frozen=True)
class StepShape:
    """What a step's cost depends on: its prefill chunks and its decodes."""

    prefills: tuple[tuple[int, int], ...]  # (chunk tokens, cached context before the chunk)
    decodes: tuple[int, ...]  # keys each decode reads (its context length)
    num_sampled: int  # rows that go through the LM head

    @classmethod
    def from_output(cls, output: SchedulerOutput) -> "StepShape":
        prefills, decodes, sampled = [], [], 0
        for c in output.chunks:
            if c.is_decode:
                decodes.append(c.context_len)
            else:
                prefills.append((c.num_tokens, c.start_pos))
            sampled += c.sample
        return cls(tuple(prefills), tuple(decodes), sampled)

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.prefills) + len(self.decodes)

    @property
    def prefill_attention_pairs(self) -> int:
        """Visible (query, key) pairs of the prefill chunks: each query sees the context and itself causally."""
        return sum(q * ctx + q * (q + 1) // 2 for q, ctx in self.prefills)

    @property
    def prefill_keys(self) -> int:
        return sum(q + ctx for q, ctx in self.prefills)

    @property
    def decode_keys(self) -> int:
        return sum(self.decodes)


class CostModel(Protocol):
    idle_factor: float  # a step after an idle pause of COLD_AFTER_S or more takes this many times longer

    def predict(self, step: StepShape) -> float: ...


COLD_AFTER_S = 0.2  # idle this long and the next step runs cold (clocks and caches); profiles measure by how much


class SimExecutor:
    def __init__(self, cost_model: CostModel, num_blocks: int) -> None:
        self.cost_model = cost_model
        self.num_blocks = num_blocks
        self.cold = False

    def idle(self, seconds: float) -> None:
        """The engine sat idle this long (the harness jumped the clock to the next arrival)."""
        self.cold = seconds >= COLD_AFTER_S

    def execute(self, output: SchedulerOutput) -> StepResult:
        seconds = self.cost_model.predict(StepShape.from_output(output))
        if self.cold:
            seconds *= self.cost_model.idle_factor
            self.cold = False
        return StepResult(sampled={c.request_id: 0 for c in output.chunks if c.sample}, seconds=seconds)
