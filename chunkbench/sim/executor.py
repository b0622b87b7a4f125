"""SimExecutor: the executor protocol without a model. A cost model predicts each step's seconds.

The scheduler, block manager and request logic are the real ones; only the step's duration is modelled.
Sampled ids are placeholders (0), so simulated requests run with ignore_eos semantics. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable

from chunkbench.engine.activation import step_activation_bytes
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine, VirtualClock
from chunkbench.engine.outputs import SchedulerOutput, StepResult
from chunkbench.sim.cost_model import COLD_AFTER_S, CostModel, StepShape
from chunkbench.sim.fastforward import enabled_by_default


class SimExecutor:
    SAMPLED_TOKEN = 0  # every sampled id

    def __init__(
        self,
        cost_model: CostModel,
        num_blocks: int,
        activation: Callable[[StepShape], int] = lambda step: 0,
        fast_forward: bool | None = None,
    ) -> None:
        self.cost_model = cost_model
        self.num_blocks = num_blocks
        self.activation = activation  # a step's peak activation bytes
        self.cold = False
        self.step_cost = cost_model.predict  # what --step-time-target sizes steps with (hot, as steps mostly are)
        # the harness may run decode-only stretches in one go (sim/fastforward.py); None: the environment's say
        self.fast_forward = enabled_by_default() if fast_forward is None else fast_forward

    def idle(self, seconds: float) -> None:
        """The engine sat idle this long (the harness jumped the clock to the next arrival)."""
        self.cold = seconds >= COLD_AFTER_S

    def execute(self, output: SchedulerOutput) -> StepResult:
        shape = StepShape.from_output(output)
        seconds = self.cost_model.predict(shape)
        if self.cold:
            seconds *= self.cost_model.idle_factor
            self.cold = False
        sampled = {c.request_id: self.SAMPLED_TOKEN for c in output.chunks if c.sample}
        return StepResult(sampled=sampled, seconds=seconds, activation_bytes=self.activation(shape))


def sim_engine(
    config: EngineConfig, cost_model: CostModel, num_blocks: int, fast_forward: bool | None = None
) -> LLMEngine:
    """The real scheduler over a SimExecutor on a virtual clock. Activation memory: the cost model's, else
    (a fitted profile) the formula for bf16 FlashAttention-style kernels."""
    activation = getattr(cost_model, "activation_bytes", None) or (
        lambda step: step_activation_bytes(
            config.model, step.prefills, step.decodes, step.num_sampled, 2, config.tensor_parallel_size, "flash"
        )
    )
    return LLMEngine(
        config, executor=SimExecutor(cost_model, num_blocks, activation, fast_forward), clock=VirtualClock()
    )
