"""`chunkbench serve` (the engine over an OpenAI-compatible API) and `chunkbench bench` (any such server,
measured with chunkbench's workloads and metrics)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

import typer

from chunkbench.commands.bench import run_bench
from chunkbench.commands.options import (
    ENGINE_OPTIONS,
    WORKLOAD_OPTIONS,
    Goodput,
    JsonOut,
    MaxModelLen,
    Model,
    Out,
    ProbeRate,  # noqa: I001
    Seed,
    with_options,
)
from chunkbench.commands.vllm_flags import VLLM_FLAGS
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError, check_number


@with_options(ENGINE_OPTIONS)
def serve(
    model: Model = "tiny",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (1-65535).")] = 8000,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name the API reports.")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (bytes); larger gets HTTP 413.")] = 4
    * 2**20,
    max_prompt_chars: Annotated[
        Optional[int],
        typer.Option(
            help="Longest text prompt or chat (characters), checked before tokenizing; longer gets HTTP 400. "
            "Default: 32 x --max-model-len."
        ),
    ] = None,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a request's headers may take to arrive (s); then the connection is closed.")
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(help="Seconds a request's body may take to arrive after its headers (s); slower gets HTTP 408."),
    ] = 30.0,
    max_connections: Annotated[
        int, typer.Option(help="Connections plus tasks before the server answers 503 (connections).")
    ] = 1000,
    **engine,
) -> None:
    """Serve the built-in engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics with vLLM's metric names)."""
    import uvicorn

    from chunkbench.serving.limits import ServerLimits
    from chunkbench.serving.server import create_app

    if not 1 <= port <= 65535:
        raise UserError(f"--port must be from 1 to 65535, got {port}")
    for flag, value in (
        ("--max-body-bytes", max_body_bytes),
        ("--max-prompt-chars", max_prompt_chars or 1),
        ("--header-timeout", header_timeout),
        ("--body-timeout", body_timeout),
        ("--max-connections", max_connections),
    ):
        check_number(flag, value, low=0, low_open=True)
    config = EngineConfig.create(model, **engine)
    limits = ServerLimits(
        max_body_bytes=max_body_bytes,
        max_prompt_chars=max_prompt_chars,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        max_connections=max_connections,
    )
    uvicorn.run(
        create_app(config, served_model_name, limits),
        host=host,
        port=port,
        log_level="warning",
        **limits.uvicorn_kwargs(),
    )


Sampling = Annotated[
    Optional[float],
    typer.Option(
        help="Sent with every request when given (as vllm bench serve's flag); default: not sent, the server's default."
    ),
]


@with_options(VLLM_FLAGS)
@with_options(WORKLOAD_OPTIONS)
def bench(
    endpoint: Annotated[
        Optional[str],
        typer.Option(
            help="OpenAI-compatible base URL, e.g. "
            "http://127.0.0.1:8000/v1 (chunkbench serve, vLLM, SGLang); "
            "or vLLM's API path (/v1/completions, /v1/chat/completions) "
            "with --base-url or --host/--port. Default: "
            "http://127.0.0.1:8000/v1."
        ),
    ] = None,
    max_concurrency: Annotated[
        Optional[int],
        typer.Option(
            help="Client slots: most requests in flight "
            "(requests); default: no limit. TTFT and E2EL start "
            "at the send; the wait for a slot is reported as "
            "client_queue_time (ms), as vllm bench serve does."
        ),
    ] = None,
    api: Annotated[
        str,
        typer.Option(
            help="OpenAI API to call: completions (/v1/completions, token-id prompts) or "
            "chat (/v1/chat/completions, text prompts of about prompt-len "
            "tokens)."
        ),
    ] = "completions",
    api_key: Annotated[
        Optional[str], typer.Option(help="Sent as 'Authorization: Bearer KEY'; default: $OPENAI_API_KEY.")
    ] = None,
    header: Annotated[
        Optional[list[str]], typer.Option(help="Extra HTTP header on every request, NAME:VALUE (repeatable).")
    ] = None,
    request_timeout: Annotated[
        float, typer.Option(help="Per-request limit from send to last byte (s); a request past it counts as failed.")
    ] = 600.0,
    num_warmups: Annotated[
        int,
        typer.Option(
            help="Untimed copies of request 0 sent at once before the clock "
            "starts (requests; as vllm bench serve's, default 0)."
        ),
    ] = 0,
    probe_request_rate: ProbeRate = 0.0,
    temperature: Sampling = None,
    top_p: Sampling = None,
    top_k: Annotated[
        Optional[int],
        typer.Option(help="Sent with every request when given (as vllm bench serve's flag); default: not sent."),
    ] = None,
    min_p: Sampling = None,
    frequency_penalty: Sampling = None,
    presence_penalty: Sampling = None,
    repetition_penalty: Sampling = None,
    served_model: Annotated[
        Optional[str], typer.Option("--model", help="Model name to send; default: the server's first /v1/models entry.")
    ] = None,
    vocab_size: Annotated[
        Optional[int],
        typer.Option(
            help="Token ids of the random prompts are below this; "
            "default: --tokenizer's, else the server's (its model card, "
            "else vLLM's /detokenize)."
        ),
    ] = None,
    save_result: Annotated[
        bool,
        typer.Option(
            help="Also write the result as vllm bench serve --save-result does (its keys and layout) in --result-dir."
        ),
    ] = False,
    result_dir: Annotated[Optional[Path], typer.Option(help="Folder for --save-result (default: .).")] = None,
    result_filename: Annotated[
        Optional[str],
        typer.Option(help="File name for --save-result (default: vLLM's {label}-{rate}qps-{model}-{date}.json)."),
    ] = None,
    save_detailed: Annotated[bool, typer.Option(help="--save-result keeps the per-request lists (as vLLM's).")] = False,
    label: Annotated[Optional[str], typer.Option(help="--save-result's label (default: the backend).")] = None,
    plot_timeline: Annotated[
        bool,
        typer.Option(
            help="Also write each request's timeline as HTML: a bar from "
            "send to last token, the gaps between tokens coloured by "
            "--timeline-itl-thresholds (timeline.html in --out; with "
            "--save-result, beside the result file as vLLM's)."
        ),
    ] = False,
    timeline_itl_thresholds: Annotated[
        str,
        typer.Option(
            help="--plot-timeline's two ITL thresholds, LOW,HIGH (ms): green below LOW, orange up to HIGH, red above."
        ),
    ] = "25,50",
    percentile_metrics: Annotated[
        str, typer.Option(help="--save-result: metrics with percentiles, of ttft, tpot, itl, e2el.")
    ] = "ttft,tpot,itl",
    metric_percentiles: Annotated[str, typer.Option(help="--save-result: percentiles, comma-separated (%).")] = "99",
    max_model_len: MaxModelLen = None,
    goodput: Goodput = None,
    seed: Seed = 0,
    out: Out = None,
    json_out: JsonOut = None,
    **options,
) -> None:
    """Benchmark any OpenAI-compatible server with chunkbench's workloads and metrics (same files as `run`),
    including failed requests and their errors, as vllm bench serve 0.32 measures: no sampling parameter or
    warm-up unless asked, and synthetic arrivals on vLLM's own schedule for --rate, --burstiness and --seed
    (--arrival vllm, the default here). vllm bench serve's command lines run as they are: its --base-url,
    --host/--port, --endpoint path, --backend, --dataset-name/--dataset-path, --request-rate, --num-prompts
    and dataset options are read; the options it has that change nothing here are accepted and ignored."""
    args = SimpleNamespace(**locals())  # the options by name, first: the steps (commands/bench.py) read them
    run_bench(args)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(bench)
