"""Configs users paste into their servers: chunkbench TOML, vLLM YAML and flags, SGLang flags.

Option names are vLLM's (`vllm serve --config`, EngineArgs / SchedulerConfig) and SGLang's (ServerArgs).
Knobs with no equivalent there are named in a comment, never silently dropped.
"""

from __future__ import annotations

from chunkbench.engine.config import EngineConfig

HF_IDS = {  # presets -> the Hugging Face repositories whose shapes they copy
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct", "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct", "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
}


def first_chunk_cap(s) -> int | None:
    """The per-request prefill cap a server with a single chunk size should use: the chunk cap, else the
    first entry of the progressive schedule."""
    return s.chunk_size or (s.chunk_schedule[0] if s.chunk_schedule else None)


def vllm_options(config: EngineConfig) -> tuple[dict, list[str]]:
    """vLLM options (dashed names, as `vllm serve --config` reads them) and notes on what has no vLLM form."""
    s, notes = config.scheduler, []
    options = {"max-num-batched-tokens": s.max_num_batched_tokens, "max-num-seqs": s.max_num_seqs,
               "max-model-len": s.max_model_len, "enable-chunked-prefill": s.policy == "chunked",
               "block-size": config.cache.block_size,
               "gpu-memory-utilization": config.cache.gpu_memory_utilization,
               "enable-prefix-caching": config.cache.enable_prefix_caching}
    cap = first_chunk_cap(s)
    if cap:
        options["long-prefill-token-threshold"] = cap  # vLLM v1 caps a long prompt's chunk per step at this
    if s.max_partial_prefills:
        options["max-num-partial-prefills"] = s.max_partial_prefills
    if s.chunk_schedule:
        notes.append(f"chunk_schedule {','.join(map(str, s.chunk_schedule))} has no vLLM option; "
                     f"long-prefill-token-threshold carries its first entry")
    if s.tile:
        notes.append(f"tile {s.tile} has no vLLM option")
    if s.policy in ("static", "orca"):
        notes.append(f"policy '{s.policy}' has no vLLM equivalent; the closest is chunked prefill off")
    return options, notes


def vllm_yaml(config: EngineConfig, header: list[str]) -> str:
    options, notes = vllm_options(config)
    lines = [f"# {h}" for h in header + notes]
    lines.append(f"model: {HF_IDS.get(config.model.name, config.model.hf_dir or config.model.name)}")
    for key, value in options.items():
        lines.append(f"{key}: {str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"


def vllm_flags(config: EngineConfig) -> str:
    options, _ = vllm_options(config)
    flags = []
    for key, value in options.items():
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        else:
            flags.append(f"--{key} {value}")
    return f"vllm serve {HF_IDS.get(config.model.name, config.model.name)} " + " ".join(flags)


def sglang_flags(config: EngineConfig) -> str:
    """SGLang has one chunk size and a prefill-token budget; mixed chunks are Sarathi-style stall-free."""
    s = config.scheduler
    chunk = first_chunk_cap(s) or s.max_num_batched_tokens
    flags = [f"--model-path {HF_IDS.get(config.model.name, config.model.name)}",
             f"--chunked-prefill-size {chunk if s.policy == 'chunked' else -1}",
             f"--max-prefill-tokens {s.max_num_batched_tokens}", f"--max-running-requests {s.max_num_seqs}",
             f"--context-length {s.max_model_len}", f"--mem-fraction-static {config.cache.gpu_memory_utilization}"]
    if s.policy == "chunked":
        flags.append("--enable-mixed-chunk")
    if not config.cache.enable_prefix_caching:
        flags.append("--disable-radix-cache")
    return "python -m sglang.launch_server " + " ".join(flags)


def chunkbench_toml(config: EngineConfig, header: list[str]) -> str:
    s = config.scheduler
    lines = [f"# {h}" for h in header] + ["[engine]", f'model = "{config.model.name}"', f'policy = "{s.policy}"',
                                          f"max_num_batched_tokens = {s.max_num_batched_tokens}",
                                          f"max_num_seqs = {s.max_num_seqs}", f"max_model_len = {s.max_model_len}"]
    if s.chunk_size:
        lines.append(f"chunk_size = {s.chunk_size}")
    if s.chunk_schedule:
        lines.append(f"chunk_schedule = [{', '.join(map(str, s.chunk_schedule))}]")
    if s.tile:
        lines.append(f"tile = {s.tile}")
    if s.max_partial_prefills:
        lines.append(f"max_partial_prefills = {s.max_partial_prefills}")
    lines.append(f"enable_prefix_caching = {str(config.cache.enable_prefix_caching).lower()}")
    return "\n".join(lines) + "\n"
