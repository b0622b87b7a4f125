"""LLMEngine: requests in, one scheduler step and one executor call per `step()`, tokens out."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from chunkbench.errors import ConfigError

from .block_manager import BlockManager
from .config import EngineConfig
from .outputs import Executor, SchedulerOutput, StepFailed, StepResult
from .request import Request, RequestStatus, SamplingParams
from .scheduler import Scheduler
from .shape import StepCost, StepShape


class RealClock:
    """Wall time: a step's duration has already passed when it returns."""

    virtual = False
    timer = staticmethod(time.perf_counter)  # what the executor times steps with (LLMEngine sets it)

    def now(self) -> float:
        return time.perf_counter()

    def advance(self, seconds: float) -> None:
        pass

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


class CpuClock:
    """This thread's CPU time, with idle waits skipped: steps are timed by the work they do, so other
    processes on a shared machine cannot stretch them (run torch on one thread, or its helpers' work is
    missed). The CI gate times real-engine cases with it."""

    virtual = False  # real work is measured: warm up first
    timer = staticmethod(time.thread_time)

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.thread_time() + self.offset

    def advance(self, seconds: float) -> None:
        pass  # the step's CPU time has already passed

    def wait(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class VirtualClock:
    """Simulated time: it moves only when told, by the predicted step time or to the next arrival."""

    time: float = 0.0
    virtual = True  # a class attribute, not a field: idle time is skipped, not slept

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds

    def wait(self, seconds: float) -> None:
        self.time += seconds


class LLMEngine:
    def __init__(
        self, config: EngineConfig, executor: Executor | None = None, clock=None, step_cost: StepCost | None = None
    ) -> None:
        """`step_cost` predicts a step's seconds for --step-time-target (default: the executor's
        `step_cost`, the simulator's cost model); one with an `observe(shape, seconds)` method is told
        every measured step (engine/step_time.py: OnlineCorrection)."""
        self.config = config
        if executor is None:
            from .executor import ModelExecutor  # torch only when a real model runs

            executor = ModelExecutor(config)
        self.executor = executor
        self.clock = clock or RealClock()
        if hasattr(executor, "timer") and hasattr(self.clock, "timer"):  # steps timed as the clock runs
            executor.timer = self.clock.timer
        self.block_manager = BlockManager(
            executor.num_blocks, config.cache.block_size, enable_caching=config.cache.enable_prefix_caching
        )
        self.step_cost = step_cost or getattr(executor, "step_cost", None)
        if config.scheduler.step_time_target_ms and self.step_cost is None:
            raise ConfigError(
                "--step-time-target needs a cost model to predict step times: the simulator has "
                "one; on the real engine give a profile (`chunkbench profile`) or let the "
                "benchmark calibrate one"
            )
        self._observe = getattr(self.step_cost, "observe", None)
        self.scheduler = Scheduler(config.scheduler, self.block_manager, seed=config.seed, step_cost=self.step_cost)
        self._ids = itertools.count()
        self._rejected: list[Request] = []
        self.last_step: tuple[SchedulerOutput, StepResult] | None = None  # for the harness's step records

    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request. One that can never be served comes back finished with `error` set, and is
        also returned by the next step(); the others are unaffected."""
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._ids)),
            prompt_token_ids=list(prompt_token_ids),
            sampling=sampling or SamplingParams(),
            eos_token_id=self.config.model.eos_token_id,
            arrival_time=self.clock.now() if arrival_time is None else arrival_time,
        )
        reason = self.scheduler.rejection_reason(request)
        if reason is not None:
            request.status, request.error = RequestStatus.FINISHED_REJECTED, reason
            self._rejected.append(request)
        else:
            self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> Request | None:
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._rejected)

    def step(self) -> list[Request]:
        """Run one step; return the requests that got a token or finished (rejected ones included)."""
        updated, self._rejected = self._rejected, []
        output = self.scheduler.schedule(self.clock.now())
        if output.is_empty:
            self.last_step = None
            return updated
        try:
            result = self.executor.execute(output)
            if self._observe is not None:
                self._observe(StepShape.from_output(output), result.seconds)
            self.clock.advance(result.seconds)
            self.last_step = (output, result)
            return updated + self.scheduler.update(output, result, self.clock.now())
        except Exception as exc:
            raise StepFailed(output, exc) from exc
