"""Configs users paste into their servers: chunkbench TOML, vLLM YAML and flags, SGLang flags.

Option names are vLLM's (`vllm serve --config`, EngineArgs / SchedulerConfig, release VLLM_VERSION) and
SGLang's (ServerArgs), as declared for each knob in chunkbench/engine/knobs.py. A server config sets only what was
chosen (the searched knobs and the flags the user gave: EngineConfig.chosen) and what the deployment needs (max model
length; tensor parallelism above 1; an fp8 cache), never a chunkbench default the server would not pick (a block size,
prefix caching off, a memory fraction). Chosen knobs with no equivalent there are named in a comment, never silently
dropped. Files are written by tomli-w and PyYAML, so no value (a study name, say) can inject a line.
"""

from __future__ import annotations

import tomli_w
import yaml

from chunkbench.engine import policies
from chunkbench.engine.config import EngineConfig, SchedulerConfig
from chunkbench.engine.knobs import KNOBS, VLLM_VERSION

HF_IDS = {  # presets -> the Hugging Face repositories whose shapes they copy
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
}
TUNED = [
    k
    for k in KNOBS.values()  # what a recommendation sets: the searched knobs and the deployment
    if k.searchable or k.name in ("max_model_len", "tensor_parallel_size", "kv_cache_dtype")
]


DEPLOYMENT = {  # what a server config always carries when it holds: the deployment, not a choice of the search
    "max_model_len": lambda v: True,
    "tensor_parallel_size": lambda v: v > 1,
    "kv_cache_dtype": lambda v: v != "auto",
}


def first_chunk_cap(s: SchedulerConfig) -> int | None:
    """The per-request prefill cap a server with a single chunk size should use: the chunk cap, else the
    first entry of the progressive schedule."""
    return s.chunk_size or (s.chunk_schedule[0] if s.chunk_schedule else None)


def model_id(config: EngineConfig) -> str:
    return HF_IDS.get(config.model.name, config.model.hf_dir or config.model.name)


def comment(lines: list[str]) -> str:
    """Lines as '# ' comments; a newline inside a line starts another comment line, never a setting."""
    return "".join(f"# {part}\n" for line in lines for part in str(line).splitlines() or [""])


def server_knobs(config: EngineConfig):
    """(knob, value) for what a server config sets: the chosen knobs and what the deployment needs."""
    for knob in KNOBS.values():
        value = knob.read(config)
        if knob.name in DEPLOYMENT:
            if DEPLOYMENT[knob.name](value):
                yield knob, value
        elif value is not None and knob.name in config.chosen:
            yield knob, value


def vllm_options(config: EngineConfig) -> tuple[dict, list[str]]:
    """vLLM options (dashed names, as `vllm serve --config` reads them) and notes on what has no vLLM form."""
    s, notes = config.scheduler, []
    policy = policies.get(s.policy)
    options = {"enable-chunked-prefill": policy.chunks_prompts} if "policy" in config.chosen else {}
    options |= {k.vllm: value for k, value in server_knobs(config) if k.vllm and k.name != "chunk_size"}
    if first_chunk_cap(s):
        options["long-prefill-token-threshold"] = first_chunk_cap(s)  # vLLM v1's per-step cap on a long prompt
    if s.chunk_schedule:
        notes.append(
            f"chunk_schedule {','.join(map(str, s.chunk_schedule))} is chunkbench-only (no vLLM "
            f"{VLLM_VERSION} option); long-prefill-token-threshold carries its first entry"
        )
    for k, value in server_knobs(config):
        if not k.vllm and k.name not in ("policy", "chunk_schedule") and value not in ((), False):
            was = f"; earlier vLLM releases had {k.vllm_before}" if k.vllm_before else ""
            notes.append(f"{k.name} {value} is chunkbench-only (no vLLM {VLLM_VERSION} option){was}")
    if not policy.in_vllm:
        notes.append(f"policy '{s.policy}' has no vLLM equivalent; the closest is chunked prefill off")
    return options, notes


def vllm_yaml(config: EngineConfig, header: list[str]) -> str:
    options, notes = vllm_options(config)
    return comment(header + [f"for vLLM {VLLM_VERSION}: vllm serve --config vllm.yaml"] + notes) + yaml.safe_dump(
        {"model": model_id(config), **options}, sort_keys=False
    )


def vllm_option_flags(config: EngineConfig) -> str:
    """The vLLM options as command-line flags, e.g. '--enable-chunked-prefill --max-num-batched-tokens 512'."""
    options, _ = vllm_options(config)
    return " ".join(
        (f"--{key}" if value else f"--no-{key}") if isinstance(value, bool) else f"--{key} {value}"
        for key, value in options.items()
    )


def vllm_flags(config: EngineConfig) -> str:
    return f"vllm serve {model_id(config)} {vllm_option_flags(config)}"


def chunkbench_flags(config: EngineConfig) -> str:
    """The recommendation's knobs as `chunkbench serve`/`run` flags: only those set and not at their default,
    so a knob left unset is left out (never a 0 the command would refuse)."""
    flags = []
    for knob in TUNED:
        value = knob.read(config)
        if value in (None, (), False) or value == knob.default:
            continue
        flag = knob.cli_flags[0].split("/")[0]
        text = ",".join(map(str, value)) if isinstance(value, tuple) else value
        flags.append(flag if value is True else f"{flag} {text}")
    return " ".join(flags)


def sglang_option_flags(config: EngineConfig) -> str:
    """SGLang has one chunk size and a prefill-token budget; mixed chunks are Sarathi-style stall-free. Flag
    names as in SGLang's ServerArgs (python/sglang/srt/server_args.py)."""
    s = config.scheduler
    chunks_prompts = policies.get(s.policy).chunks_prompts
    chunk = first_chunk_cap(s) or s.max_num_batched_tokens
    flags = []
    if {"policy", "chunk_size", "chunk_schedule", "max_num_batched_tokens"} & config.chosen:
        flags.append(f"--chunked-prefill-size {chunk if chunks_prompts else -1}")
    flags += [f"{k.sglang} {value}" for k, value in server_knobs(config) if k.sglang]
    if config.cache.kv_cache_dtype == "fp8":
        flags.append("--kv-cache-dtype fp8_e4m3")  # SGLang names the fp8 format; vLLM's fp8 is e4m3 too
    if chunks_prompts and "policy" in config.chosen:
        flags.append("--enable-mixed-chunk")
    if "enable_prefix_caching" in config.chosen and not config.cache.enable_prefix_caching:
        flags.append("--disable-radix-cache")
    return " ".join(flags)


def sglang_flags(config: EngineConfig) -> str:
    return f"python -m sglang.launch_server --model-path {model_id(config)} {sglang_option_flags(config)}".rstrip()


def chunkbench_toml(config: EngineConfig, header: list[str]) -> str:
    engine = {"model": config.model.name}
    for knob in TUNED:
        value = knob.read(config)
        if value not in (None, ()):
            engine[knob.name] = list(value) if isinstance(value, tuple) else value
    return comment(header) + tomli_w.dumps({"engine": engine})


def knobs_text(knobs: dict) -> str:
    """'chunked, budget 2048, seqs 256, chunk 512' from a trial's knobs (engine keyword arguments)."""
    parts = [str(knobs.get("policy", "chunked"))]
    for knob in KNOBS.values():
        value = knobs.get(knob.name)
        if knob.label and value not in (None, (), [], 0, False):
            parts.append(
                f"{knob.label} {','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
                if value is not True
                else knob.label
            )
    return ", ".join(parts)
