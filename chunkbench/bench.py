"""`run` and `compare`: one engine config, or several policies, over the same workload; their outputs."""

from __future__ import annotations

import dataclasses
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from chunkbench.engine.config import EngineConfig, parse_chunk_schedule
from chunkbench.engine.engine import LLMEngine
from chunkbench.errors import UserError
from chunkbench.harness import RunResult, run_workload
from chunkbench.metrics import summarize
from chunkbench.workload import WorkloadRequest, WorkloadSpec


@dataclass
class BenchRun:
    label: str
    config: EngineConfig
    summary: dict
    result: RunResult
    backend: str = "engine"


DEFAULT_SIM_GPU = "h100-sxm"


@dataclass(frozen=True)
class Backend:
    """Where steps run: the real engine on this machine, or the simulator with a cost model."""

    kind: str = "engine"  # "engine", "sim", or "launch" (a server started per trial, measured over HTTP)
    gpu: str | None = None  # roofline cost model on this GPU
    cost_model: str | None = None  # a fitted profile (JSON) instead
    launch: str | None = None  # launch: the server command, with {knob} placeholders
    endpoint: str | None = None  # launch: its OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    launch_timeout_s: float = 300.0

    def __str__(self) -> str:
        if self.kind == "engine":
            return "engine"
        if self.kind == "launch":
            return f"launched server at {self.endpoint}"
        return f"simulated, {'profile ' + self.cost_model if self.cost_model else 'roofline on ' + self.gpu}"


def choose_backend(kind: str, model: str, gpu: str | None = None, cost_model: str | None = None) -> tuple[Backend, str | None]:
    """`auto`: the real engine, unless there is no CUDA device and the model is larger than `small`, then
    the simulator on a stated GPU. Returns the backend and a note to show the user, if any."""
    from chunkbench.cost_model import gpu_spec
    from chunkbench.engine.config import MODEL_PRESETS, ModelConfig

    if kind not in ("auto", "engine", "sim"):
        raise UserError(f"--backend must be auto, engine or sim, got '{kind}'")
    if gpu is not None:
        gpu_spec(gpu)  # validate early
    if kind == "engine" or (kind == "auto" and not gpu and not cost_model):
        if kind == "auto" and ModelConfig.from_name(model).num_params > MODEL_PRESETS["small"].num_params \
                and not _has_cuda():
            chosen = gpu or DEFAULT_SIM_GPU
            return Backend("sim", chosen), (f"no CUDA device here and {model} is larger than 'small': the figures "
                                            f"below are SIMULATED on {chosen} (roofline); pass --gpu to choose")
        return Backend("engine"), None
    if cost_model:
        return Backend("sim", cost_model=cost_model), f"the figures below are SIMULATED with profile {cost_model}"
    chosen = gpu or DEFAULT_SIM_GPU
    return Backend("sim", chosen), f"the figures below are SIMULATED on {chosen} (roofline)"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class ExecutorPool:
    """Policies that share a model share one executor (weights and KV cache): building `small` takes seconds."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend or Backend()
        self._executors: dict = {}

    def engine(self, config: EngineConfig) -> LLMEngine:
        if self.backend.kind == "sim":
            return sim_engine(config, self.backend)
        key = (config.model, config.cache, config.device, config.dtype, config.attention_backend, config.seed,
               config.scheduler.max_num_seqs, config.scheduler.max_model_len)
        engine = LLMEngine(config, executor=self._executors.get(key))
        self._executors[key] = engine.executor
        return engine


def sim_engine(config: EngineConfig, backend: Backend) -> LLMEngine:
    """The real scheduler over a SimExecutor on a virtual clock. The KV cache is --num-blocks, else the
    profiled engine's, else what fits beside the weights on the GPU."""
    from chunkbench.cost_model import FittedCostModel, RooflineCostModel, gpu_spec
    from chunkbench.engine.engine import VirtualClock
    from chunkbench.engine.sim_executor import SimExecutor

    if backend.cost_model:
        cost = FittedCostModel.load(backend.cost_model)
        num_blocks = config.cache.num_blocks or cost.num_blocks
    else:
        cost = RooflineCostModel(config.model, gpu_spec(backend.gpu or DEFAULT_SIM_GPU))
        num_blocks = config.cache.num_blocks or cost.kv_blocks(config.cache.block_size,
                                                               config.cache.gpu_memory_utilization)
    return LLMEngine(config, executor=SimExecutor(cost, num_blocks), clock=VirtualClock())


def run_benchmark(config: EngineConfig, workload: list[WorkloadRequest], *, label: str = "run",
                  goodput_ms: dict[str, float] | None = None, seed: int = 0, warmup_steps: int = 3,
                  progress: bool = True, pool: ExecutorPool | None = None,
                  backend: Backend | None = None, percentiles=()) -> BenchRun:
    engine = (pool or ExecutorPool(backend)).engine(config)
    result = run_workload(engine, workload, seed=seed, warmup_steps=warmup_steps, progress=progress,
                          description=label)
    summary = summarize(result.requests, result.steps, result.duration, goodput_ms, result.num_kv_blocks,
                        extra_percentiles=percentiles)
    return BenchRun(label, config, summary, result, str((pool.backend if pool else backend) or Backend()))


POLICY_KEYS = {  # short and long names accepted in 'policy:key=value,...'
    "budget": "max_num_batched_tokens", "max_num_batched_tokens": "max_num_batched_tokens",
    "chunk": "chunk_size", "chunk_size": "chunk_size", "schedule": "chunk_schedule",
    "chunk_schedule": "chunk_schedule", "tile": "tile", "seqs": "max_num_seqs", "max_num_seqs": "max_num_seqs",
    "partial": "max_partial_prefills", "max_partial_prefills": "max_partial_prefills",
}


def parse_policy_spec(spec: str) -> tuple[str, dict]:
    """'chunked:budget=512,schedule=2048,1024,512' -> ('chunked', {...}). A bare number continues the
    previous key's list (schedules contain commas)."""
    policy, _, rest = spec.partition(":")
    knobs: dict[str, str] = {}
    key = None
    for part in filter(None, rest.split(",")):
        if "=" in part:
            name, _, value = part.partition("=")
            if name not in POLICY_KEYS:
                raise UserError(f"policy '{spec}': unknown knob '{name}'; use {', '.join(sorted(set(POLICY_KEYS)))}")
            key = POLICY_KEYS[name]
            knobs[key] = value
        elif key == "chunk_schedule":
            knobs[key] += "," + part
        else:
            raise UserError(f"policy '{spec}': '{part}' is not key=value")
    overrides: dict = {"policy": policy}
    for key, value in knobs.items():
        if key == "chunk_schedule":
            overrides[key] = parse_chunk_schedule(value)
            continue
        try:
            overrides[key] = int(value)
        except ValueError:
            raise UserError(f"policy '{spec}': {key} needs a whole number, got '{value}'") from None
    return policy, overrides


def config_for_policy(base: dict, spec: str) -> EngineConfig:
    """The base engine flags with one policy's knobs on top. Policies that never split a prompt get a
    budget of at least max_model_len unless the spec sets one (as vLLM does without chunked prefill)."""
    policy, overrides = parse_policy_spec(spec)
    kwargs = {**base, **overrides}
    if policy != "chunked" and "max_num_batched_tokens" not in overrides:
        default = EngineConfig.create(**{**kwargs, "max_num_batched_tokens": None})
        if (kwargs.get("max_num_batched_tokens") or 0) < default.scheduler.max_num_batched_tokens:
            return default
    return EngineConfig.create(**kwargs)


def compare(base: dict, specs: list[str], workload: list[WorkloadRequest], backend: Backend | None = None,
            on_done=None, **run_kwargs) -> list[BenchRun]:
    """The same requests through each policy, one after the other, sharing one model. `on_done(run)` is
    called as each policy finishes."""
    if not specs:
        raise UserError("compare: name at least one policy, e.g. static continuous chunked")
    configs = [(spec, config_for_policy(base, spec)) for spec in specs]  # all validated before any run
    pool = ExecutorPool(backend)
    runs = []
    for spec, config in configs:
        runs.append(run_benchmark(config, workload, label=spec, pool=pool, **run_kwargs))
        if on_done:
            on_done(runs[-1])
    return runs


# ---------- outputs ----------

def describe(config: EngineConfig) -> dict:
    """The config as plain JSON-able values."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def environment() -> dict:
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"python": platform.python_version(), "torch": torch.__version__, "device": device,
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def save_run(run: BenchRun, out_dir: Path, workload_spec: WorkloadSpec | None = None) -> None:
    """summary.json (metrics, config, workload, environment), requests.parquet, steps.parquet."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"label": run.label, **run.summary, "config": describe(run.config), "backend": run.backend,
               "workload": dataclasses.asdict(workload_spec) if workload_spec else None,
               "environment": environment(), "interrupted": run.result.interrupted}
    (out_dir / "summary.json").write_text(json.dumps(payload, indent=2))
    requests_frame(run.result).to_parquet(out_dir / "requests.parquet")
    pd.DataFrame([dataclasses.asdict(s) for s in run.result.steps]).to_parquet(out_dir / "steps.parquet")


def requests_frame(result: RunResult) -> pd.DataFrame:
    rows = []
    for r in result.requests:
        rows.append({"prompt_len": r.prompt_len, "output_len": r.output_len, "arrival_time": r.arrival_time,
                     "first_scheduled_time": r.first_scheduled_time, "ttft": r.ttft if r.ok else None,
                     "tpot": r.tpot if r.ok else None, "e2el": r.e2el if r.ok else None,
                     "num_output_tokens": len(r.token_times), "num_preemptions": r.num_preemptions,
                     "num_cached_tokens": r.num_cached_tokens, "error": r.error,
                     "token_times": r.token_times})
    return pd.DataFrame(rows)
