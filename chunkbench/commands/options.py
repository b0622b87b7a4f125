"""Command-line options shared by several commands, as Typer `Annotated` aliases and option groups. The
engine options are generated from the knob declarations (engine/knobs.py), the workload defaults are
WorkloadSpec's. Units are in every help text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from chunkbench.engine.knobs import KNOBS, Knob
from chunkbench.engine.model_config import MODEL_PRESETS
from chunkbench.workloads.lengths import LENGTH_HELP
from chunkbench.workloads.named import NAMED
from chunkbench.workloads.spec import WorkloadSpec
from chunkbench.workloads.vllm_datasets import HELP as DATASETS_HELP

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model preset (" + ", ".join(MODEL_PRESETS) + ") or a local Hugging Face directory with "
        "config.json and *.safetensors.",
    ),
]


def _knob_option(knob: Knob) -> tuple:
    """A Typer option for an engine knob, from its declaration: lists are comma-separated text, and knobs
    whose default is computed or unset are optional."""
    kind = str if knob.type is tuple else knob.type
    optional = knob.default is None or knob.type is tuple
    option = typer.Option(*knob.cli_flags, help=knob.help)
    return Annotated[kind | None if optional else kind, option], (None if optional else knob.default)


ENGINE_OPTIONS = {name: _knob_option(knob) for name, knob in KNOBS.items()}  # EngineConfig.create keywords
MaxModelLen, NumBlocks, Device, Dtype, Seed, TensorParallelSize, KvCacheDtype = (
    ENGINE_OPTIONS[k][0]
    for k in ("max_model_len", "num_blocks", "device", "dtype", "seed", "tensor_parallel_size", "kv_cache_dtype")
)


# ---- workload and output options ----
Workload = Annotated[
    str,
    typer.Option(
        help="Named workload (" + ", ".join(NAMED) + "), 'synthetic' (see --prompt-len/--output-len), a file: "
        ".csv/.jsonl with prompt_len,output_len[,arrival_time] token counts, .json in ShareGPT format; or one of "
        "vllm bench serve's datasets: " + DATASETS_HELP + "."
    ),
]
NumRequests = Annotated[
    int | None,
    typer.Option(
        "--num-requests", "--num-prompts", help="Requests to send (requests); traces: the first N (see --shuffle)."
    ),
]
Duration = Annotated[float | None, typer.Option(help="Keep only requests arriving in the first this many seconds (s).")]
Rate = Annotated[
    float | None,
    typer.Option(
        "--rate",
        "--request-rate",
        help="Mean arrival rate (requests/s); traces with timestamps ignore it. Unset: 1 (compare: across load); "
        "not with --ramp-up-strategy, as in vllm bench serve.",
    ),
]
Arrival = Annotated[
    str | None,
    typer.Option(
        help="Arrival process: poisson, gamma (see --burstiness), constant, all-at-once, or trace (the file's "
        "timestamps). Default: trace timestamps when the workload has them, else poisson."
    ),
]
Burstiness = Annotated[
    float, typer.Option(help="gamma arrivals: shape factor; < 1 burstier, 1 = Poisson (as vLLM's --burstiness).")
]
TimeScale = Annotated[
    float,
    typer.Option(
        "--time-scale",
        "--timed-trace-sec-multiplier",
        help="Multiply trace timestamps by this (< 1 replays faster; 0.001 for Mooncake's milliseconds).",
    ),
]
PromptLen = Annotated[str, typer.Option(help="synthetic prompts: " + LENGTH_HELP)]
OutputLen = Annotated[str, typer.Option(help="synthetic outputs: same forms as --prompt-len (tokens).")]
Tokenizer = Annotated[
    str | None,
    typer.Option(
        help="Local Hugging Face tokenizer directory to count ShareGPT tokens; default: 4 characters per token."
    ),
]
Goodput = Annotated[
    str | None,
    typer.Option(help="SLOs for goodput, in ms, space-separated: 'ttft:300 tpot:50 e2el:2000' (as vLLM's --goodput)."),
]
WarmupSteps = Annotated[int, typer.Option(help="Unmeasured engine steps before the run (steps).")]
Out = Annotated[
    Path | None,
    typer.Option(help="Directory for the outputs (created). Default: results/runs/<command>-<date>-<time>."),
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Also write the summary JSON to this file.")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bar.")]

# ---- where steps run ----
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="engine (the real model on this machine), sim (the simulator: the real scheduler, step "
        "times from --gpu's roofline or --cost-model), launch (tune only: a server started per trial, see "
        "--launch), or auto (engine, except a model larger than 'small' without a CUDA device: sim on h100-sxm).",
    ),
]
Gpu = Annotated[
    str | None,
    typer.Option(
        help="sim: GPU for the roofline cost model: a100-40g, a100-80g, h100-sxm, h100-pcie, h200, l40s, l4, a10g, "
        "rtx-4090, mi300x."
    ),
]
CostModelPath = Annotated[
    str | None,
    typer.Option("--cost-model", help="sim: a profile written by `chunkbench profile` (JSON) instead of a roofline."),
]
EngineOverhead = Annotated[
    str | None,
    typer.Option(
        "--engine-overhead",
        help="sim (roofline): the simulated engine's per-step overhead: vllm (default, 1.5 ms), "
        "sglang (0.4), trtllm (0.2), chunkbench (3), or milliseconds, e.g. 0.8ms.",
    ),
]
PrefixLen = Annotated[
    int,
    typer.Option(
        "--prefix-len",
        "--random-prefix-len",
        help="Shared prefix put before every prompt (tokens), as vLLM's random dataset's --random-prefix-len.",
    ),
]
Shuffle = Annotated[
    bool,
    typer.Option(
        "--shuffle/--no-shuffle",
        help="Trace and ShareGPT files: take --num-requests rows in an order shuffled by "
        "--seed (as vLLM's and Sarathi-Serve's loaders do) instead of the first rows (the default); a timestamped "
        "trace keeps time order.",
    ),
]
NumPrefixes = Annotated[int, typer.Option(help="Distinct shared prefixes, assigned round-robin (prefixes).")]
RampUpStrategy = Annotated[
    str | None,
    typer.Option(
        help="linear or exponential: the arrival rate goes from "
        "--ramp-up-start-rps to --ramp-up-end-rps over the requests "
        "(in the request's index, as vllm bench serve's), instead of "
        "--rate."
    ),
]
RampUpRps = Annotated[  # whole numbers, as vllm bench serve's (int) flags
    int | None, typer.Option(help="--ramp-up-strategy's first (start) or last (end) request's rate (requests/s).")
]
ProbeRate = Annotated[
    float,
    typer.Option(
        help="One-token probes (2 tokens in, 1 out) beside the load, this many "
        "per second (req/s), summarized apart (probe_completed, "
        "probe_median/p99/max_e2el_ms): what a newly arriving user waits while "
        "the load's prefills run. bench sends them as vllm bench serve does, one "
        "at a time with a pause of 1/R s after each; run, compare and tune put "
        "them on a fixed clock. 0: none."
    ),
]
SlaProbe = Annotated[
    str | None,
    typer.Option(
        help="Probe E2EL target (--probe-request-rate's one-token "
        "requests, 2 req/s unless given), same forms as --sla-ttft: "
        "'a new user's one-token request is answered within 200 ms at "
        "p99 while the load runs'."
    ),
]
SlaTtft = Annotated[
    str | None,
    typer.Option(help="TTFT target: 300ms, 0.3s, or p90:300ms for another percentile than --sla-percentile."),
]
SlaTbt = Annotated[str | None, typer.Option(help="Time-between-tokens (ITL) target, same forms.")]
SlaTpot = Annotated[str | None, typer.Option(help="Time-per-output-token target, same forms.")]
SlaE2el = Annotated[str | None, typer.Option(help="End-to-end latency target, same forms.")]
SlaPercentile = Annotated[float, typer.Option(help="Percentile the targets apply to (0-100].")]
MaxSchedDelay = Annotated[float, typer.Option(help="capacity: bound on the median scheduling delay (ms).")]
ProbeSeconds = Annotated[
    float | None,
    typer.Option(
        help="capacity on a real clock (the engine, a launched server): a probe whose steady verdict is not yet "
        "clear runs again longer, up to this many seconds of arrivals (s). Unset: one run of --num-requests "
        "per probe, its verdict marked when not clear. The simulator's probes grow on their own."
    ),
]


# ---- option groups, declared once and added to each command that takes them ----

_SPEC = {f.name: f.default for f in dataclasses.fields(WorkloadSpec)}
WORKLOAD_OPTIONS = {  # WorkloadSpec field (name <- --workload) -> (annotated type, the spec's default)
    "workload": (Workload, _SPEC["name"]),
    "num_requests": (NumRequests, _SPEC["num_requests"]),
    "duration": (Duration, _SPEC["duration"]),
    "rate": (Rate, None),  # unset: the spec's 1 req/s (commands/common.load_workload)
    "arrival": (Arrival, _SPEC["arrival"]),
    "burstiness": (Burstiness, _SPEC["burstiness"]),
    "time_scale": (TimeScale, _SPEC["time_scale"]),
    "prompt_len": (PromptLen, _SPEC["prompt_len"]),
    "output_len": (OutputLen, _SPEC["output_len"]),
    "tokenizer": (Tokenizer, _SPEC["tokenizer"]),
    "prefix_len": (PrefixLen, _SPEC["prefix_len"]),
    "num_prefixes": (NumPrefixes, _SPEC["num_prefixes"]),
    "shuffle": (Shuffle, _SPEC["shuffle"]),
    "ramp_up_strategy": (RampUpStrategy, None),
    "ramp_up_start_rps": (RampUpRps, None),
    "ramp_up_end_rps": (RampUpRps, None),
    "probe_request_rate": (ProbeRate, _SPEC["probe_request_rate"]),
}


def _dataset_option(name: str, kind: type, help: str) -> tuple:
    default = _SPEC[name]
    return Annotated[kind | None if default is None else kind, typer.Option(help=help)], default


DATASET_OPTIONS = {
    name: _dataset_option(name, kind, help)
    for name, kind, help in [  # vllm bench serve's
        ("random_input_len", int, "random: mean prompt tokens, less the tokenizer's special tokens (tokens)."),
        ("random_output_len", int, "random: mean output tokens (tokens)."),
        ("random_range_ratio", float, "random: lengths uniform from mean*(1-r) to mean*(1+r), 0 <= r < 1."),
        ("prefix_repetition_prefix_len", int, "prefix_repetition: shared prefix (tokens)."),
        ("prefix_repetition_suffix_len", int, "prefix_repetition: each request's own suffix (tokens)."),
        ("prefix_repetition_num_prefixes", int, "prefix_repetition: distinct prefixes (prefixes)."),
        ("prefix_repetition_output_len", int, "prefix_repetition: output (tokens)."),
        ("custom_output_len", int, "custom: output per request (tokens); -1: each line's output_tokens."),
        ("hf_subset", str, "hf: the dataset's subset (configuration name)."),
        ("hf_split", str, "hf: the split to read."),
        ("hf_output_len", int, "hf: output per request (tokens); default: the answer column's tokens."),
        (
            "timed_trace_chunk_hash_size",
            int,
            "timed_trace: tokens per hash id (512 in Mooncake's traces, 16 in Qwen's).",
        ),
        ("timed_trace_label_timestamp", str, "timed_trace: the timestamp's JSON label."),
        ("timed_trace_label_input_length", str, "timed_trace: the input length's JSON label."),
        ("timed_trace_label_output_length", str, "timed_trace: the output length's JSON label."),
        ("timed_trace_label_hash_ids", str, "timed_trace: the hash ids' JSON label."),
    ]
}
WORKLOAD_OPTIONS |= DATASET_OPTIONS

SLA_OPTIONS = {  # the targets `tune` and `compare` judge by
    "sla_ttft": (SlaTtft, None),
    "sla_tbt": (SlaTbt, None),
    "sla_tpot": (SlaTpot, None),
    "sla_e2el": (SlaE2el, None),
    "sla_percentile": (SlaPercentile, 99.0),
    "max_sched_delay": (MaxSchedDelay, 2000.0),
    "probe_seconds": (ProbeSeconds, None),
}

RUN_OPTIONS = {  # how `run` and `compare` execute and where they write
    "goodput": (Goodput, None),
    "backend": (BackendOpt, "auto"),
    "gpu": (Gpu, None),
    "cost_model": (CostModelPath, None),
    "engine_overhead": (EngineOverhead, None),
    "warmup_steps": (WarmupSteps, 3),
    "out": (Out, None),
    "json_out": (JsonOut, None),
    "no_progress": (NoProgress, False),
}


def with_options(group: dict, **defaults):
    """Add a group of options to a Typer command: the function takes them as **kwargs, and Typer sees them
    in its signature (after the command's own). `defaults` overrides a default, e.g. workload="rag-mix"."""
    import inspect

    def decorate(fn):
        signature = inspect.signature(fn, eval_str=True)  # what Typer reads; string annotations resolved
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in own}
        extra = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=defaults.get(name, default)
            )
            for name, (kind, default) in group.items()
            if name not in names
        ]
        fn.__signature__ = signature.replace(parameters=own + extra)
        fn.__annotations__ = {**fn.__annotations__, **{p.name: p.annotation for p in extra}}
        return fn

    return decorate


def pick(values: dict, group: dict) -> dict:
    """The entries of a command's keyword arguments that belong to an option group."""
    return {name: values[name] for name in group if name in values}
