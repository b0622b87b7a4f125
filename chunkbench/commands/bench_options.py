"""The options of `chunkbench bench` (declared in serve.py, run by commands/bench.py's steps) as option groups:
the client, the sampling parameters sent, the server's model, the files vllm bench serve's --save-result and
--plot-timeline write, and the run. Each group maps bench's keyword to (annotated type, default)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from chunkbench.commands.options import Goodput, JsonOut, MaxModelLen, Out, ProbeRate, Seed

BENCH_CLIENT_OPTIONS = {  # where and how requests are sent
    "endpoint": (
        Annotated[
            str | None,
            typer.Option(
                help="OpenAI-compatible base URL, e.g. "
                "http://127.0.0.1:8000/v1 (chunkbench serve, vLLM, SGLang); "
                "or vLLM's API path (/v1/completions, /v1/chat/completions) "
                "with --base-url or --host/--port. Default: "
                "http://127.0.0.1:8000/v1."
            ),
        ],
        None,
    ),
    "max_concurrency": (
        Annotated[
            int | None,
            typer.Option(
                help="Client slots: most requests in flight "
                "(requests); default: no limit. TTFT and E2EL start "
                "at the send; the wait for a slot is reported as "
                "client_queue_time (ms), as vllm bench serve does."
            ),
        ],
        None,
    ),
    "api": (
        Annotated[
            str,
            typer.Option(
                help="OpenAI API to call: completions (/v1/completions, token-id prompts) or "
                "chat (/v1/chat/completions, text prompts of about prompt-len "
                "tokens)."
            ),
        ],
        "completions",
    ),
    "api_key": (
        Annotated[str | None, typer.Option(help="Sent as 'Authorization: Bearer KEY'; default: $OPENAI_API_KEY.")],
        None,
    ),
    "header": (
        Annotated[
            list[str] | None,
            typer.Option(help="Extra HTTP header on every request, NAME:VALUE or NAME=VALUE as vLLM's (repeatable)."),
        ],
        None,
    ),
    "request_timeout": (
        Annotated[
            float,
            typer.Option(help="Per-request limit from send to last byte (s); a request past it counts as failed."),
        ],
        600.0,
    ),
    "num_warmups": (
        Annotated[
            int,
            typer.Option(
                help="Untimed copies of request 0 sent at once before the clock "
                "starts (requests; as vllm bench serve's, default 0)."
            ),
        ],
        0,
    ),
    "probe_request_rate": (ProbeRate, 0.0),  # sent by the client, never added to the workload's requests
    "vllm_version": (
        Annotated[
            str | None,
            typer.Option(
                help="Measure as this vLLM release's vllm bench serve client does (X.Y.Z: 0.32.0, 0.33.0 or "
                "0.34.0): 0.32 takes a chat stream's TTFT at its role-only first chunk and sends probes "
                "through the --max-concurrency pool; 0.33+ times only chunks that carry output, probes on "
                "their own connection. Default: the server's GET /version; the newest when it has none."
            ),
        ],
        None,
    ),
}

Sampling = Annotated[
    float | None,
    typer.Option(
        help="Sent with every request when given (as vllm bench serve's flag); default: not sent, the server's default."
    ),
]
SAMPLING_OPTIONS = {  # vllm bench serve's sampling flags, in the order they join each request's body
    "temperature": (Sampling, None),
    "top_p": (Sampling, None),
    "top_k": (
        Annotated[
            int | None,
            typer.Option(help="Sent with every request when given (as vllm bench serve's flag); default: not sent."),
        ],
        None,
    ),
    "min_p": (Sampling, None),
    "frequency_penalty": (Sampling, None),
    "presence_penalty": (Sampling, None),
    "repetition_penalty": (Sampling, None),
}

BENCH_SERVER_OPTIONS = {  # the model the server is asked for, and the token ids its vocabulary takes
    "served_model": (
        Annotated[
            str | None,
            typer.Option("--model", help="Model name to send; default: the server's first /v1/models entry."),
        ],
        None,
    ),
    "vocab_size": (
        Annotated[
            int | None,
            typer.Option(
                help="Token ids of the random prompts are below this; "
                "default: --tokenizer's, else the server's (its model card, "
                "else vLLM's /detokenize)."
            ),
        ],
        None,
    ),
}

SAVE_RESULT_OPTIONS = {  # vllm bench serve's --save-result, and the --plot-timeline HTML
    "save_result": (
        Annotated[
            bool,
            typer.Option(
                help="Also write the result as vllm bench serve --save-result does (its keys and layout) in "
                "--result-dir."
            ),
        ],
        False,
    ),
    "result_dir": (Annotated[Path | None, typer.Option(help="Folder for --save-result (default: .).")], None),
    "result_filename": (
        Annotated[
            str | None,
            typer.Option(help="File name for --save-result (default: vLLM's {label}-{rate}qps-{model}-{date}.json)."),
        ],
        None,
    ),
    "save_detailed": (
        Annotated[bool, typer.Option(help="--save-result keeps the per-request lists (as vLLM's).")],
        False,
    ),
    "label": (Annotated[str | None, typer.Option(help="--save-result's label (default: the backend).")], None),
    "plot_timeline": (
        Annotated[
            bool,
            typer.Option(
                help="Also write each request's timeline as HTML: a bar from "
                "send to last token, the gaps between tokens coloured by "
                "--timeline-itl-thresholds (timeline.html in --out; with "
                "--save-result, beside the result file as vLLM's)."
            ),
        ],
        False,
    ),
    "timeline_itl_thresholds": (
        Annotated[
            str,
            typer.Option(
                help="--plot-timeline's two ITL thresholds, LOW,HIGH (ms): green below LOW, orange up to HIGH, "
                "red above."
            ),
        ],
        "25,50",
    ),
    "percentile_metrics": (
        Annotated[str, typer.Option(help="--save-result: metrics with percentiles, of ttft, tpot, itl, e2el.")],
        "ttft,tpot,itl",
    ),
    "metric_percentiles": (
        Annotated[str, typer.Option(help="--save-result: percentiles, comma-separated (%).")],
        "99",
    ),
}

BENCH_RUN_OPTIONS = {  # the workload's context limit, goodput and seed, and where the run's files go
    "max_model_len": (MaxModelLen, None),
    "goodput": (Goodput, None),
    "seed": (Seed, 0),
    "out": (Out, None),
    "json_out": (JsonOut, None),
}

# bench's own options, apart from the workload's and vllm bench serve's other flags (its `options`)
BENCH_OPTIONS = BENCH_CLIENT_OPTIONS | SAMPLING_OPTIONS | BENCH_SERVER_OPTIONS | SAVE_RESULT_OPTIONS | BENCH_RUN_OPTIONS
