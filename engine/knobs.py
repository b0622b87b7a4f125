"""Every engine knob declared once: name, type, default, unit and help, where it lives in EngineConfig, its
vLLM and SGLang option, its short name in `compare` policy specs, and whether the tuner may search it.

Everything else is derived from this table: the config dataclasses' defaults, `EngineConfig.create`, the
CLI options, search-space validation, the emitted vLLM/SGLang/chunkbench configs, the tune report's knob
text and the `--launch` placeholders. To add a knob, add a row here and read it where the engine uses it.
Plain data: no torch, no typer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    name: str  # EngineConfig.create keyword and search-space key
    type: type  # int, float, str, bool or tuple (a list of ints)
    default: Any  # None: computed (see help) or unset
    help: str  # with the unit
    section: str = ""  # where the value lives in EngineConfig: "scheduler", "cache" or "" (top level)
    flags: tuple[str, ...] = ()  # CLI flags; default: --name-with-dashes
    short: str | None = None  # key in `compare` policy specs, e.g. chunked:budget=512
    vllm: str | None = None  # vLLM option (`vllm serve --config` YAML key); None: no direct equivalent
    sglang: str | None = None  # SGLang server flag, when it maps one to one
    searchable: bool = False  # may appear in a tuner search space
    chunked_only: bool = False  # only the chunked policy reads it
    label: str | None = None  # short text in reports, e.g. "budget 2048"

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    def read(self, config) -> Any:
        """This knob's value in an EngineConfig."""
        return getattr(getattr(config, self.section) if self.section else config, self.name)


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("policy", str, "chunked", "Batching policy: static, continuous, orca or chunked.", "scheduler",
         searchable=True),
    Knob("max_num_batched_tokens", int, None, "Token budget per step (tokens). Default: 2048 for chunked, "
         "max(2048, max-model-len) otherwise.", "scheduler", flags=("--max-num-batched-tokens", "--budget"),
         short="budget", vllm="max-num-batched-tokens", sglang="--max-prefill-tokens", searchable=True,
         label="budget"),
    Knob("max_num_seqs", int, 256, "Seat limit: most requests running at once (requests).", "scheduler",
         short="seqs", vllm="max-num-seqs", sglang="--max-running-requests", searchable=True, label="seqs"),
    Knob("max_model_len", int, None, "Longest request, prompt plus output (tokens). Default: the model's, at "
         "most 8192.", "scheduler", vllm="max-model-len", sglang="--context-length"),
    Knob("chunk_size", int, None, "chunked: most prompt tokens one request computes per step (tokens). "
         "Default: no cap.", "scheduler", short="chunk", searchable=True, chunked_only=True, label="chunk"),
    Knob("chunk_schedule", tuple, (), "chunked: progressive caps, the i-th chunk of a prompt <= the i-th entry, "
         "the last repeats (tokens, comma-separated, e.g. 2048,1024,512).", "scheduler", short="schedule",
         searchable=True, chunked_only=True, label="schedule"),
    Knob("tile", int, None, "chunked: trim cut prompt chunks so a step's token count is a multiple of this "
         "(tokens).", "scheduler", short="tile", searchable=True, chunked_only=True, label="tile"),
    Knob("max_partial_prefills", int, None, "chunked: most prompts mid-prefill at once (requests). Default: "
         "no cap.", "scheduler", short="partial", vllm="max-num-partial-prefills", searchable=True,
         chunked_only=True, label="partial"),
    Knob("step_time_target_ms", float, None, "chunked: time budget per step (ms). After the decodes, prompt "
         "chunks get the most tokens whose predicted step time stays within it (the simulator's cost model; on "
         "the real engine a profile or a quick calibration, corrected online by measured steps); "
         "--max-num-batched-tokens stays a hard cap and the first chunk gets at least 16 tokens so prefills "
         "progress. Default: none on CUDA (vLLM's token budget); on the CPU, when no budget is given, a "
         "multiple of the decode step.", "scheduler", flags=("--step-time-target",), short="target",
         searchable=True, chunked_only=True, label="target ms"),
    Knob("num_chunks", int, None, "chunked: split each prompt into this many chunks: a request's chunk cap is "
         "ceil(prompt_len / N), within the other caps (chunks). Default: no such cap.", "scheduler",
         short="nchunks", searchable=True, chunked_only=True, label="chunks"),
    Knob("block_size", int, 16, "KV cache block size (tokens).", "cache", vllm="block-size"),
    Knob("num_blocks", int, None, "KV cache size (blocks). Default: from memory (--gpu-memory-utilization on "
         "CUDA, --cpu-kv-cache-gib on CPU).", "cache"),
    Knob("gpu_memory_utilization", float, 0.9, "Fraction of GPU memory the engine may use, weights and KV "
         "cache (0-1].", "cache", vllm="gpu-memory-utilization", sglang="--mem-fraction-static"),
    Knob("cpu_kv_cache_gib", float, 1.0, "CPU, without --num-blocks: most memory the KV cache takes (GiB); "
         "never more than 90% of the free memory (a container's limit counted).", "cache"),
    Knob("kv_cache_dtype", str, "auto", "KV cache element type: auto (the model's dtype) or fp8 (1 byte: twice "
         "the cache, half the attention reads; simulator only).", "cache", vllm="kv-cache-dtype"),
    Knob("tensor_parallel_size", int, 1, "GPUs one model instance is split over (tensor parallelism, GPUs); "
         "simulator only: the real engine runs on one device.", short="tp", vllm="tensor-parallel-size",
         sglang="--tp", label="TP"),
    Knob("enable_prefix_caching", bool, False, "Reuse KV blocks of shared prompt prefixes.", "cache",
         flags=("--enable-prefix-caching/--no-enable-prefix-caching",), vllm="enable-prefix-caching",
         searchable=True, label="prefix caching"),
    Knob("device", str, "auto", "auto (cuda when available), cpu, cuda or cuda:N."),
    Knob("dtype", str, "auto", "auto (bfloat16 on cuda, float32 on cpu), float32, float16, bfloat16 or float64."),
    Knob("attention_backend", str, "auto", "auto (triton on cuda, torch on cpu), triton (on CPU: the Triton "
         "interpreter, slow) or torch."),
    Knob("seed", int, 0, "Seed for dummy weights, random prompts and sampling."),
]}

SEARCHABLE = tuple(k.name for k in KNOBS.values() if k.searchable)
CHUNKED_ONLY = tuple(k.name for k in KNOBS.values() if k.chunked_only)


def default(name: str) -> Any:
    return KNOBS[name].default
