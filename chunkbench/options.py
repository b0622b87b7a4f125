"""Command-line options shared by several commands, as Typer `Annotated` aliases. Commands pass them to
`EngineConfig.create`. Units are in every help text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from chunkbench.workload import LENGTH_HELP

Model = Annotated[str, typer.Option(
    "--model", "-m", help="Model preset (tiny, small, llama-3.2-1b, llama-3-8b, llama-3-70b, mistral-7b, "
    "qwen2.5-7b) or a local Hugging Face directory with config.json and *.safetensors.")]
Policy = Annotated[str, typer.Option(help="Batching policy: static, continuous, orca or chunked.")]
Budget = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", "--budget",
    help="Token budget per step (tokens). Default: 2048 for chunked, max(2048, max-model-len) otherwise.")]
MaxNumSeqs = Annotated[int, typer.Option(help="Seat limit: most requests running at once (requests).")]
MaxModelLen = Annotated[Optional[int], typer.Option(
    help="Longest request, prompt plus output (tokens). Default: the model's, at most 8192.")]
ChunkSize = Annotated[Optional[int], typer.Option(
    help="chunked: most prompt tokens one request computes per step (tokens). Default: no cap.")]
ChunkSchedule = Annotated[Optional[str], typer.Option(
    help="chunked: progressive caps, the i-th chunk of a prompt <= the i-th entry, the last repeats "
    "(tokens, comma-separated, e.g. 2048,1024,512).")]
Tile = Annotated[Optional[int], typer.Option(
    help="chunked: trim cut prompt chunks so a step's token count is a multiple of this (tokens).")]
MaxPartialPrefills = Annotated[Optional[int], typer.Option(
    help="chunked: most prompts mid-prefill at once (requests). Default: no cap.")]
BlockSize = Annotated[int, typer.Option(help="KV cache block size (tokens).")]
NumBlocks = Annotated[Optional[int], typer.Option(
    help="KV cache size (blocks). Default: from memory (--gpu-memory-utilization on CUDA, 1 GiB on CPU).")]
GpuMemoryUtilization = Annotated[float, typer.Option(
    help="Fraction of GPU memory the engine may use, weights and KV cache (0-1].")]
PrefixCaching = Annotated[bool, typer.Option(
    "--enable-prefix-caching/--no-enable-prefix-caching", help="Reuse KV blocks of shared prompt prefixes.")]
Device = Annotated[str, typer.Option(help="auto (cuda when available), cpu, cuda or cuda:N.")]
Dtype = Annotated[str, typer.Option(
    help="auto (bfloat16 on cuda, float32 on cpu), float32, float16, bfloat16 or float64.")]
AttentionBackend = Annotated[str, typer.Option(
    help="auto (triton on cuda, torch on cpu), triton (on CPU: the Triton interpreter, slow) or torch.")]
Seed = Annotated[int, typer.Option(help="Seed for dummy weights, random prompts and sampling.")]


# ---- workload and output options ----
Workload = Annotated[str, typer.Option(
    help="Named workload (chat, long-doc, rag-mix, azure-conv, azure-code, arxiv-summarization), 'synthetic' "
    "(see --prompt-len/--output-len), or a file: .csv/.jsonl with prompt_len,output_len[,arrival_time] token "
    "counts, .json in ShareGPT format.")]
NumRequests = Annotated[Optional[int], typer.Option(help="Requests to send (requests); traces: the first N.")]
Duration = Annotated[Optional[float], typer.Option(help="Keep only requests arriving in the first this many "
                                                   "seconds (s).")]
Rate = Annotated[float, typer.Option(help="Mean arrival rate (requests/s); traces with timestamps ignore it.")]
Arrival = Annotated[Optional[str], typer.Option(
    help="Arrival process: poisson, gamma (see --burstiness), constant, all-at-once, or trace (the file's "
    "timestamps). Default: trace timestamps when the workload has them, else poisson.")]
Burstiness = Annotated[float, typer.Option(help="gamma arrivals: shape factor; < 1 burstier, 1 = Poisson "
                                           "(as vLLM's --burstiness).")]
TimeScale = Annotated[float, typer.Option(help="Multiply trace timestamps by this (< 1 replays faster).")]
PromptLen = Annotated[str, typer.Option(help="synthetic prompts: " + LENGTH_HELP)]
OutputLen = Annotated[str, typer.Option(help="synthetic outputs: same forms as --prompt-len (tokens).")]
Tokenizer = Annotated[Optional[str], typer.Option(
    help="Local Hugging Face tokenizer directory to count ShareGPT tokens; default: 4 characters per token.")]
Goodput = Annotated[Optional[str], typer.Option(
    help="SLOs for goodput, in ms, space-separated: 'ttft:300 tpot:50 e2el:2000' (as vLLM's --goodput).")]
WarmupSteps = Annotated[int, typer.Option(help="Unmeasured engine steps before the run (steps).")]
Out = Annotated[Optional[Path], typer.Option(help="Directory for the outputs (created).")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Also write the summary JSON to this file.")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bar.")]

# ---- where steps run ----
BackendOpt = Annotated[str, typer.Option(
    "--backend", help="engine (the real model on this machine), sim (the simulator: the real scheduler, step "
    "times from --gpu's roofline or --cost-model), launch (tune only: a server started per trial, see "
    "--launch), or auto (engine, except a model larger than 'small' without a CUDA device: sim on h100-sxm).")]
Gpu = Annotated[Optional[str], typer.Option(
    help="sim: GPU for the roofline cost model: a100-40g, a100-80g, h100-sxm, h100-pcie, h200, l40s, l4, a10g, "
    "rtx-4090, mi300x.")]
CostModelPath = Annotated[Optional[str], typer.Option(
    "--cost-model", help="sim: a profile written by `chunkbench profile` (JSON) instead of a roofline.")]
PrefixLen = Annotated[int, typer.Option(help="Shared prefix put before every prompt (tokens), as vLLM's random "
                                        "dataset with --random-prefix-len.")]
NumPrefixes = Annotated[int, typer.Option(help="Distinct shared prefixes, assigned round-robin (prefixes).")]


# ---- option groups, declared once and added to each command that takes them ----

ENGINE_OPTIONS = {  # EngineConfig.create keyword -> (annotated type, default)
    "policy": (Policy, "chunked"), "max_num_batched_tokens": (Budget, None), "max_num_seqs": (MaxNumSeqs, 256),
    "max_model_len": (MaxModelLen, None), "chunk_size": (ChunkSize, None), "chunk_schedule": (ChunkSchedule, None),
    "tile": (Tile, None), "max_partial_prefills": (MaxPartialPrefills, None), "block_size": (BlockSize, 16),
    "num_blocks": (NumBlocks, None), "gpu_memory_utilization": (GpuMemoryUtilization, 0.9),
    "enable_prefix_caching": (PrefixCaching, False), "device": (Device, "auto"), "dtype": (Dtype, "auto"),
    "attention_backend": (AttentionBackend, "auto"), "seed": (Seed, 0),
}
WORKLOAD_OPTIONS = {  # WorkloadSpec field (name <- --workload) -> (annotated type, default)
    "workload": (Workload, "chat"), "num_requests": (NumRequests, 100), "duration": (Duration, None),
    "rate": (Rate, 1.0), "arrival": (Arrival, None), "burstiness": (Burstiness, 1.0),
    "time_scale": (TimeScale, 1.0), "prompt_len": (PromptLen, "lognormal:256:0.8:4:4096"),
    "output_len": (OutputLen, "lognormal:128:0.6:4:1024"), "tokenizer": (Tokenizer, None),
    "prefix_len": (PrefixLen, 0), "num_prefixes": (NumPrefixes, 1),
}

RUN_OPTIONS = {  # how `run` and `compare` execute and where they write
    "goodput": (Goodput, None), "backend": (BackendOpt, "auto"), "gpu": (Gpu, None),
    "cost_model": (CostModelPath, None), "warmup_steps": (WarmupSteps, 3), "out": (Out, None),
    "json_out": (JsonOut, None), "no_progress": (NoProgress, False),
}


def with_options(group: dict, **defaults):
    """Add a group of options to a Typer command: the function takes them as **kwargs, and Typer sees them
    in its signature (after the command's own). `defaults` overrides a default, e.g. workload="rag-mix"."""
    import inspect

    def decorate(fn):
        signature = inspect.signature(fn, eval_str=True)  # what Typer reads; string annotations resolved
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in own}
        extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                   default=defaults.get(name, default))
                 for name, (kind, default) in group.items() if name not in names]
        fn.__signature__ = signature.replace(parameters=own + extra)
        fn.__annotations__ = {**fn.__annotations__, **{p.name: p.annotation for p in extra}}
        return fn

    return decorate


def pick(values: dict, group: dict) -> dict:
    """The entries of a command's keyword arguments that belong to an option group."""
    return {name: values[name] for name in group if name in values}
