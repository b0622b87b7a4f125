"""What one tuning run is: the model, SLAs, search space, workload, backend and objective; and a trial's
outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chunkbench.bench.backend import Backend
from chunkbench.bench.slo import SLO
from chunkbench.engine.config import EngineConfig
from chunkbench.tune.space import SearchSpace
from chunkbench.workloads.spec import WorkloadSpec


@dataclass
class TuneSpec:
    model: str
    slos: list[SLO]
    space: SearchSpace
    workload: WorkloadSpec
    backend: Backend
    objective: str = "goodput"  # a registered objective's name (tune/objectives/registry.py), kept as stored
    n_trials: int = 60
    timeout_s: float | None = None
    seed: int = 0
    max_sched_delay_ms: float = 2000.0  # capacity: median scheduling delay bound (Sarathi-Serve uses 2 s)
    early_stop: bool = True  # capacity: end a probe once it has certainly missed (bench/early_stop.py)
    probe_seconds: float | None = None  # capacity on a real clock: a probe may grow to this many s of arrivals
    engine_overrides: dict = field(default_factory=dict)  # fixed flags: max_model_len, num_blocks, ...
    versions: dict = field(default_factory=dict)  # server kind -> the release its configs target; absent: newest

    def base_config(self, **knobs) -> EngineConfig:
        return EngineConfig.create(self.model, **{**self.engine_overrides, **knobs})


@dataclass
class TrialOutcome:
    values: list[float]
    constraints: dict[str, float]  # per SLO: measured minus limit (ms); <= 0 is met
    metrics: dict
    knobs: dict
    repeats: list[dict] = field(default_factory=list)  # a repeated measurement (median_outcome): each run's metrics

    @property
    def feasible(self) -> bool:
        return max(self.constraints.values(), default=0.0) <= 0


def default_study_name(spec: TuneSpec) -> str:
    return f"{spec.model}-{Path(spec.workload.name).stem}-{spec.objective}".replace("/", "_")
