"""What a cost-model family of a server calibration is (the registry: sim/families.py). No torch, no scipy.

A family is the shape of a step cost whose constants a server calibration stores (sim/server_calibration.py).
It checks those constants when a calibration is made or read, builds the CostModel (sim/cost_model.py) that prices
steps with them, says what they are in words, and names the function that fits them to a server's
calibration runs (tune/presearch/server.py calls it through `fit`)."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chunkbench.engine.config import EngineConfig
    from chunkbench.sim.cost_model import CostModel
    from chunkbench.sim.server_calibration import ServerCalibration

# What a family's fitter returns: the fitted calibration scored on the runs, and each run simulated under it
Scored = tuple["ServerCalibration", dict]


class CostFamily(ABC):
    name: str = ""  # what a calibration file stores in `family`
    # "module:function" that fits it: function(family, runs, spec, device, meta, score, **options) -> Scored.
    # `meta`: the ServerCalibration fields the fit does not choose (family, model, server, num_blocks);
    # `score`: scores a candidate on the runs (presearch.server.fit); `options`: the fit's search settings.
    fitter: str = ""
    # the registered family this one stands in for when the server runs on a CPU (families.resolve), if any
    cpu_variant_of: str | None = None

    def check(self, calibration: ServerCalibration) -> None:  # noqa: B027 (a hook: most families check nothing)
        """Validate (UserError, one line) and normalise the stored constants, in place. Nothing by default."""

    @abstractmethod
    def cost_model(self, calibration: ServerCalibration, config: EngineConfig) -> CostModel:
        """The cost model of the calibrated server for one engine configuration."""

    @abstractmethod
    def describe(self, calibration: ServerCalibration) -> str:
        """The constants in words, for labels and reports (without the fit's error)."""

    def client_delay(self, calibration: ServerCalibration) -> tuple[float, float]:
        """(latency, mean jitter) in seconds that every token takes from its step's end to the client
        (server_calibration.delayed): the stored `latency_s` and `jitter_s`, where a family keeps them."""
        coefficients = calibration.coefficients or {}
        return coefficients.get("latency_s", 0.0), coefficients.get("jitter_s", 0.0)

    def fit(
        self,
        runs: list[dict],
        spec: Any,
        device: str,
        meta: dict,
        score: Callable[[ServerCalibration], Scored],
        **options: Any,
    ) -> Scored:
        """Fit this family's constants to `runs` with its `fitter`, imported only now (it needs scipy)."""
        module, _, function = self.fitter.partition(":")
        fitter = getattr(importlib.import_module(module), function)
        return fitter(self, runs, spec, device, meta, score, **options)
