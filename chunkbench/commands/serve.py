"""`chunkbench serve` (the engine over an OpenAI-compatible API) and `chunkbench bench` (any such server,
measured with chunkbench's workloads and metrics)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated

import typer

from chunkbench.commands.bench import run_bench
from chunkbench.commands.bench_options import BENCH_OPTIONS
from chunkbench.commands.options import ENGINE_OPTIONS, WORKLOAD_OPTIONS, Model, pick, with_options
from chunkbench.commands.vllm_flags import VLLM_FLAGS
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError, check_number


@with_options(ENGINE_OPTIONS)
def serve(
    model: Model = "tiny",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (1-65535).")] = 8000,
    served_model_name: Annotated[str | None, typer.Option(help="Model name the API reports.")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (bytes); larger gets HTTP 413.")] = 4
    * 2**20,
    max_prompt_chars: Annotated[
        int | None,
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


@with_options(VLLM_FLAGS)
@with_options(WORKLOAD_OPTIONS)
@with_options(BENCH_OPTIONS)
def bench(**options) -> None:
    """Benchmark any OpenAI-compatible server with chunkbench's workloads and metrics (same files as `run`),
    including failed requests and their errors, as vllm bench serve of the server's release measures (its
    /version, or --vllm-version: 0.32's or 0.33+'s client rules): no sampling parameter or
    warm-up unless asked, and synthetic arrivals on vLLM's own schedule for --rate, --burstiness and --seed
    (--arrival vllm, the default here). vllm bench serve's command lines run as they are: its --base-url,
    --host/--port, --endpoint path, --backend, --dataset-name/--dataset-path, --request-rate, --num-prompts
    and dataset options are read; the options it has that change nothing here are accepted and ignored."""
    own = pick(options, BENCH_OPTIONS)  # the steps (commands/bench.py) read these by name, the rest as args.options
    run_bench(SimpleNamespace(**own, options={k: v for k, v in options.items() if k not in own}))


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(bench)
