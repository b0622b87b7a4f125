"""Where a benchmark's steps run, behind one protocol: the real engine on this machine, the simulator, an
OpenAI-compatible server that is already running, or one launched per configuration.

Every backend opens a *session* for one engine config (`with backend.session(config) as serve:`) and serves
any number of workloads in it (`serve(workload, seed=..., ...)` -> RunResult): a capacity search probes many
arrival rates against one launched server, and `compare` reuses one set of weights. `resolve()` turns the
user's `--backend auto|engine|sim|launch` into one of them, once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from chunkbench.engine.config import MAX_NUM_BLOCKS, EngineConfig, ModelConfig
from chunkbench.engine.presets import MODEL_PRESETS
from chunkbench.engine.engine import CpuClock, LLMEngine
from chunkbench.engine.knobs import KNOBS
from chunkbench.engine.sharding import single_device_limitation
from chunkbench.errors import UserError
from chunkbench.harness import RunResult, run_workload
from chunkbench.workload import WorkloadRequest

DEFAULT_SIM_GPU = "h100-sxm"
Serve = Callable[..., RunResult]  # serve(workload, *, seed, warmup_steps, progress, label) -> RunResult


class Backend(ABC):
    kind: str  # "engine", "sim", "endpoint" or "launch"

    @abstractmethod
    def session(self, config: EngineConfig | None) -> contextlib.AbstractContextManager[Serve]:
        """A context in which workloads run on `config` (None: a server as it is)."""

    def run(self, config: EngineConfig, workload: list[WorkloadRequest], **options) -> RunResult:
        with self.session(config) as serve:
            return serve(workload, **options)


def engine_runner(make_engine: Callable[[], LLMEngine]) -> Serve:
    """Serve workloads on engines from `make_engine`, a fresh one (scheduler, cache, clock) per workload."""
    def serve(workload, *, seed=0, warmup_steps=3, progress=True, label="run", stop=None) -> RunResult:
        return run_workload(make_engine(), workload, seed=seed, warmup_steps=warmup_steps, progress=progress,
                            description=label, stop=stop)
    return serve


@dataclass
class EngineBackend(Backend):
    """The real model on this machine. Configs that share a model share one executor (weights and KV cache:
    building `small` takes seconds); each run gets a fresh scheduler."""

    cpu_time: bool = False  # time steps in this thread's CPU time on one torch thread (engine.CpuClock)
    kind = "engine"
    _executors: dict = field(default_factory=dict, repr=False)

    @contextlib.contextmanager
    def session(self, config: EngineConfig) -> Iterator[Serve]:
        limitation = engine_limitation(config)
        if limitation:
            raise UserError(limitation)
        from chunkbench.engine.executor import one_torch_thread
        from chunkbench.engine.step_time import OnlineCorrection

        key = self._key(config)
        cost = self.step_cost_model(config)[0] if config.scheduler.step_time_target_ms else None

        def make() -> LLMEngine:
            step_cost = OnlineCorrection(cost.predict) if cost else None  # each run learns the ratio afresh
            engine = LLMEngine(config, executor=self._executors.get(key), clock=CpuClock() if self.cpu_time else None,
                               step_cost=step_cost)
            self._executors[key] = engine.executor
            return engine
        with one_torch_thread(self.cpu_time):
            yield engine_runner(make)

    def __str__(self) -> str:
        return "engine (CPU time, one thread)" if self.cpu_time else "engine"

    @staticmethod
    def _key(config: EngineConfig) -> tuple:
        """What an executor depends on: configs equal in these share one."""
        return (config.model, config.cache, config.device, config.dtype, config.attention_backend, config.seed,
                config.scheduler.max_num_seqs, config.scheduler.max_model_len)

    def executor(self, config: EngineConfig):
        from chunkbench.engine.executor import ModelExecutor

        key = self._key(config)
        if key not in self._executors:
            self._executors[key] = ModelExecutor(config)
        return self._executors[key]

    def step_cost_model(self, config: EngineConfig):
        """The cost model --step-time-target sizes real steps with, and where it came from: this machine's
        saved profile of the model, else a quick calibration on the executor (once per executor)."""
        from chunkbench.device_defaults import quick_profile, saved_profile
        from chunkbench.sim.fitted import FittedCostModel

        key = ("cost",) + self._key(config)
        if key not in self._executors:
            path = saved_profile(config)
            self._executors[key] = ((FittedCostModel.load(path), f"the profile {path}") if path else
                                    (quick_profile(config, self.executor(config)), "a quick calibration"))
        return self._executors[key]


@dataclass
class SimBackend(Backend):
    """The real scheduler on a virtual clock, step times from a GPU roofline or a fitted profile."""

    gpu: str | None = None
    cost_model: str | None = None  # a profile written by `chunkbench profile` (JSON) instead of a roofline
    engine_overhead: str | None = None  # roofline: the simulated engine's step overhead (sim/engines.py)
    fast_forward: bool | None = None  # run decode-only stretches in one go (sim/fastforward.py); None: unless
    # CHUNKBENCH_FAST_FORWARD=0. Results are identical either way; off is for tests and debugging.
    server_calibration: object = None  # a sim/server_calibration.ServerCalibration: the roofline fitted to a server
    kind = "sim"

    def cost(self, config: EngineConfig):
        from chunkbench.sim.fitted import FittedCostModel
        from chunkbench.sim.roofline import RooflineCostModel, gpu_spec

        if self.server_calibration is not None:
            return self.server_calibration.cost_model(config)
        if self.cost_model:
            if engine_limitation(config):  # a profile times one device in the model's dtype
                raise UserError(f"--cost-model profiles the real engine on one device: {engine_limitation(config)}"
                                "; use --gpu (the roofline) instead")
            return FittedCostModel.load(self.cost_model)
        return RooflineCostModel.for_config(config, gpu_spec(self.gpu or DEFAULT_SIM_GPU), self.engine_overhead)

    @contextlib.contextmanager
    def session(self, config: EngineConfig) -> Iterator[Serve]:
        from chunkbench.sim.executor import sim_engine

        cost = self.cost(config)
        num_blocks = (config.cache.num_blocks or getattr(self.server_calibration, "num_blocks", None)
                      or min(cost.kv_blocks(config), MAX_NUM_BLOCKS))  # more blocks than that are never used
        yield engine_runner(lambda: sim_engine(config, cost, num_blocks, self.fast_forward))

    def __str__(self) -> str:
        if self.server_calibration is not None:
            return f"simulated, roofline {self.server_calibration.label()}"
        return f"simulated, {'profile ' + self.cost_model if self.cost_model else self.roofline_label()}"

    def roofline_label(self) -> str:
        """Which GPU, which calibration (or 'uncalibrated') and which engine's step overhead the roofline uses."""
        from chunkbench.sim.calibration import calibration_for
        from chunkbench.sim.engines import engine_overhead

        gpu = self.gpu or DEFAULT_SIM_GPU
        overhead, engine = engine_overhead(self.engine_overhead)
        return (f"roofline on {gpu} ({calibration_for(gpu).label}; {engine} step overhead "
                f"{overhead * 1e3:g} ms)")


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
    def connect(cls, endpoint: str, model: str | None = None, vocab_size: int | None = None,
                tokenizer: str | None = None, **client_options) -> "EndpointBackend":
        """Read the server's model card (/v1/models): the model name to send and the context length when the
        server reports it (chunkbench serve and vLLM do). The vocabulary (vocab.resolve_vocab_size) is needed
        for token-id prompts only: chat prompts are text."""
        import httpx

        from chunkbench.vocab import resolve_vocab_size

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
    def session(self, config: EngineConfig) -> Iterator[Serve]:
        import asyncio

        from chunkbench.client import bench_endpoint
        from chunkbench.server_metrics import scrape_metrics, server_figures

        def serve(workload, *, seed=0, warmup_steps=0, progress=False, label="run") -> RunResult:
            vocab = self.vocab_size or (config.model.vocab_size if config else 32000)
            before = scrape_metrics(self.endpoint)
            result = asyncio.run(bench_endpoint(self.endpoint, workload, vocab,
                                                self.model, seed=seed, **self.client_options))
            ttfts = [r.ttft for r in result.records if r.ok]
            server = server_figures(before, scrape_metrics(self.endpoint), ttfts)
            return RunResult(result.records, [], result.duration, 0, server=server)
        yield serve

    def __str__(self) -> str:
        return f"server at {self.endpoint}"


def launches_vllm(template: str) -> bool:
    """Whether a --launch command starts vLLM: `vllm serve` (any path to the CLI), vLLM's API server module, or
    a template filled with {vllm_flags}."""
    return bool(re.search(r"(^|[\s/])vllm\s+serve\b|vllm\.entrypoints|\{vllm_flags\}", template))


def launch_values(config: EngineConfig) -> dict:
    """The placeholders of a --launch command: {model}, every knob of engine/knobs.py by name and by its vLLM
    option (dashes as underscores), a knob the config leaves unset as 0 (vLLM's 'no cap'); and whole flag
    lists with unset knobs left out: {vllm_flags} (vLLM's options, e.g. `vllm serve {model} {vllm_flags}`) and
    {chunkbench_flags} (`chunkbench serve --model small {chunkbench_flags}`)."""
    from chunkbench.tune.emit import chunkbench_flags, first_chunk_cap, vllm_option_flags

    values = {"model": config.model.hf_dir or config.model.name}
    for knob in KNOBS.values():
        value = knob.read(config)
        value = ",".join(map(str, value)) if isinstance(value, tuple) else value
        values[knob.name] = 0 if value in (None, "") else value
    values["long_prefill_token_threshold"] = first_chunk_cap(config.scheduler) or 0
    values |= {k.vllm.replace("-", "_"): values[k.name] for k in KNOBS.values() if k.vllm}
    values |= {"vllm_flags": vllm_option_flags(config), "chunkbench_flags": chunkbench_flags(config)}
    return values


def launch_command(template: str, config: EngineConfig) -> str:
    values = launch_values(config)
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(f"--launch: cannot fill '{template}': unknown placeholder {exc}; use "
                        f"{', '.join('{' + k + '}' for k in sorted(values))}") from None


class LaunchError(RuntimeError):
    """A launched server that never became healthy (a failed trial); the message quotes its last lines."""


def log_tail(path: Path, lines: int = 3, width: int = 300) -> str:
    """The last non-blank lines of a server's log in one line, e.g. vLLM's `vllm: error: unrecognized ...`."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    kept = [line.strip()[:width] for line in text if line.strip()][-lines:]
    return " | ".join(kept) or "(no output)"


@dataclass
class LaunchBackend(Backend):
    """A server started for each config from a command template, measured over HTTP, stopped after the
    session. Its output goes to `log` (tune keeps one per trial: trials/<n>/launch.log). A server that does not
    come up raises LaunchError quoting the log's last lines (a failed trial, not a failed study)."""

    launch: str  # the command, with {knob} placeholders (launch_values)
    endpoint: str  # its OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    timeout_s: float = 300.0  # to wait for /health
    client_options: dict = field(default_factory=dict)
    kind = "launch"

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        from chunkbench.client import wait_healthy

        with contextlib.ExitStack() as stack:
            where = f" (whole log: {log})" if log else ""
            if log is None:  # nobody keeps it: a temporary file, still quoted when the launch fails
                log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunkbench-launch-"))) / "launch.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            command = launch_command(self.launch, config)
            with open(log, "w") as out:
                out.write(f"$ {command}\n")
                out.flush()
                try:
                    process = subprocess.Popen(shlex.split(command), stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)
                except OSError as exc:  # no such program, not executable
                    raise LaunchError(f"cannot start `{command}`: {exc.strerror}") from None
            stack.callback(stop_server, process)
            try:
                wait_healthy(self.endpoint, self.timeout_s, process)
            except RuntimeError as exc:
                raise LaunchError(f"{exc}; its output ended: {log_tail(log)}{where}") from None
            with EndpointBackend(self.endpoint, client_options=self.client_options).session(config) as serve:
                yield serve

    def __str__(self) -> str:
        return f"launched server at {self.endpoint}"


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---------- choosing one ----------

def engine_limitation(config: EngineConfig | None) -> str | None:
    """Why the real engine cannot run this config (tensor parallelism, an fp8 cache), or None."""
    return None if config is None else single_device_limitation(config)


KINDS = ("auto", "engine", "sim", "launch")


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def runs_here(model: str) -> bool:
    """Whether the real engine can run this model here in useful time: any model on CUDA, and models up to
    `small` on the CPU."""
    return has_cuda() or ModelConfig.from_name(model).num_params <= MODEL_PRESETS["small"].num_params


@dataclass(frozen=True)
class Resolved:
    backend: Backend
    note: str | None = None  # what the user should be told (simulated figures, calibration used)
    verify: bool = False  # search only: re-measure the best trials on the real engine


def resolve(kind: str, model: str, *, gpu: str | None = None, cost_model: str | None = None,
            search: bool = False, launch: str | None = None, endpoint: str | None = None,
            launch_timeout_s: float = 300.0, config: EngineConfig | None = None,
            engine_overhead: str | None = None) -> Resolved:
    """`auto` for a run: the real engine unless the model is too large for this machine, then the simulator
    on a stated GPU. `auto` for a search (`search=True`): the simulator, calibrated by this machine's profile
    of the model when there is one, with the best trials verified on the real engine when the model runs
    here. A `config` the real engine cannot run (tensor parallelism, an fp8 cache) makes `auto` simulate, on
    the roofline, and `engine` an error."""
    from chunkbench.sim.roofline import gpu_spec

    if kind not in KINDS or (kind == "launch" and not search):
        allowed = KINDS if search else KINDS[:3]
        raise UserError(f"--backend must be {', '.join(allowed[:-1])} or {allowed[-1]}, got '{kind}'")
    if gpu is not None:
        gpu_spec(gpu)  # validated before anything runs
    from chunkbench.sim.engines import engine_overhead as check_overhead

    check_overhead(engine_overhead)  # likewise
    if kind == "launch":
        if not launch or not endpoint:
            raise UserError("--backend launch needs --launch COMMAND and --endpoint URL")
        return Resolved(LaunchBackend(launch, endpoint, launch_timeout_s))
    limitation = engine_limitation(config)
    if kind == "engine":
        if limitation:
            raise UserError(limitation)
        return Resolved(EngineBackend())
    if limitation and kind == "auto":
        chosen = _simulated(gpu, cost_model, engine_overhead)
        return Resolved(chosen.backend, f"{limitation.split(' needs')[0]}: {chosen.note}"
                        + ("" if gpu else "; pass --gpu to choose"))
    if kind == "sim" or gpu or (cost_model and not search):
        return _simulated(gpu, cost_model, engine_overhead)
    local = runs_here(model)
    if not search:
        if local:
            return Resolved(EngineBackend())
        chosen = _simulated(None, None, engine_overhead)
        return Resolved(chosen.backend, f"no CUDA device here and {model} is larger than 'small': {chosen.note}; "
                                        "pass --gpu to choose")
    from chunkbench.sim.profile import profile_path

    profile = cost_model or profile_path(_device_name(), ModelConfig.from_name(model).name)
    if cost_model or os.path.exists(profile):  # a missing --cost-model fails when it is loaded, by name
        return Resolved(SimBackend(cost_model=profile), f"searching in simulation calibrated by {profile}"
                        + ("; the best trials are re-measured on the real engine" if local else ""), verify=local)
    hint = f" (run `chunkbench profile --model {model}` to calibrate for this machine)" if local else ""
    backend = SimBackend(DEFAULT_SIM_GPU, engine_overhead=engine_overhead)
    return Resolved(backend, f"searching SIMULATED with the {backend.roofline_label()}{hint}; no real-engine check")


def _simulated(gpu: str | None, cost_model: str | None, engine_overhead: str | None = None) -> Resolved:
    backend = SimBackend(gpu=None if cost_model else gpu or DEFAULT_SIM_GPU, cost_model=cost_model,
                         engine_overhead=engine_overhead)
    what = f"profile {cost_model}" if cost_model else f"the {backend.roofline_label()}"
    return Resolved(backend, f"the figures below are SIMULATED with {what}")


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
