"""Where a benchmark's steps run, behind one protocol: the real engine on this machine, the simulator, an
OpenAI-compatible server that is already running, or one launched per configuration (chunkbench/launch/backend.py).

Every backend opens a *session* for one engine config (`with backend.session(config) as serve:`) and serves
any number of workloads in it (`serve(workload, seed=..., ...)` -> RunResult): a capacity search probes many
arrival rates against one launched server, and `compare` reuses one set of weights. A server launched per
configuration is chunkbench/launch/backend.py's LaunchBackend; chunkbench/bench/backend_choice.py's `resolve()` turns
the user's `--backend auto|engine|sim|launch` into one of them, once.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chunkbench.bench.harness import RunResult, run_workload
from chunkbench.bench.workload import WorkloadRequest
from chunkbench.engine.config import MAX_NUM_BLOCKS, EngineConfig
from chunkbench.engine.engine import CpuClock, LLMEngine
from chunkbench.engine.sharding import single_device_limitation
from chunkbench.errors import UserError

DEFAULT_SIM_GPU = "h100-sxm"
Serve = Callable[..., RunResult]  # serve(workload, *, seed, warmup_steps, progress, label) -> RunResult


class Backend(ABC):
    kind: str  # "engine", "sim", "endpoint" or "launch"
    # Whether a session's first workload pays for what its server has not run yet, so that a trial runs an
    # untimed warm-up first (objectives.warm_up_server): a launched server, a simulator fitted to one. The
    # engine warms itself (harness.warm_up); a running endpoint is the user's, as it is.
    warms_up: bool = False
    stoppable: bool = False  # the harness can end a run early (the engine, the simulator: early_stop.py)
    simulated: bool = False  # a virtual clock: long runs cost seconds, so capacity probes run long

    @abstractmethod
    def session(self, config: EngineConfig | None, log: Path | None = None) -> contextlib.AbstractContextManager[Serve]:
        """A context in which workloads run on `config` (None: a server as it is). `log`: where a server this
        session starts writes its output (LaunchBackend); the other backends start none and ignore it."""

    def run(self, config: EngineConfig, workload: list[WorkloadRequest], **options) -> RunResult:
        with self.session(config) as serve:
            return serve(workload, **options)


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
    kind = "engine"
    stoppable = True
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

    def step_cost_model(self, config: EngineConfig):
        """The cost model --step-time-target sizes real steps with, and where it came from: this machine's
        saved profile of the model, else a quick calibration on the executor (once per executor)."""
        from chunkbench.bench.device_defaults import quick_profile, saved_profile
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


@dataclass
class SimBackend(Backend):
    """The real scheduler on a virtual clock, step times from a GPU roofline or a fitted profile."""

    gpu: str | None = None
    cost_model: str | None = None  # a profile written by `chunkbench profile` (JSON) instead of a roofline
    engine_overhead: str | None = None  # roofline: the simulated engine's step overhead (sim/engine_overhead.py)
    fast_forward: bool | None = None  # run decode-only stretches in one go (sim/fastforward.py); None: unless
    # CHUNKBENCH_FAST_FORWARD=0. Results are identical either way; off is for tests and debugging.
    server_calibration: object = None  # a sim/server_calibration.ServerCalibration: the roofline fitted to a server
    kind = "sim"
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


@dataclass
class EndpointBackend(Backend):
    """A running OpenAI-compatible server (chunkbench serve, vLLM, SGLang), measured over HTTP. The server's
    own settings decide everything; the client needs only the vocabulary its random prompt ids are drawn from."""

    endpoint: str
    model: str | None = None  # the name to send; None: the server's
    vocab_size: int | None = None  # None: the config's, else 32000 (connect() always resolves it)
    client_options: dict = field(default_factory=dict)  # passed to client.bench_endpoint (concurrency, ...)
    max_model_len: int | None = None  # what the server reports, if it does
    kind = "endpoint"

    @classmethod
    def connect(
        cls,
        endpoint: str,
        model: str | None = None,
        vocab_size: int | None = None,
        tokenizer: str | None = None,
        **client_options,
    ) -> EndpointBackend:
        """Read the server's model card (/v1/models): the model name to send and the context length when the
        server reports it (chunkbench serve and vLLM do). The vocabulary (vocab.resolve_vocab_size) is needed
        for token-id prompts only: chat prompts are text."""
        import httpx

        from chunkbench.bench.vocab import resolve_vocab_size

        try:
            card = httpx.get(endpoint.rstrip("/") + "/models", timeout=10).json()["data"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise UserError(f"--endpoint: no model list at {endpoint}/models: {exc}") from None
        name = model or card.get("id")
        if client_options.get("api", "completions") == "chat":
            vocab = vocab_size or card.get("vocab_size") or 32000  # only picks the words of a text prompt
        else:
            vocab = resolve_vocab_size(endpoint, name, card, vocab_size, tokenizer)
        return cls(endpoint, name, vocab, client_options, card.get("max_model_len"))

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        import asyncio

        from chunkbench.bench.client import bench_endpoint
        from chunkbench.bench.client_rules import choose_timing
        from chunkbench.bench.metrics import probe_figures
        from chunkbench.bench.server_metrics import scrape_metrics, server_figures

        # measured as the client of the server's own vLLM release measures it (the newest: not vLLM)
        timing = choose_timing(self.endpoint, None)

        def serve(workload, *, seed=0, warmup_steps=0, progress=False, label="run") -> RunResult:
            vocab = self.vocab_size or (config.model.vocab_size if config else 32000)
            before = scrape_metrics(self.endpoint)
            options = {"rules": timing.rules} | self.client_options
            result = asyncio.run(bench_endpoint(self.endpoint, workload, vocab, self.model, seed=seed, **options))
            ttfts = [r.ttft for r in result.records if r.ok]
            server = server_figures(before, scrape_metrics(self.endpoint), ttfts) | timing.record()
            if self.client_options.get("probe_rate"):
                server |= probe_figures(result.probes)
            return RunResult(result.records, [], result.duration, 0, server=server)

        yield serve

    def __str__(self) -> str:
        return f"server at {self.endpoint}"


def engine_limitation(config: EngineConfig | None) -> str | None:
    """Why the real engine cannot run this config (tensor parallelism, an fp8 cache), or None."""
    return None if config is None else single_device_limitation(config)
