"""`chunkbench serve` (the engine over an OpenAI-compatible API) and `chunkbench bench` (any such server,
measured with chunkbench's workloads and metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from chunkbench.commands.common import console, default_out, load_workload, save_json
from chunkbench.commands.options import ProbeRate  # noqa: I001
from chunkbench.commands.options import (ENGINE_OPTIONS, WORKLOAD_OPTIONS, Goodput, JsonOut, MaxModelLen, Model, Out,
                                         Seed, pick, with_options)
from chunkbench.commands.vllm_flags import VLLM_FLAGS, dataset_workload, server_url
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError, check_number
from chunkbench.outputs import check_writable
from chunkbench.timeline import parse_thresholds, write_timeline
from chunkbench.vllm_datasets import DATASETS


@with_options(ENGINE_OPTIONS)
def serve(
    model: Model = "tiny",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (1-65535).")] = 8000,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name the API reports.")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (bytes); larger gets HTTP "
                                                "413.")] = 4 * 2**20,
    max_prompt_chars: Annotated[Optional[int], typer.Option(
        help="Longest text prompt or chat (characters), checked before tokenizing; longer gets HTTP 400. "
        "Default: 32 x --max-model-len.")] = None,
    header_timeout: Annotated[float, typer.Option(help="Seconds a request's headers may take to arrive (s); "
                                                  "then the connection is closed.")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request's body may take to arrive after its "
                                                "headers (s); slower gets HTTP 408.")] = 30.0,
    max_connections: Annotated[int, typer.Option(help="Connections plus tasks before the server answers 503 "
                                                 "(connections).")] = 1000,
    **engine,
) -> None:
    """Serve the built-in engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics with vLLM's metric names)."""
    import uvicorn

    from chunkbench.server import create_app
    from chunkbench.server_limits import ServerLimits

    if not 1 <= port <= 65535:
        raise UserError(f"--port must be from 1 to 65535, got {port}")
    for flag, value in (("--max-body-bytes", max_body_bytes), ("--max-prompt-chars", max_prompt_chars or 1),
                        ("--header-timeout", header_timeout), ("--body-timeout", body_timeout),
                        ("--max-connections", max_connections)):
        check_number(flag, value, low=0, low_open=True)
    config = EngineConfig.create(model, **engine)
    limits = ServerLimits(max_body_bytes=max_body_bytes, max_prompt_chars=max_prompt_chars,
                          header_timeout_s=header_timeout, body_timeout_s=body_timeout, max_connections=max_connections)
    uvicorn.run(create_app(config, served_model_name, limits), host=host, port=port, log_level="warning",
                **limits.uvicorn_kwargs())


Sampling = Annotated[Optional[float], typer.Option(help="Sent with every request when given (as vllm bench "
                                                     "serve's flag); default: not sent, the server's default.")]


@with_options(VLLM_FLAGS)
@with_options(WORKLOAD_OPTIONS)
def bench(
    endpoint: Annotated[Optional[str], typer.Option(help="OpenAI-compatible base URL, e.g. "
                                                    "http://127.0.0.1:8000/v1 (chunkbench serve, vLLM, SGLang); "
                                                    "or vLLM's API path (/v1/completions, /v1/chat/completions) "
                                                    "with --base-url or --host/--port. Default: "
                                                    "http://127.0.0.1:8000/v1.")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option(help="Client slots: most requests in flight "
                                                           "(requests); default: no limit. TTFT and E2EL start "
                                                           "at the send; the wait for a slot is reported as "
                                                           "client_queue_time (ms), as vllm bench serve does.")] = None,
    api: Annotated[str, typer.Option(help="OpenAI API to call: completions (/v1/completions, token-id prompts) or "
                                     "chat (/v1/chat/completions, text prompts of about prompt-len "
                                     "tokens).")] = "completions",
    api_key: Annotated[Optional[str], typer.Option(help="Sent as 'Authorization: Bearer KEY'; default: "
                                                   "$OPENAI_API_KEY.")] = None,
    header: Annotated[Optional[list[str]], typer.Option(help="Extra HTTP header on every request, NAME:VALUE "
                                                        "(repeatable).")] = None,
    request_timeout: Annotated[float, typer.Option(help="Per-request limit from send to last byte (s); a request "
                                                   "past it counts as failed.")] = 600.0,
    num_warmups: Annotated[int, typer.Option(help="Untimed copies of request 0 sent at once before the clock "
                                             "starts (requests; as vllm bench serve's, default 0).")] = 0,
    probe_request_rate: ProbeRate = 0.0,
    temperature: Sampling = None,
    top_p: Sampling = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sent with every request when given (as vllm bench "
                                                 "serve's flag); default: not sent.")] = None,
    min_p: Sampling = None,
    frequency_penalty: Sampling = None,
    presence_penalty: Sampling = None,
    repetition_penalty: Sampling = None,
    served_model: Annotated[Optional[str], typer.Option("--model", help="Model name to send; default: the "
                                                        "server's first /v1/models entry.")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(help="Token ids of the random prompts are below this; "
                                                      "default: --tokenizer's, else the server's (its model card, "
                                                      "else vLLM's /detokenize).")] = None,
    save_result: Annotated[bool, typer.Option(help="Also write the result as vllm bench serve --save-result "
                                              "does (its keys and layout) in --result-dir.")] = False,
    result_dir: Annotated[Optional[Path], typer.Option(help="Folder for --save-result (default: .).")] = None,
    result_filename: Annotated[Optional[str], typer.Option(help="File name for --save-result (default: vLLM's "
                                                           "{label}-{rate}qps-{model}-{date}.json).")] = None,
    save_detailed: Annotated[bool, typer.Option(help="--save-result keeps the per-request lists (as vLLM's)."
                                                )] = False,
    label: Annotated[Optional[str], typer.Option(help="--save-result's label (default: the backend).")] = None,
    plot_timeline: Annotated[bool, typer.Option(help="Also write each request's timeline as HTML: a bar from "
                                                "send to last token, the gaps between tokens coloured by "
                                                "--timeline-itl-thresholds (timeline.html in --out; with "
                                                "--save-result, beside the result file as vLLM's).")] = False,
    timeline_itl_thresholds: Annotated[str, typer.Option(help="--plot-timeline's two ITL thresholds, LOW,HIGH "
                                                         "(ms): green below LOW, orange up to HIGH, red "
                                                         "above.")] = "25,50",
    percentile_metrics: Annotated[str, typer.Option(help="--save-result: metrics with percentiles, of ttft, "
                                                    "tpot, itl, e2el.")] = "ttft,tpot,itl",
    metric_percentiles: Annotated[str, typer.Option(help="--save-result: percentiles, comma-separated "
                                                    "(%).")] = "99",
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
    from chunkbench.backends import EndpointBackend
    from chunkbench.client import APIS
    from chunkbench.report import comparison_table
    from chunkbench.runs import run_benchmark, save_run
    from chunkbench.slo import parse_goodput
    from chunkbench.vllm_result import parse_percentiles, result_path, save_vllm_result, vllm_result

    if max_concurrency is not None:
        check_number("--max-concurrency", max_concurrency, low=1)
    if vocab_size is not None:
        check_number("--vocab-size", vocab_size, low=2)
    check_number("--num-warmups", num_warmups, low=0, integer=True)
    check_number("--probe-request-rate", probe_request_rate, low=0)
    if api not in APIS:  # checked again once vLLM's --backend or --endpoint path has chosen it
        raise UserError(f"--api must be {' or '.join(APIS)}, got '{api}'")
    check_number("--request-timeout", request_timeout, low=0, low_open=True)
    sampling = {name: value for name, value in
                {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                 "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
                 "repetition_penalty": repetition_penalty}.items() if value is not None}
    for name, value in sampling.items():  # finite, before any request (JSON has no NaN; the server judges ranges)
        check_number("--" + name.replace("_", "-"), value)
    headers = {}
    for item in header or []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UserError(f"--header must be NAME:VALUE, got '{item}'")
        headers[name.strip()] = value.strip()
    check_writable(out, "--out", folder=True)
    check_writable(json_out, "--json")
    metrics, percentiles = parse_percentiles(percentile_metrics, metric_percentiles)
    thresholds = parse_thresholds(timeline_itl_thresholds)
    slos = parse_goodput(goodput)
    endpoint, api = server_url(endpoint, options["base_url"], options["host"], options["port"],
                               options["vllm_backend"], api)
    served_model = options["served_model_name"] or served_model
    if options["dataset_name"] is not None:
        options["workload"] = dataset_workload(options["dataset_name"], options["dataset_path"])
    self_timed = not options["no_self_timed"]
    options = pick(options, WORKLOAD_OPTIONS)
    if options["arrival"] is None and not (self_timed and has_timestamps(options["workload"])):
        options["arrival"] = "vllm"  # vllm bench serve's schedule for the same --rate, --burstiness, --seed
    backend = EndpointBackend.connect(endpoint, served_model, vocab_size, options["tokenizer"],
                                      max_concurrency=max_concurrency, api=api, api_key=api_key, headers=headers,
                                      timeout_s=request_timeout, num_warmups=num_warmups, sampling=sampling,
                                      probe_rate=probe_request_rate)
    limit = max_model_len or backend.max_model_len or 8192
    spec, requests = load_workload(limit, seed=seed, **options)
    run = run_benchmark(None, requests, backend=backend, label=endpoint, goodput_ms=slos, seed=seed,
                        progress=False, warmup_steps=0)
    failures = [{"request": i, "error": r.error} for i, r in enumerate(run.result.requests) if r.error]
    out = out or default_out("bench")
    payload = save_run(run, out, spec, endpoint=endpoint, failed_requests=failures)
    save_json(json_out, payload)
    console.print(comparison_table([run], title=f"{endpoint}, {spec.name}, {len(requests)} requests"))
    for failure in failures[:10]:
        console.print(f"[red]request {failure['request']} failed:[/] {failure['error']}")
    if probe_request_rate:
        s = run.summary
        console.print(f"probes: {s['probe_completed']} completed, {s['probe_failed']} failed"
                      + (f"; E2EL median {s['probe_median_e2el_ms']:,.1f} ms, p99 {s['probe_p99_e2el_ms']:,.1f} ms, "
                         f"max {s['probe_max_e2el_ms']:,.1f} ms" if s["probe_completed"] else ""))
    console.print(f"wrote {out}/summary.json, requests.parquet")
    if save_result:
        timed = spec.arrival in (None, "trace", "all-at-once") or spec.name == "multi-turn"
        result = vllm_result(run.summary, run.result.requests, api=api, model_id=backend.model,
                             tokenizer_id=spec.tokenizer or backend.model, label=label,
                             request_rate="inf" if timed else spec.rate, burstiness=spec.burstiness,
                             max_concurrency=max_concurrency, goodput=bool(slos), metrics=metrics,
                             percentiles=percentiles, detailed=save_detailed)
        path = result_path(result_dir, result_filename, result)
        save_vllm_result(result, path)
        console.print(f"wrote {path} (vllm bench serve --save-result's layout)")
    if plot_timeline:
        where = path.with_suffix(".timeline.html") if save_result else out / "timeline.html"
        write_timeline(run.result.requests, where, thresholds, f"{endpoint}, {spec.name}, {len(requests)} requests")
        console.print(f"wrote {where}")


def has_timestamps(workload: str) -> bool:
    """Whether the workload brings its own arrival times (a named trace, multi-turn, a file with them)."""
    from chunkbench.workload import TRACE_FILES

    kind = workload.partition(":")[0]
    if kind in DATASETS:
        return kind == "timed_trace"
    if workload in TRACE_FILES or workload == "multi-turn":
        return True
    if Path(workload).suffix in (".csv", ".jsonl", ".ndjson", ".json"):
        return True  # a file keeps the old default: its timestamps, else poisson
    return False


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(bench)
