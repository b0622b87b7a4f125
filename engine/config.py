"""Engine configuration: frozen, validated dataclasses (the model's shape is engine/model_config.py).

Errors name the field and its legal range, so the CLI can show them to a user as one line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from chunkbench.errors import ConfigError

from . import policies
from .knobs import KNOBS, default
from .model_config import ModelConfig, _positive, _require
from .sharding import check_tensor_parallel

ATTENTION_BACKENDS = ("auto", "triton", "torch")
# Far above any real deployment (vLLM's budgets reach ~10^5 tokens, its seats ~10^3); they keep the memory
# model's per-step shapes (a tuple per sequence of vLLM's profiling step) a size Python can build.
MAX_BUDGET, MAX_SEQS = 2**24, 2**20
MAX_NUM_BLOCKS = 2**21  # 33M tokens at 16 per block: more than any workload here needs, small enough to index
DTYPES = ("float32", "float16", "bfloat16", "float64")
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: `num_blocks` blocks of `block_size` tokens each.

    num_blocks=None sizes the cache from memory: on CUDA, `gpu_memory_utilization` of the device less the
    weights; on the CPU, at most `cpu_kv_cache_gib` and 90% of the free memory; never more than max_num_seqs
    full-length requests.
    """

    block_size: int = default("block_size")
    num_blocks: int | None = default("num_blocks")
    gpu_memory_utilization: float = default("gpu_memory_utilization")
    cpu_kv_cache_gib: float = default("cpu_kv_cache_gib")
    enable_prefix_caching: bool = default("enable_prefix_caching")
    kv_cache_dtype: str = default("kv_cache_dtype")

    def __post_init__(self) -> None:
        _require(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got '{self.kv_cache_dtype}'",
        )
        _require(
            self.block_size in (1, 2, 4, 8, 16, 32, 64, 128),
            f"--block-size must be a power of two from 1 to 128, got {self.block_size}",
        )
        if self.num_blocks is not None:
            _require(
                1 <= self.num_blocks <= MAX_NUM_BLOCKS,
                f"--num-blocks must be from 1 to {MAX_NUM_BLOCKS:,}, got {self.num_blocks}",
            )
        _require(
            0 < self.gpu_memory_utilization <= 1,
            f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _require(
            0 < self.cpu_kv_cache_gib <= 2**20,  # nan and inf fail too
            f"--cpu-kv-cache-gib must be in (0, 1048576] GiB, got {self.cpu_kv_cache_gib}",
        )

    def kv_bytes_per_block(self, model: ModelConfig, dtype_bytes: int) -> int:
        return self.block_size * model.kv_bytes_per_token(dtype_bytes)

    def kv_dtype_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one cached K or V value: fp8 is one byte (vLLM's --kv-cache-dtype fp8), auto the model's."""
        return 1 if self.kv_cache_dtype == "fp8" else dtype_bytes


def parse_chunk_schedule(text: str | None) -> tuple[int, ...]:
    """'2048,1024,512' -> (2048, 1024, 512). Empty or None -> ()."""
    if not text:
        return ()
    try:
        values = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise ConfigError(
            f"--chunk-schedule must be comma-separated token counts like 2048,1024,512, got '{text}'"
        ) from None
    return values


def min_budget(policy: str, max_model_len: int) -> int:
    """The smallest token budget a policy can run with (engine/policies/base.py)."""
    check_policy(policy)
    return policies.get(policy).min_budget(max_model_len)


def check_policy(name: str) -> None:
    _require(name in policies.REGISTRY, f"--policy must be one of {', '.join(policies.names())}, got '{name}'")


def check_device(name: str) -> None:
    """auto, cpu, cuda or cuda:N (the one rule for every --device)."""
    _require(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", name) is not None, f"--device must be auto, cpu or cuda[:N], got '{name}'"
    )


def default_budget(policy: str, max_model_len: int) -> int:
    """2048 tokens (vLLM's default with chunked prefill), raised to what the policy needs."""
    return max(2048, min_budget(policy, max_model_len))


@dataclass(frozen=True)
class SchedulerConfig:
    """How each step's token budget and seats are spent (see docs/architecture.md, 'The step loop')."""

    policy: str = default("policy")
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = default("max_num_seqs")
    max_model_len: int = 2048
    chunk_size: int | None = None  # per-request cap on prompt tokens per step (chunked only)
    chunk_schedule: tuple[int, ...] = ()  # progressive caps: i-th chunk of a prompt <= entry i (last repeats)
    tile: int | None = None  # trim cut prompt chunks so the step's token count is a multiple of this
    max_partial_prefills: int | None = None  # prompts mid-prefill at once (chunked only); None = no cap
    step_time_target_ms: float | None = None  # time budget per step (chunked only); None = tokens only
    num_chunks: int | None = None  # per-request cap ceil(prompt_len / N) (chunked only); None = no cap
    # vLLM 0.32's (engine/knobs.py): admission reserves the whole prompt; chunk_size floored at a fair share
    # of the budget; most requests admitted to running (None: max_num_seqs); blocks admissions leave free.
    scheduler_reserve_full_isl: bool = default("scheduler_reserve_full_isl")
    long_prefill_token_threshold_adaptive: bool = default("long_prefill_token_threshold_adaptive")
    max_num_active_seqs: int | None = default("max_num_active_seqs")
    watermark: float = default("watermark")
    # vLLM 0.33+'s prefill cadence and 0.34's cache-aware admission (engine/knobs.py)
    prefill_schedule_interval: int = default("prefill_schedule_interval")
    cache_aware_admission_window: int = default("cache_aware_admission_window")
    cache_aware_admission_threshold: float = default("cache_aware_admission_threshold")

    def __post_init__(self) -> None:
        check_policy(self.policy)
        _positive("--max-num-batched-tokens", self.max_num_batched_tokens)
        _positive("--max-num-seqs", self.max_num_seqs)
        _require(
            self.max_num_batched_tokens <= MAX_BUDGET,
            f"--max-num-batched-tokens must be at most {MAX_BUDGET:,}, got {self.max_num_batched_tokens:,}",
        )
        _require(
            self.max_num_seqs <= MAX_SEQS, f"--max-num-seqs must be at most {MAX_SEQS:,}, got {self.max_num_seqs:,}"
        )
        _require(
            self.max_model_len >= 2,
            f"--max-model-len must be at least 2 (a prompt token and an output token), got {self.max_model_len}",
        )
        _require(
            self.max_num_batched_tokens >= min_budget(self.policy, self.max_model_len),
            f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
            f"({self.max_model_len}) for policy '{self.policy}', which never splits a prompt; "
            "use --policy chunked or a larger budget",
        )
        if self.chunk_size is not None:
            _positive("--chunk-size", self.chunk_size)
        _require(
            all(c > 0 for c in self.chunk_schedule),
            f"--chunk-schedule entries must be > 0, got {','.join(map(str, self.chunk_schedule))}",
        )
        if self.tile is not None:
            _require(
                1 <= self.tile <= self.max_num_batched_tokens,
                f"--tile must be from 1 to --max-num-batched-tokens ({self.max_num_batched_tokens}), got {self.tile}",
            )
        if self.max_partial_prefills is not None:
            _positive("--max-partial-prefills", self.max_partial_prefills)
        if self.step_time_target_ms is not None:
            _require(
                math.isfinite(self.step_time_target_ms) and self.step_time_target_ms > 0,
                f"--step-time-target must be a number of ms > 0, got {self.step_time_target_ms}",
            )
        if self.num_chunks is not None:
            _positive("--num-chunks", self.num_chunks)
        if self.max_num_active_seqs is not None:
            _require(
                1 <= self.max_num_active_seqs <= self.max_num_seqs,
                f"--max-num-active-seqs must be from 1 to --max-num-seqs ({self.max_num_seqs}), "
                f"got {self.max_num_active_seqs}",
            )
        _require(0 <= self.watermark < 1, f"--watermark must be in [0, 1), got {self.watermark}")  # nan fails
        _positive("--prefill-schedule-interval", self.prefill_schedule_interval)
        _require(
            self.cache_aware_admission_window >= 0,
            f"--cache-aware-admission-window must be >= 0 (0 = off), got {self.cache_aware_admission_window}",
        )
        _require(
            0 <= self.cache_aware_admission_threshold <= 1,
            f"--cache-aware-admission-threshold must be in [0, 1], got {self.cache_aware_admission_threshold}",
        )

    @property
    def max_active(self) -> int:
        """Most requests admitted to running (vLLM's max_num_active_seqs, default max_num_seqs)."""
        return self.max_num_seqs if self.max_num_active_seqs is None else self.max_num_active_seqs

    def chunk_cap(self, chunk_index: int, prompt_len: int = 0, chunk_size: int | None | str = "config") -> int:
        """The most prompt tokens a request may compute in its `chunk_index`-th chunk (0-based); with
        `num_chunks`, at most ceil(prompt_len / num_chunks). `chunk_size`: the cap the scheduler applies this
        step in place of the configured one (vLLM's long_prefill_token_threshold: see
        engine/scheduler.py)."""
        size = self.chunk_size if chunk_size == "config" else chunk_size
        cap: float = math.inf
        if self.num_chunks is not None and prompt_len:
            cap = -(-prompt_len // self.num_chunks)
        if self.chunk_schedule:
            cap = self.chunk_schedule[min(chunk_index, len(self.chunk_schedule) - 1)]
        if size is not None:
            cap = min(cap, int(size))
        return int(cap) if cap != math.inf else self.max_num_batched_tokens


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = bfloat16 on cuda, float32 on cpu
    attention_backend: str = "auto"  # auto = triton on cuda, torch on cpu
    seed: int = 0
    tensor_parallel_size: int = default("tensor_parallel_size")  # GPUs the model is split over (simulator only)
    # The knobs someone set (EngineConfig.create's keyword arguments that were not None), as opposed to
    # defaults: a server config emitted from this one sets only those (chunkbench/servers/kind.py). Not part of
    # equality.
    chosen: frozenset = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        check_tensor_parallel(self.model, self.tensor_parallel_size)
        check_device(self.device)
        _require(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"--dtype must be auto or one of {', '.join(DTYPES)}, got '{self.dtype}'",
        )
        _require(
            self.attention_backend in ATTENTION_BACKENDS,
            f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got '{self.attention_backend}'",
        )
        _require(
            isinstance(self.seed, int) and 0 <= self.seed < 2**32, f"--seed must be from 0 to 2**32-1, got {self.seed}"
        )
        _require(
            self.scheduler.max_model_len <= self.model.max_model_len,
            f"--max-model-len ({self.scheduler.max_model_len}) must be <= the model's "
            f"max_model_len ({self.model.max_model_len})",
        )

    @classmethod
    def create(cls, model: str | ModelConfig = "tiny", **knobs) -> EngineConfig:
        """Build a config from flat keyword arguments (the knobs of engine/knobs.py), the shape the CLI and
        the Python API use. Unset or None values get defaults that work: the budget defaults to 2048 for
        `chunked` and to at least max_model_len for policies that never split a prompt; the KV cache is
        sized from memory.
        """
        unknown = set(knobs) - set(KNOBS)
        if unknown:
            raise TypeError(f"EngineConfig.create: unknown knob(s) {', '.join(sorted(unknown))}")
        k = {name: knob.default for name, knob in KNOBS.items()} | {n: v for n, v in knobs.items() if v is not None}
        model_config = model if isinstance(model, ModelConfig) else ModelConfig.from_name(model)
        max_model_len = k["max_model_len"]
        if max_model_len is None:
            max_model_len = min(model_config.max_model_len, 8192)
        budget = k["max_num_batched_tokens"]
        if budget is None:
            budget = default_budget(k["policy"], max_model_len)
        schedule = k["chunk_schedule"]
        schedule = parse_chunk_schedule(schedule) if isinstance(schedule, str) else tuple(schedule)
        section = {s: {n: k[n] for n, knob in KNOBS.items() if knob.section == s} for s in ("scheduler", "cache", "")}
        scheduler = section["scheduler"] | dict(
            max_num_batched_tokens=budget, max_model_len=max_model_len, chunk_schedule=schedule
        )
        return cls(
            model=model_config,
            scheduler=SchedulerConfig(**scheduler),
            cache=CacheConfig(**section["cache"]),
            **section[""],
            chosen=frozenset(n for n, v in knobs.items() if v is not None),
        )
