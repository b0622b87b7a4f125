"""Executors turn a SchedulerOutput into a StepResult. `ModelExecutor` runs the real model."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch
from chunkbench.kernels import cpu_decode

from chunkbench.errors import ConfigError

from .activation import step_activation_bytes
from .attention import AttentionMetadata, attention_context
from .block_manager import cdiv
from .config import EngineConfig
from .model import build_model
from .outputs import ScheduledChunk, SchedulerOutput, StepResult
from .sharding import single_device_limitation


@contextlib.contextmanager
def one_torch_thread(enabled: bool = True):
    """torch on one thread while inside (when `enabled`), as steps timed in this thread's CPU time need
    (engine.CpuClock, `profile --cpu-time`): work on torch's helper threads would be missed. Restores the
    count after."""
    threads = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device is available here")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name == "triton" and device.type == "cpu":
        if "triton" in sys.modules and not os.environ.get("TRITON_INTERPRET"):
            raise ConfigError("--attention-backend triton on the CPU needs TRITON_INTERPRET=1 set before start-up")
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before the kernels are imported
    return name


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a KV cache: the GPU's free memory, or on the host the least of its MemAvailable and the
    room under this container's memory limit (a container sees the whole host's MemAvailable; allocating past
    its limit gets the process killed). None: not known here."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    known = [b for b in (host_available_bytes(), cgroup_free_bytes()) if b is not None]
    return min(known) if known else None


def host_available_bytes() -> int | None:
    """The kernel's MemAvailable (None: no /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


# Per cgroup version: (its mount under /sys/fs/cgroup, limit, usage, statistics file, its reclaimable page cache)
CGROUP_FILES = {
    "v2": ("", "memory.max", "memory.current", "memory.stat", "inactive_file"),
    "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file"),
}
# v1 writes "no limit" as the largest signed 64-bit number rounded down to a page, which depends on the page size
# (...771712 with 4 KiB pages, ...710272 with 64 KiB): anything this large is no limit
UNLIMITED = 2**60


def cgroup_free_bytes(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> int | None:
    """Room left under the tightest memory limit on this process's cgroup and its ancestors (a container's own,
    a systemd MemoryMax=, a batch job's), usage counted less its inactive page cache, which the kernel reclaims
    before it kills (as `docker stats` counts it); None when none has a limit or there is no cgroup to read."""
    try:
        with open(membership) as f:  # "0::/path" (v2) or "4:memory:/path" (v1's memory controller)
            paths = [
                ("v2" if ids == "0" and not names else "v1", path.strip())
                for ids, names, path in (line.split(":", 2) for line in f if line.count(":") >= 2)
                if (ids == "0" and not names) or "memory" in names.split(",")
            ]
    except OSError:
        paths = []
    rooms = []
    for version, path in paths or [("v2", "/"), ("v1", "/")]:
        mount, limit_file, usage_file, stat_file, cache_key = CGROUP_FILES[version]
        base = os.path.normpath(os.path.join(root, mount))
        folder = os.path.normpath(os.path.join(base, path.lstrip("/")))
        while os.path.commonpath([folder, base]) == base:  # the process's cgroup, then each ancestor to the mount
            room = _cgroup_room(folder, limit_file, usage_file, stat_file, cache_key)
            if room is not None:
                rooms.append(room)
            if folder == base:
                break
            folder = os.path.dirname(folder)
    return min(rooms) if rooms else None


def _cgroup_room(folder: str, limit_file: str, usage_file: str, stat_file: str, cache_key: str) -> int | None:
    try:
        with open(os.path.join(folder, limit_file)) as f:
            limit = f.read().strip()
        with open(os.path.join(folder, usage_file)) as f:
            usage = int(f.read())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= UNLIMITED:  # v2 writes "max"
        return None
    cache = 0
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(folder, stat_file)) as f:
            cache = next((int(v) for k, v in (line.split() for line in f if line.strip()) if k == cache_key), 0)
    return max(0, int(limit) - (usage - cache))


def kv_cache_blocks(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> int:
    """KV blocks to allocate: the configured count, else what memory allows (see CacheConfig)."""
    cache, model, sched = config.cache, config.model, config.scheduler
    per_block = cache.kv_bytes_per_block(model, dtype.itemsize)
    if cache.num_blocks is not None:
        free = available_bytes(device)
        if free is not None and cache.num_blocks * per_block > free:
            needed = cache.num_blocks * per_block / 2**30
            raise ConfigError(
                f"--num-blocks {cache.num_blocks:,} needs {needed:,.1f} GiB of KV cache; "
                f"{free / 2**30:,.1f} GiB is free on {device.type}: lower --num-blocks"
            )
        return cache.num_blocks
    wanted = sched.max_num_seqs * cdiv(sched.max_model_len, cache.block_size)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # The weights are already resident; leave 10% of what remains for activations.
        budget = min(free, total * cache.gpu_memory_utilization - torch.cuda.memory_allocated(device)) * 0.9
    else:  # at most cpu_kv_cache_gib, and as on CUDA 90% of what is free (a container's limit counted)
        budget, free = cache.cpu_kv_cache_gib * 2**30, available_bytes(device)
        if free is not None:
            budget = min(budget, 0.9 * free)
    blocks = min(wanted, int(budget // per_block))
    if blocks < 1:
        knob = "--gpu-memory-utilization" if device.type == "cuda" else "--cpu-kv-cache-gib"
        raise ConfigError(
            f"not enough memory for a single KV block ({per_block / 2**20:,.2f} MiB); raise {knob}, "
            "free memory or use a smaller model"
        )
    return blocks


class ModelExecutor:
    """The model on a device, its paged KV cache, and greedy/temperature/top-p sampling."""

    def __init__(self, config: EngineConfig) -> None:
        limitation = single_device_limitation(config)
        if limitation:
            raise ConfigError(limitation)
        self.model_config = config.model
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.backend = resolve_backend(config.attention_backend, self.device)
        self.block_size = config.cache.block_size
        self.model = build_model(config.model, self.dtype, self.device, config.seed)
        self.num_blocks = kv_cache_blocks(config, self.device, self.dtype)
        shape = (self.num_blocks, self.block_size, config.model.num_kv_heads, config.model.head_dim)
        for layer in self.model.model.layers:  # zeros: padded slots are read under a mask, and 0 * NaN = NaN
            layer.self_attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.self_attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.keep_logits = False  # tests: keep each sampled row's logits in last_logits
        # What a step's seconds are: wall time, or time.thread_time when steps are timed in CPU time
        # (LLMEngine sets the clock's timer; the profile's --cpu-time): other processes cannot stretch them.
        self.timer = time.perf_counter
        self.last_logits: dict[str, torch.Tensor] = {}

    def idle(self, seconds: float) -> None:
        """Real time passes by itself: nothing to model."""

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _metadata(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu, lens_k = [0], []
        for c in chunks:
            input_ids += c.token_ids
            pos = range(c.start_pos, c.context_len)
            positions += pos
            slots += [c.block_table[p // bs] * bs + p % bs for p in pos]
            cu.append(cu[-1] + c.num_tokens)
            lens_k.append(c.context_len)
        width = max(len(c.block_table) for c in chunks)
        table = [c.block_table + [0] * (width - len(c.block_table)) for c in chunks]

        def tensor(values, dtype=torch.int32):
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        metadata = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            cu_seqlens_q=tensor(cu),
            seqused_k=tensor(lens_k),
            block_table=tensor(table),
            max_seqlen_q=max(c.num_tokens for c in chunks),
            max_seqlen_k=max(lens_k),
            backend=self.backend,
        )
        return tensor(input_ids, torch.int64), tensor(positions, torch.int64), metadata

    def _sampled(
        self, chunks: list[ScheduledChunk], metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, AttentionMetadata | None]:
        """The rows of the tokens the step samples (each sampling chunk's last), and their attention metadata
        as one query per request (the model's last layer attends those alone)."""
        which = torch.tensor([i for i, c in enumerate(chunks) if c.sample], dtype=torch.long, device=self.device)
        rows = metadata.cu_seqlens_q[1:].long()[which] - 1
        if not len(which):
            return rows, None
        return rows, AttentionMetadata(
            slot_mapping=metadata.slot_mapping[rows],
            cu_seqlens_q=torch.arange(len(which) + 1, dtype=torch.int32, device=self.device),
            seqused_k=metadata.seqused_k[which],
            block_table=metadata.block_table[which],
            max_seqlen_q=1,
            max_seqlen_k=max(c.context_len for c in chunks if c.sample),
            backend=self.backend,
        )

    def _activation_start(self) -> int:
        if self.device.type != "cuda":
            return 0
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def _activation_bytes(self, chunks: list[ScheduledChunk], before: int) -> int:
        """CUDA: the allocator's peak during the step above what was allocated before it (measured; untested
        here: no CUDA in CI). Elsewhere the formula of engine/activation.py for this attention path."""
        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) - before)
        prefills = [(c.num_tokens, c.start_pos) for c in chunks if not c.is_decode]
        decodes = [c.context_len for c in chunks if c.is_decode]
        torch_path = self.backend == "torch"
        in_place = torch_path and cpu_decode.applies(self.device, self.dtype)  # the C kernel reads the pages
        return step_activation_bytes(
            self.model_config,
            prefills,
            decodes,
            sum(c.sample for c in chunks),
            self.dtype.itemsize,
            attention="reference" if torch_path else "flash",
            decode_attention="flash" if in_place else None,
        )

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> StepResult:
        self._synchronize()
        before = self._activation_start()
        start = self.timer()
        chunks = output.chunks
        input_ids, positions, metadata = self._metadata(chunks)
        sampling_chunks = [c for c in chunks if c.sample]
        rows = None  # every token is sampled (a decode step): the last layer computes them all anyway
        if len(sampling_chunks) < len(input_ids):
            rows, metadata.sampled = self._sampled(chunks, metadata)
        with attention_context(metadata):
            hidden = self.model(input_ids, positions, rows)
        sampled: dict[str, int] = {}
        if sampling_chunks:
            logits = self.model.compute_logits(hidden)
            tokens = sample(logits, sampling_chunks, self.model_config.eos_token_id)
            sampled = {c.request_id: t for c, t in zip(sampling_chunks, tokens)}
            if self.keep_logits:
                self.last_logits = {c.request_id: logits[i].cpu() for i, c in enumerate(sampling_chunks)}
        self._synchronize()
        seconds = self.timer() - start
        return StepResult(sampled=sampled, seconds=seconds, activation_bytes=self._activation_bytes(chunks, before))


def sample(logits: torch.Tensor, chunks: list[ScheduledChunk], eos_token_id: int | None = None) -> list[int]:
    """Greedy where temperature is 0; else temperature, top-k and top-p with a per-token seed, so a request's
    samples do not depend on what else shares its batch. Before min_tokens, EOS and the stop ids are masked."""
    early = [i for i, c in enumerate(chunks) if c.sample_index < c.sampling.min_tokens]
    if early:
        logits = logits.clone()
        for i in early:
            masked = [t for t in chunks[i].sampling.masked_token_ids(eos_token_id) if t < logits.shape[-1]]
            logits[i, masked] = float("-inf")
    # greedy: NumPy's argmax on the CPU (the same first-index rule, NaN included), several times faster than
    # torch's on a decode step's logits (docs/measurements/engine-speed.md, round five)
    cpu = logits.device.type == "cpu"
    tokens = (logits.numpy().argmax(-1) if cpu else logits.argmax(dim=-1)).tolist()
    for i, chunk in enumerate(chunks):
        params = chunk.sampling
        if params.temperature == 0:
            continue
        row = logits[i]
        if 0 < params.top_k < row.shape[-1]:
            row = row.masked_fill(row < row.topk(params.top_k).values[-1], float("-inf"))
        probs = torch.softmax(row / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs > params.top_p  # keep the smallest nucleus
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs.masked_fill(outside, 0.0))
        generator = torch.Generator(device=logits.device)
        generator.manual_seed((chunk.sample_seed * 1_000_003 + chunk.sample_index) % 2**63)
        tokens[i] = int(torch.multinomial(probs, 1, generator=generator))
    return tokens
