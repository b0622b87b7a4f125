"""The `roofline` family of a server calibration (registered in sim/families.py). No torch, no scipy.

The fit (tune/presearch/roofline.py, fit_roofline) leaves the kernel *shape* constants (soft-max smoothness,
token tile, floors) alone: request latencies cannot separate them. It scales the reference device's two peaks and
sets the engine's overheads, the calibration's fields:

- `flops_scale` multiplies the reference's bf16 FLOP/s (GEMMs, attention, the LM head): prefill-bound time;
- `bandwidth_scale` multiplies its memory bandwidth (weight streaming, KV reads, elementwise kernels):
  decode-bound time;
- `step_overhead_s` is the per-step engine time (scheduling, launches, sampling);
- `seq_overhead_s` is the per-step time of each sequence in the step (input preparation, detokenizing and
  streaming its token): what makes a server's ITL grow with its batch beyond the kernels' share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chunkbench.engine.config import EngineConfig
from chunkbench.sim.cost_family import CostFamily
from chunkbench.sim.cost_model import StepShape
from chunkbench.sim.roofline import RooflineCostModel

if TYPE_CHECKING:
    from chunkbench.sim.server_calibration import ServerCalibration


class RooflineFamily(CostFamily):
    name = "roofline"
    fitter = "chunkbench.tune.presearch.roofline:fit_roofline"

    def cost_model(
        self, calibration: ServerCalibration, config: EngineConfig
    ) -> RooflineCostModel | PerSequenceOverhead:
        roofline = calibration.roofline(config)
        return PerSequenceOverhead(roofline, calibration.seq_overhead_s) if calibration.seq_overhead_s else roofline

    def describe(self, calibration: ServerCalibration) -> str:
        c = calibration
        return (
            f"fitted to the server on the {c.device} reference: compute x{c.flops_scale:.3g}, bandwidth "
            f"x{c.bandwidth_scale:.3g}, step overhead {c.step_overhead_s * 1e3:.3g} ms + "
            f"{c.seq_overhead_s * 1e3:.3g} ms per sequence"
        )


ROOFLINE = RooflineFamily()


@dataclass(frozen=True)
class PerSequenceOverhead:
    """A roofline plus a fixed time per sequence in each step (the CostModel protocol of sim/cost_model.py)."""

    base: RooflineCostModel
    seq_overhead_s: float

    @property
    def idle_factor(self) -> float:
        return self.base.idle_factor

    def predict(self, step: StepShape) -> float:
        return self.base.predict(step) + self.seq_overhead_s * (len(step.prefills) + len(step.decodes))

    def decode_step_cost(self, batch: int) -> Callable[[int], float]:  # the fast path's (sim/roofline.py), bit for bit
        base, per_batch = self.base.decode_step_cost(batch), self.seq_overhead_s * batch
        return lambda keys: base(keys) + per_batch

    def rows_activation_bytes(self, rows: int, sampled: int) -> int:
        return self.base.rows_activation_bytes(rows, sampled)

    def kv_blocks(self, config: EngineConfig) -> int:
        return self.base.kv_blocks(config)

    def activation_bytes(self, step: StepShape) -> int:
        return self.base.activation_bytes(step)

    def __str__(self) -> str:
        return str(self.base)
