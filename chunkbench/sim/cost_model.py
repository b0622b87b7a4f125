"""What a simulated step's cost depends on (StepShape, defined in engine/shape.py so the scheduler can size
steps with it, re-exported here), and what predicts it (the CostModel protocol). No torch."""

from __future__ import annotations

from typing import Protocol

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.shape import StepShape  # noqa: F401 (re-exported: cost models import it from here)


class CostModel(Protocol):
    """Predicts step times: the roofline (sim/roofline.py), a fitted profile (sim/fitted.py), or a server
    calibration's family (sim/families.py)."""

    @property
    def idle_factor(self) -> float:
        """A step after an idle pause of COLD_AFTER_S or more takes this many times longer."""

    def predict(self, step: StepShape) -> float: ...

    def kv_blocks(self, config: EngineConfig) -> int:
        """KV blocks of the simulated engine when --num-blocks does not say."""


COLD_AFTER_S = 0.2  # idle this long and the next step runs cold (clocks and caches); profiles measure by how much
