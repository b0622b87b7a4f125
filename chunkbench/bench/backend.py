"""What a benchmark's steps run on, as the runs see it: a `Backend` opens a *session* for one engine config
(`with Backend.session(config) as serve:`) and serves any number of workloads in it (`serve(workload, seed=...,
...)` -> RunResult): a capacity search probes many arrival rates against one launched server, and `compare`
reuses one set of weights. The backends themselves live in chunkbench/backends/.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from chunkbench.bench.harness import RunResult
from chunkbench.engine.config import EngineConfig
from chunkbench.workloads.spec import WorkloadRequest

Serve = Callable[..., RunResult]  # serve(workload, *, seed, warmup_steps, progress, label) -> RunResult


class Backend(ABC):
    # Whether a session's first workload pays for what its server has not run yet, so that a trial runs an
    # untimed warm-up first (objectives.warm_up_server): a launched server, a simulator fitted to one. The
    # engine warms itself (harness.warm_up); a running endpoint is the user's, as it is.
    warms_up: bool = False
    stoppable: bool = False  # the harness can end a run early (the engine, the simulator: early_stop.py)
    simulated: bool = False  # a virtual clock: long runs cost seconds, so capacity probes run long
    relaunched: bool = False  # a server started per configuration: a tune re-measures its best by relaunching
    real_engine: bool = False  # the real model in this process, on this machine's device

    @abstractmethod
    def session(self, config: EngineConfig | None, log: Path | None = None) -> contextlib.AbstractContextManager[Serve]:
        """A context in which workloads run on `config` (None: a server as it is). `log`: where a server this
        session starts writes its output (LaunchBackend); the other backends start none and ignore it."""

    def step_cost(self, config: EngineConfig):
        """A cost model of this backend's steps (`predict(StepShape) -> seconds`), or None where none is known."""
        return None

    def run(self, config: EngineConfig, workload: list[WorkloadRequest], **options) -> RunResult:
        with self.session(config) as serve:
            return serve(workload, **options)
