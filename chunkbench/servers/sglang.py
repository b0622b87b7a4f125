"""SGLang: `python -m sglang.launch_server` with ServerArgs flags (SGLang 0.5.23).

SGLang has one chunk size and a prefill-token budget; its mixed chunks are Sarathi-style stall-free. It has no
per-step time target, progressive schedule, tile or partial-prefill cap, and none of vLLM's scheduler knobs.
"""

from __future__ import annotations

from chunkbench.engine import policies
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import Knob
from chunkbench.servers.kind import ServerKind, first_chunk_cap, model_id, server_knobs

# Knobs SGLang expresses beyond those with a one-to-one flag (Knob.sglang): the chunk cap as
# --chunked-prefill-size, prefix caching as --disable-radix-cache, an fp8 cache as --kv-cache-dtype.
OWN_FORM = ("policy", "chunk_size", "enable_prefix_caching", "kv_cache_dtype", "max_model_len")


class SglangKind(ServerKind):
    def expresses(self, knob: Knob, version: str = "") -> bool:
        return bool(knob.sglang) or knob.name in OWN_FORM

    def option_flags(self, config: EngineConfig, version: str = "") -> str:
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

    def command(self, config: EngineConfig, version: str = "") -> str:
        flags = self.option_flags(config, version)
        return f"python -m sglang.launch_server --model-path {model_id(config)} {flags}".rstrip()


SGLANG = SglangKind(
    name="sglang",
    title="SGLang",
    pattern=r"sglang\.launch_server|(^|[\s/])sglang\s+serve\b",
    outputs=("sglang.txt",),
    versions=("0.5.23",),
    # SGLang's overlap scheduler runs step n+1's CPU scheduling while the GPU runs step n ("zero-overhead
    # batch scheduler"); what remains is the CUDA-graph replay and sampling hand-off: a few hundred us.
    overhead_s=0.4e-3,
)
