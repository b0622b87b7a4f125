"""The real engine on this machine as a backend: one executor (weights and KV cache) per model, a fresh
scheduler per run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chunkbench.bench.backend import Backend, Serve
from chunkbench.bench.harness import RunResult, run_workload
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import CpuClock, LLMEngine
from chunkbench.engine.sharding import single_device_limitation
from chunkbench.errors import UserError


def engine_runner(make_engine: Callable[[], LLMEngine]) -> Serve:
    """Serve workloads on engines from `make_engine`, a fresh one (scheduler, cache, clock) per workload."""

    def serve(workload, *, seed=0, warmup_steps=3, progress=True, label="run", stop=None) -> RunResult:
        return run_workload(
            make_engine(),
            workload,
            seed=seed,
            warmup_steps=warmup_steps,
            progress=progress,
            description=label,
            stop=stop,
        )

    return serve


@dataclass
class EngineBackend(Backend):
    """The real model on this machine. Configs that share a model share one executor (weights and KV cache:
    building `small` takes seconds); each run gets a fresh scheduler."""

    cpu_time: bool = False  # time steps in this thread's CPU time on one torch thread (engine.CpuClock)
    stoppable = True
    real_engine = True
    _executors: dict = field(default_factory=dict, repr=False)

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        limitation = engine_limitation(config)
        if limitation:
            raise UserError(limitation)
        from chunkbench.engine.executor import one_torch_thread
        from chunkbench.engine.step_time import OnlineCorrection

        key = self._key(config)
        cost = self.step_cost_model(config)[0] if config.scheduler.step_time_target_ms else None

        def make() -> LLMEngine:
            step_cost = OnlineCorrection(cost.predict) if cost else None  # each run learns the ratio afresh
            engine = LLMEngine(
                config,
                executor=self._executors.get(key),
                clock=CpuClock() if self.cpu_time else None,
                step_cost=step_cost,
            )
            self._executors[key] = engine.executor
            return engine

        with one_torch_thread(self.cpu_time):
            yield engine_runner(make)

    def __str__(self) -> str:
        return "engine (CPU time, one thread)" if self.cpu_time else "engine"

    @staticmethod
    def _key(config: EngineConfig) -> tuple:
        """What an executor depends on: configs equal in these share one."""
        return (
            config.model,
            config.cache,
            config.device,
            config.dtype,
            config.attention_backend,
            config.seed,
            config.scheduler.max_num_seqs,
            config.scheduler.max_model_len,
        )

    def executor(self, config: EngineConfig):
        from chunkbench.engine.executor import ModelExecutor

        key = self._key(config)
        if key not in self._executors:
            self._executors[key] = ModelExecutor(config)
        return self._executors[key]

    def step_cost(self, config: EngineConfig):
        return self.step_cost_model(config)[0]

    def step_cost_model(self, config: EngineConfig):
        """The cost model --step-time-target sizes real steps with, and where it came from: this machine's
        saved profile of the model, else a quick calibration on the executor (once per executor)."""
        from chunkbench.backends.device_defaults import quick_profile, saved_profile
        from chunkbench.sim.fitted import FittedCostModel

        key = ("cost",) + self._key(config)
        if key not in self._executors:
            path = saved_profile(config)
            self._executors[key] = (
                (FittedCostModel.load(path), f"the profile {path}")
                if path
                else (quick_profile(config, self.executor(config)), "a quick calibration")
            )
        return self._executors[key]


def engine_limitation(config: EngineConfig | None) -> str | None:
    """Why the real engine cannot run this config (tensor parallelism, an fp8 cache), or None."""
    return None if config is None else single_device_limitation(config)
