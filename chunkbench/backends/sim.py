"""The simulator as a backend: the real scheduler on a virtual clock, step times from a cost model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chunkbench.backends.engine import engine_limitation, engine_runner
from chunkbench.bench.backend import Backend, Serve
from chunkbench.engine.config import MAX_NUM_BLOCKS, EngineConfig
from chunkbench.errors import UserError

DEFAULT_SIM_GPU = "h100-sxm"


@dataclass
class SimBackend(Backend):
    """The real scheduler on a virtual clock, step times from a GPU roofline or a fitted profile."""

    gpu: str | None = None
    cost_model: str | None = None  # a profile written by `chunkbench profile` (JSON) instead of a roofline
    engine_overhead: str | None = None  # roofline: the simulated engine's step overhead (sim/engine_overhead.py)
    fast_forward: bool | None = None  # run decode-only stretches in one go (sim/fastforward.py); None: unless
    # CHUNKBENCH_FAST_FORWARD=0. Results are identical either way; off is for tests and debugging.
    server_calibration: object = None  # a sim/server_calibration.ServerCalibration: the roofline fitted to a server
    stoppable = True
    simulated = True

    @property
    def warms_up(self) -> bool:  # as the server it was fitted to does: its cost remembers what a session ran
        return self.server_calibration is not None

    def cost(self, config: EngineConfig):
        from chunkbench.sim.fitted import FittedCostModel
        from chunkbench.sim.roofline import RooflineCostModel, gpu_spec

        if self.server_calibration is not None:
            return self.server_calibration.cost_model(config)
        if self.cost_model:
            if engine_limitation(config):  # a profile times one device in the model's dtype
                raise UserError(
                    f"--cost-model profiles the real engine on one device: {engine_limitation(config)}"
                    "; use --gpu (the roofline) instead"
                )
            return FittedCostModel.load(self.cost_model)
        return RooflineCostModel.for_config(config, gpu_spec(self.gpu or DEFAULT_SIM_GPU), self.engine_overhead)

    def step_cost(self, config: EngineConfig):
        return self.cost(config)

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        from chunkbench.sim.executor import sim_engine
        from chunkbench.sim.server_calibration import delayed

        cost = self.cost(config)
        num_blocks = (
            config.cache.num_blocks
            or getattr(self.server_calibration, "num_blocks", None)
            or min(cost.kv_blocks(config), MAX_NUM_BLOCKS)
        )  # more blocks than that are never used
        serve = engine_runner(lambda: sim_engine(config, cost, num_blocks, self.fast_forward))
        yield delayed(serve, self.server_calibration)  # a linear calibration's client latency, if any

    def __str__(self) -> str:
        if self.server_calibration is not None:
            calibration = self.server_calibration
            return f"simulated, {calibration.cost_family.name} {calibration.label()}"
        return f"simulated, {'profile ' + self.cost_model if self.cost_model else self.roofline_label()}"

    def roofline_label(self) -> str:
        """Which GPU, which calibration (or 'uncalibrated') and which engine's step overhead the roofline uses."""
        from chunkbench.sim.engine_overhead import engine_overhead
        from chunkbench.sim.kernel_constants import calibration_for

        gpu = self.gpu or DEFAULT_SIM_GPU
        overhead, engine = engine_overhead(self.engine_overhead)
        return f"roofline on {gpu} ({calibration_for(gpu).label}; {engine} step overhead {overhead * 1e3:g} ms)"
