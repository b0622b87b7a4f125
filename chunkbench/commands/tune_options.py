"""The option groups of `chunkbench tune`, declared once and added to its signature by `with_options`: what is
searched and where it is kept, where the trials run and how the best are re-measured, how --backend launch
starts its servers, and the engine flags every trial keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from chunkbench.commands.options import (
    DATASET_OPTIONS,
    BackendOpt,
    CostModelPath,
    EngineOverhead,
    Gpu,
    KvCacheDtype,
    MaxModelLen,
    NoProgress,
    NumBlocks,
    ProbeRate,
    Seed,
    SlaProbe,
    TensorParallelSize,
    TimeScale,
)
from chunkbench.tune.objectives import AUTO
from chunkbench.tune.objectives import help_text as objective_help

TUNE_WORKLOAD_OPTIONS = DATASET_OPTIONS | {"time_scale": (TimeScale, 1.0)}

TUNE_SEARCH_OPTIONS = {  # the study: its target, space, workload, trial count and where it is kept
    "sla_probe": (SlaProbe, None),
    "probe_request_rate": (ProbeRate, 0.0),
    "objective": (Annotated[str, typer.Option(help=objective_help())], AUTO),
    "space": (
        Annotated[
            str,
            typer.Option(help="Search space: a TOML file, or a built-in one: default, latency, throughput, prefix."),
        ],
        "default",
    ),
    "workload": (
        Annotated[str | None, typer.Option(help="Workload (overrides the space file's); see `run`.")],
        None,
    ),
    "rate": (
        Annotated[float | None, typer.Option(help="Arrival rate, requests/s (overrides the space file's).")],
        None,
    ),
    "num_requests": (
        Annotated[int | None, typer.Option(help="Requests per trial (overrides the space file's).")],
        None,
    ),
    "n_trials": (Annotated[int, typer.Option(help="Complete trials the study should hold, over all processes.")], 60),
    "jobs": (
        Annotated[
            int,
            typer.Option(
                help="Trials in this many processes at once on this machine, one shared "
                "study (the trial count stays exact)."
            ),
        ],
        1,
    ),
    "timeout": (
        Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds (s).")],
        None,
    ),
    "study": (
        Annotated[
            str | None,
            typer.Option(help="Study name; an existing study resumes. Default: <model>-<workload>-<objective>."),
        ],
        None,
    ),
    "storage": (
        Annotated[
            str | None,
            typer.Option(
                help="Optuna RDB URL (postgresql://user:pw@host/db) to share "
                "a study between machines. Default: SQLite in the output "
                "folder."
            ),
        ],
        None,
    ),
    "out": (Annotated[Path | None, typer.Option(help="Output folder. Default: results/tune/<study>.")], None),
    "no_progress": (NoProgress, False),
}

TUNE_BACKEND_OPTIONS = {  # where the trials run, and how the best are re-measured
    "backend": (BackendOpt, "auto"),
    "gpu": (Gpu, None),
    "cost_model": (CostModelPath, None),
    "engine_overhead": (EngineOverhead, None),
    "verify_top": (
        Annotated[
            int,
            typer.Option(
                help="auto: re-measure the best N feasible trials on the real engine "
                "when the model runs on this device. --backend launch: launch the "
                "best N distinct configurations again (--presearch sim: for the first "
                "time; at least 1), run each --verify-repeats times, and pick the "
                "winner on those medians: the best of many single runs is partly the "
                "luckiest (0: the best single run wins; pareto: not re-measured)."
            ),
        ],
        3,
    ),
    "presearch": (
        Annotated[
            str,
            typer.Option(
                help="--backend launch: 'sim' calibrates the simulator on a few "
                "launches of the server, searches in simulation and launches only "
                "the --verify-top best; 'none' launches every trial."
            ),
        ],
        "none",
    ),
    "verify_repeats": (
        Annotated[
            int | None,
            typer.Option(
                help="--backend launch: run the workload this many times on each re-measured (--verify-top) "
                "configuration's launched server and judge it by the medians (a p99 of a short run moves between "
                "runs of one server; one launch per configuration all the same; with --objective capacity each run "
                "is a whole bisection). Default 3."
            ),
        ],
        None,
    ),
    "calibration": (
        Annotated[
            Path | None,
            typer.Option(
                help="--presearch sim: a server calibration (JSON) to "
                "reuse for the same deployment; written there after "
                "calibrating when the file does not exist."
            ),
        ],
        None,
    ),
}

TUNE_LAUNCH_OPTIONS = {  # --backend launch: the server command, its endpoint, and the slots it runs in
    "launch": (
        Annotated[
            str | None,
            typer.Option(
                help="--backend launch: server command per trial, with "
                '{model} and knob placeholders (unset: 0), e.g. "vllm serve '
                '{model} --max-num-batched-tokens {max_num_batched_tokens}"; '
                "{vllm_flags}, {sglang_flags} and {chunkbench_flags} are the "
                "trial's whole flag list for that server, unset knobs left out: "
                '"vllm serve {model} {vllm_flags}", "python -m '
                'sglang.launch_server --model-path {model} {sglang_flags} --port {port}".'
            ),
        ],
        None,
    ),
    "vllm_version": (
        Annotated[
            str | None,
            typer.Option(
                help="The vLLM release the search and the emitted vllm.yaml target "
                "(0.32.0, 0.33.0 or 0.34.0): knobs it has no option for are left "
                "out. Default: a launched vLLM's own (`vllm --version`), else the "
                "newest."
            ),
        ],
        None,
    ),
    "endpoint": (
        Annotated[
            str | None,
            typer.Option(
                help="--backend launch: the launched server's OpenAI base "
                "URL, e.g. http://127.0.0.1:8000/v1, or with the slot's port: "
                "http://127.0.0.1:{port}/v1 (the default when --launch has "
                "{port})."
            ),
        ],
        None,
    ),
    "launch_timeout": (
        Annotated[float, typer.Option(help="--backend launch: seconds to wait for /health (s).")],
        300.0,
    ),
    "slots": (
        Annotated[
            int | None,
            typer.Option(
                help="--backend launch: run up to this many trials at once, one "
                "launched server per slot (default: as many as --gpus or --cpus "
                "make, else 1). Slot i listens on --port-base + i: give --launch "
                "and --endpoint a {port} (or {slot}) placeholder."
            ),
        ],
        None,
    ),
    "port_base": (
        Annotated[int, typer.Option(help="--backend launch: the port of slot 0 ({port}); slot i gets port-base + i.")],
        8000,
    ),
    "gpus": (
        Annotated[
            str | None,
            typer.Option(
                help="--backend launch: the GPUs to tune on, e.g. 0,1,2,3 or 0-7; "
                "each slot gets --gpus-per-trial of them as CUDA_VISIBLE_DEVICES "
                "(and {gpus})."
            ),
        ],
        None,
    ),
    "gpus_per_trial": (
        Annotated[
            int, typer.Option(help="--backend launch: GPUs per launched server (e.g. its tensor-parallel size).")
        ],
        1,
    ),
    "cpus": (
        Annotated[
            str | None,
            typer.Option(
                help="--backend launch on a CPU machine: the cores to tune on, "
                "e.g. 0-7; each slot gets --cpus-per-trial of them as {cpus} (e.g. "
                "VLLM_CPU_OMP_THREADS_BIND={cpus} vllm serve ...)."
            ),
        ],
        None,
    ),
    "cpus_per_trial": (Annotated[int, typer.Option(help="--backend launch: cores per launched server.")], 1),
}

TUNE_ENGINE_OPTIONS = {  # the engine flags every trial keeps (EngineConfig.create keywords)
    "max_model_len": (MaxModelLen, None),
    "num_blocks": (NumBlocks, None),
    "tensor_parallel_size": (TensorParallelSize, 1),
    "kv_cache_dtype": (KvCacheDtype, "auto"),
    "seed": (Seed, 0),
}
