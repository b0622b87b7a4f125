"""Record vLLM 0.34's scheduling decisions on given request streams, driving its Scheduler class alone: the
second oracle of tests/vllm/test_scheduler_oracle.py (the first, tests/vllm/vllm_oracle.py, runs vLLM 0.32's
whole CPU engine).

vLLM 0.34 has no CPU build, so no engine runs here: under its own venv (scripts/vllm034_env.sh installs the CUDA
wheel without dependencies beside a CPU torch; `.venv-vllm034/bin/python tests/vllm/vllm_scheduler_oracle.py
IN.json OUT.json`) this builds a VllmConfig for the tiny model on the CPU device, a KV cache of one
full-attention group with the stream's blocks (plus vLLM's null block), and `vllm.v1.core.sched.scheduler.
Scheduler` itself. Each step is schedule(), then a model runner output made up here (one sampled token for
each request whose scheduled tokens reach its end, none for a prompt chunk that stops short), then
update_from_output(): what the engine core does between them is the model's forward pass, which decides
nothing the scheduler reads (with ignore_eos, a request stops on max_tokens whatever the tokens are). Every
request is added before the first step, as in the 0.32 oracle.

IN.json and OUT.json as tests/vllm/vllm_oracle.py's: {"model", "streams": [{"name", "engine": {EngineArgs
keywords}, "requests": [{"id", "prompt", "max_tokens"}]}]} in, {"vllm_version", "streams": {name:
{"scheduler", "steps", "preemptions", "cached", "seconds"}}} out. `cached` is each request's prefix-cache hit
at its first admission (its prefill stats' num_cached_tokens, what vLLM reports as cached prompt tokens)."""

from __future__ import annotations

import sys
import time

SAMPLED = 7  # the token every sampling step returns: any id works (see above)
MODEL_KEYS = {"max_model_len"}
CACHE_KEYS = {"block_size", "enable_prefix_caching"}
BLOCKS_KEY = "num_gpu_blocks_override"  # the KV cache's blocks, vLLM's null block included


def make_scheduler(model: str, engine: dict):
    """vLLM's Scheduler for one stream's EngineArgs keywords, and the block hasher its requests need."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched_keys = set(engine) - MODEL_KEYS - CACHE_KEYS - {BLOCKS_KEY}
    max_len = engine["max_model_len"]
    model_config = ModelConfig(model=model, dtype="float32", max_model_len=max_len, enforce_eager=True)
    scheduler_config = SchedulerConfig(
        max_model_len=max_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=False,  # the synchronous Scheduler, as vLLM's CPU build runs (the 0.32 oracle)
        **{k: engine[k] for k in sched_keys},
    )
    cache_config = CacheConfig(**{k: engine[k] for k in CACHE_KEYS})
    config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        device_config=DeviceConfig(device="cpu"),
    )
    blocks, block_size = engine[BLOCKS_KEY], engine["block_size"]
    config.cache_config.num_gpu_blocks = blocks  # what the engine core sets after profiling
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    scheduler = Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        log_stats=False,
    )
    hasher = None
    if engine["enable_prefix_caching"]:  # as the engine core sets it up
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(block_size, hash_fn)
    return scheduler, hasher


def record(model: str, stream: dict) -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    start = time.perf_counter()
    scheduler, hasher = make_scheduler(model, stream["engine"])
    preemptions = [0]
    preempt = scheduler._preempt_request

    def counting_preempt(*a, **k):
        preemptions[0] += 1
        return preempt(*a, **k)

    scheduler._preempt_request = counting_preempt
    for i, r in enumerate(stream["requests"]):
        params = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0)
        scheduler.add_request(Request(r["id"], r["prompt"], params, None, arrival_time=float(i), block_hasher=hasher))
    steps: list[list[list]] = []
    cached: dict[str, int] = {}
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        tokens = out.num_scheduled_tokens
        if not tokens:
            raise RuntimeError(f"{stream['name']}: a step scheduled nothing with requests unfinished")
        steps.append([[rid, n] for rid, n in tokens.items()])
        ids = list(tokens)
        # schedule() has moved each request's computed count on: one that reached its end samples a token
        sampled = [
            [SAMPLED] if scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens else []
            for rid in ids
        ]
        results = scheduler.update_from_output(out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled))
        for outputs in results.values():
            for o in outputs.outputs:
                if o.prefill_stats is not None and o.request_id not in cached:
                    cached[o.request_id] = o.prefill_stats.num_cached_tokens
    return dict(
        scheduler=type(scheduler).__module__ + "." + type(scheduler).__qualname__,
        steps=steps,
        preemptions=preemptions[0],
        cached=cached,
        seconds=time.perf_counter() - start,
    )


if __name__ == "__main__":
    from vllm_oracle import main  # beside this file: the same IN.json -> OUT.json loop

    main(*sys.argv[1:3], record=record)
