"""The `chunkbench` command line. Commands are thin: parse, build configs, call one function."""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException
from rich.console import Console
from rich.table import Table

from chunkbench.engine.config import ConfigError, EngineConfig
from chunkbench.engine.request import SamplingParams
from chunkbench.llm import LLM
from chunkbench.errors import UserError
from chunkbench.options import (ENGINE_OPTIONS, RUN_OPTIONS, WORKLOAD_OPTIONS, BackendOpt, CostModelPath, Device, Dtype,
                                Goodput, Gpu, JsonOut, MaxModelLen, Model, NoProgress, NumBlocks, Out, Seed,
                                pick, with_options)

app = typer.Typer(
    name="chunkbench", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Measure and tune chunked prefill for LLM serving: token budgets, chunk caps, progressive chunk "
         "schedules and batching policies, against TTFT / inter-token-latency SLAs.")
console = Console()


def parse_int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} must list integers >= 1, got '{text}'")
    return values


@app.command()
@with_options(ENGINE_OPTIONS)
def generate(
    model: Model = "tiny",
    prompt_lens: Annotated[str, typer.Option(help="Prompt lengths, comma-separated (tokens); the prompts "
                                             "are random token ids drawn from --seed.")] = "37,300",
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt (tokens).")] = 16,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (0-1].")] = 1.0,
    json_out: JsonOut = None,
    **engine,
) -> None:
    """Generate from random prompts with the built-in engine (greedy by default) and print the tokens."""
    lens = parse_int_list("--prompt-lens", prompt_lens)
    config = EngineConfig.create(model, **engine)
    seed = engine["seed"]
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    rng = random.Random(seed)
    prompts = [[rng.randrange(config.model.vocab_size) for _ in range(n)] for n in lens]
    requests = LLM.from_config(config).generate_requests(prompts, sampling)
    table = Table("request", "prompt tokens", "output tokens", "finish", "first output ids")
    for r in requests:
        table.add_row(r.request_id, str(r.num_prompt_tokens), str(r.num_output_tokens), r.finish_reason or "",
                      r.error or " ".join(map(str, r.output_token_ids[:12])))
    console.print(table)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([
            {"prompt_token_ids": r.prompt_token_ids, "output_token_ids": r.output_token_ids,
             "finish_reason": r.finish_reason, "error": r.error} for r in requests], indent=1))
    rejected = [r for r in requests if r.error]
    for r in rejected:
        print(f"chunkbench: error: request {r.request_id} rejected: {r.error}", file=sys.stderr)
    if rejected:
        raise typer.Exit(2)


def _workload(max_model_len: int, workload: str, **fields):
    """The workload spec from the flags and its requests; clipping warnings are shown, not raised."""
    import warnings

    from chunkbench.workload import WorkloadSpec, build_workload

    spec = WorkloadSpec(name=workload, **fields)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requests = build_workload(spec, max_model_len)
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    if not requests:
        raise UserError(f"--workload {spec.name}: no requests (check --num-requests and --duration)")
    return spec, requests


def _backend(kind: str, model: str, gpu: str | None, cost_model: str | None):
    from chunkbench.bench import choose_backend

    chosen, note = choose_backend(kind, model, gpu, cost_model)
    if note:
        console.print(f"[bold yellow]{note}[/]")
    return chosen


def _default_out(kind: str) -> Path:
    import datetime

    return Path("results/runs") / f"{kind}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


@app.command()
@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS)
def run(
    model: Model = "small",
    **options,
) -> None:
    """Serve one workload with one engine config; print the metrics and write summary.json,
    requests.parquet and steps.parquet."""
    goodput, backend, gpu, cost_model, warmup_steps, out, json_out, no_progress = pick(options, RUN_OPTIONS).values()
    from chunkbench.bench import run_benchmark, save_run
    from chunkbench.metrics import parse_goodput
    from chunkbench.report import comparison_table

    slos = parse_goodput(goodput)
    config = EngineConfig.create(model, **pick(options, ENGINE_OPTIONS))
    seed, workload = options["seed"], options["workload"]
    spec, requests = _workload(config.scheduler.max_model_len, seed=seed, **pick(options, WORKLOAD_OPTIONS))
    chosen = _backend(backend, model, gpu, cost_model)
    result = run_benchmark(config, requests, label=config.scheduler.policy, goodput_ms=slos, seed=seed,
                           warmup_steps=warmup_steps, progress=not no_progress, backend=chosen)
    out = out or _default_out("run")
    save_run(result, out, spec)
    console.print(comparison_table([result], title=f"{model}, {workload}, {len(requests)} requests"))
    if chosen.kind == "sim":
        steps, wall = result.summary["num_steps"], result.result.wall_seconds
        console.print(f"simulated {steps:,} steps ({result.summary['duration']:,.0f} s of virtual time) in "
                      f"{wall:.1f} s of wall time: {steps / max(wall, 1e-9):,.0f} steps/s")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text((out / "summary.json").read_text())
    console.print(f"wrote {out}/summary.json, requests.parquet, steps.parquet")
    if result.result.interrupted:
        raise typer.Exit(130)


@app.command()
@with_options(RUN_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(WORKLOAD_OPTIONS, workload="rag-mix")
def compare(
    policies: Annotated[list[str], typer.Argument(
        help="Policies to compare, each optionally with knobs: chunked:budget=512,schedule=2048,1024,512 "
        "(knobs: budget, chunk, schedule, tile, seqs, partial). The first is the baseline of the ratios.")],
    model: Model = "small",
    **options,
) -> None:
    """Run the same requests through several policies; print one table (a column per policy, ratios against
    the first) and write comparison.json, plots and report.html. Policies that never split a prompt get a
    budget of at least max-model-len."""
    goodput, backend, gpu, cost_model, warmup_steps, out, json_out, no_progress = pick(options, RUN_OPTIONS).values()
    from chunkbench.bench import compare as compare_policies
    from chunkbench.bench import save_run
    from chunkbench.metrics import parse_goodput
    from chunkbench.report import comparison_table, markdown_table, plot_comparison, write_html

    slos = parse_goodput(goodput)
    engine = pick(options, ENGINE_OPTIONS)
    engine.pop("policy")  # each positional policy sets its own
    base = dict(model=model, **engine)
    seed, workload = options["seed"], options["workload"]
    model_len = EngineConfig.create(**base).scheduler.max_model_len
    spec, requests = _workload(model_len, seed=seed, **pick(options, WORKLOAD_OPTIONS))
    chosen = _backend(backend, model, gpu, cost_model)
    runs = compare_policies(base, policies, requests, backend=chosen, goodput_ms=slos, seed=seed,
                            warmup_steps=warmup_steps, progress=not no_progress,
                            on_done=lambda r: console.print(f"{r.label}: {r.summary['completed']} requests in "
                                                            f"{r.result.wall_seconds:.1f} s of wall time"))
    out = out or _default_out("compare")
    for r in runs:
        save_run(r, out / r.label.replace("/", "_").replace(":", "_").replace(",", "_").replace("=", "-"), spec)
    title = f"{model}, {workload}, {len(requests)} requests"
    console.print(comparison_table(runs, title=title))
    summaries = {"runs": {r.label: r.summary for r in runs}}
    (out / "comparison.json").write_text(json.dumps(summaries, indent=2))
    (out / "comparison.md").write_text(markdown_table(runs) + "\n")
    images = plot_comparison(runs, out)
    write_html(runs, images, out / "report.html", title, "chunkbench compare " + " ".join(sys.argv[2:]))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summaries, indent=2))
    console.print(f"wrote {out}/comparison.json, comparison.md, report.html, ttft_cdf.png, itl_cdf.png, "
                  "timeline.png and one folder per policy")


@app.command()
def profile(
    model: Model = "small",
    device: Device = "auto",
    dtype: Dtype = "auto",
    max_model_len: MaxModelLen = None,
    num_blocks: NumBlocks = None,
    max_chunk: Annotated[int, typer.Option(help="Largest prefill chunk to time (tokens).")] = 2048,
    repeats: Annotated[int, typer.Option(help="Timed passes over the grid, each in a new random order (after "
                                               "one warm-up pass); the median per point is kept.")] = 5,
    out: Annotated[Optional[Path], typer.Option(
        help="Where to write the profile. Default: results/profiles/<device>-<model>.json.")] = None,
    seed: Seed = 0,
    no_progress: NoProgress = False,
) -> None:
    """Time real engine steps over a grid of prefill chunks, decode batches and context lengths, fit the
    simulator's cost model (non-negative least squares) and save it with its fit error."""
    from chunkbench.profile import profile_path, run_profile

    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    config = EngineConfig.create(model, max_model_len=max_model_len, num_blocks=num_blocks, device=device,
                                 dtype=dtype, seed=seed)
    fitted, measured = run_profile(config, repeats=repeats, max_chunk=max_chunk, progress=not no_progress)
    out = out or Path(profile_path(fitted.device, config.model.name))
    fitted.save(out)
    table = Table("prefill chunks (tokens@context)", "decodes", "measured ms", "fitted ms", "error",
                  title=f"{config.model.name} on {fitted.device}: {len(measured)} step shapes")
    for step, seconds in measured:
        predicted = fitted.predict(step)
        table.add_row(" ".join(f"{q}@{c}" for q, c in step.prefills) or "-",
                      f"{len(step.decodes)} x {step.decodes[0]}" if step.decodes else "-",
                      f"{seconds * 1e3:.1f}", f"{predicted * 1e3:.1f}", f"{(predicted - seconds) / seconds:+.0%}")
    console.print(table)
    fit = fitted.fit
    console.print(f"fit: mean error {fit['mean_abs_error_pct']:.1f}%, max {fit['max_abs_error_pct']:.1f}% over "
                  f"{fit['points']} shapes; repeated timings of one shape spread {fit['timing_spread_pct']:.1f}% "
                  f"(median of max-min over median); a step after an idle pause takes "
                  f"{fitted.idle_factor:.2f}x; wrote {out}")


@app.command()
def tune(
    model: Model = "llama-3-8b",
    sla_ttft: Annotated[Optional[str], typer.Option(help="TTFT target: 300ms, 0.3s, or p90:300ms for another "
                                                    "percentile than --sla-percentile.")] = None,
    sla_tbt: Annotated[Optional[str], typer.Option(help="Time-between-tokens (ITL) target, same forms.")] = None,
    sla_tpot: Annotated[Optional[str], typer.Option(help="Time-per-output-token target, same forms.")] = None,
    sla_e2el: Annotated[Optional[str], typer.Option(help="End-to-end latency target, same forms.")] = None,
    sla_percentile: Annotated[float, typer.Option(help="Percentile the targets apply to (0-100].")] = 99.0,
    objective: Annotated[str, typer.Option(help="goodput (maximise request goodput under the SLAs), capacity "
                                           "(highest req/s meeting them, by bisection) or pareto (NSGA-II over "
                                           "p99 TTFT, p99 TBT and throughput).")] = "goodput",
    space: Annotated[str, typer.Option(help="Search space: a TOML file, or default, latency, throughput "
                                       "(sweeps/*.toml).")] = "default",
    workload: Annotated[Optional[str], typer.Option(help="Workload (overrides the space file's); see `run`.")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Arrival rate, requests/s (overrides the space file's).")] = None,
    num_requests: Annotated[Optional[int], typer.Option(help="Requests per trial (overrides the space file's).")] = None,
    n_trials: Annotated[int, typer.Option(help="Complete trials the study should hold, over all processes.")] = 60,
    timeout: Annotated[Optional[float], typer.Option(help="Stop starting trials after this many seconds (s).")] = None,
    backend: BackendOpt = "auto",
    gpu: Gpu = None,
    cost_model: CostModelPath = None,
    verify_top: Annotated[int, typer.Option(help="auto: re-measure the best N feasible trials on the real engine "
                                            "when the model runs on this device.")] = 3,
    launch: Annotated[Optional[str], typer.Option(help="--backend launch: server command per trial, with "
                                                  "{model} and knob placeholders, e.g. \"vllm serve {model} "
                                                  "--max-num-batched-tokens {max_num_batched_tokens}\".")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="--backend launch: the launched server's OpenAI base "
                                                    "URL, e.g. http://127.0.0.1:8000/v1.")] = None,
    launch_timeout: Annotated[float, typer.Option(help="--backend launch: seconds to wait for /health.")] = 300.0,
    study: Annotated[Optional[str], typer.Option(help="Study name; an existing study resumes. Default: "
                                                 "<model>-<workload>-<objective>.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna RDB URL (postgresql://user:pw@host/db) to share "
                                                   "a study between machines. Default: SQLite in the output "
                                                   "folder.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder. Default: results/tune/<study>.")] = None,
    max_model_len: MaxModelLen = None,
    num_blocks: NumBlocks = None,
    max_sched_delay: Annotated[float, typer.Option(help="capacity: bound on the median scheduling delay (ms).")] = 2000.0,
    seed: Seed = 0,
    no_progress: NoProgress = False,
) -> None:
    """Search token budget, chunk caps, progressive chunk schedules and seats against SLAs; write the best
    config for chunkbench, vLLM and SGLang, trials.csv, plots and report.html."""
    from chunkbench.sla import parse_slas
    from chunkbench.space import SearchSpace
    from chunkbench.tuner import OBJECTIVES, TuneSpec, default_study_name

    slos = parse_slas({"ttft": sla_ttft, "tbt": sla_tbt, "tpot": sla_tpot, "e2el": sla_e2el}, sla_percentile)
    if objective not in OBJECTIVES:
        raise UserError(f"--objective must be one of {', '.join(OBJECTIVES)}, got '{objective}'")
    if objective == "capacity" and not slos:
        raise UserError("--objective capacity needs at least one --sla-* target")
    if n_trials < 1:
        raise UserError(f"--n-trials must be >= 1, got {n_trials}")
    search_space = SearchSpace.load(space)
    from chunkbench.workload import WorkloadSpec

    w = search_space.workload
    spec_workload = WorkloadSpec(**{**w,
                                    **{k: v for k, v in dict(name=workload, rate=rate, num_requests=num_requests,
                                                             seed=seed).items() if v is not None}})
    overrides = {k: v for k, v in dict(max_model_len=max_model_len, num_blocks=num_blocks, seed=seed).items()
                 if v is not None}
    EngineConfig.create(model, **overrides)  # validate the fixed flags
    if backend == "launch":
        from chunkbench.bench import Backend
        from chunkbench.tuner import launch_command

        if not launch or not endpoint:
            raise UserError("--backend launch needs --launch COMMAND and --endpoint URL")
        launch_command(launch, model, {})  # placeholders checked before anything starts
        chosen, verify = Backend("launch", launch=launch, endpoint=endpoint, launch_timeout_s=launch_timeout), 0
    else:
        chosen, verify = _tune_backend(backend, model, gpu, cost_model, verify_top)
    spec = TuneSpec(model=model, slos=slos, space=search_space, workload=spec_workload, backend=chosen,
                    objective=objective, n_trials=n_trials, timeout_s=timeout, seed=seed,
                    max_sched_delay_ms=max_sched_delay, engine_overrides=overrides)
    from chunkbench.workload import build_workload

    build_workload(spec_workload)  # a bad workload fails here, before anything is written
    from chunkbench.tune_run import tune_and_report

    tune_and_report(spec, study or default_study_name(spec), storage, out, verify, progress=not no_progress,
                    command="chunkbench " + " ".join(sys.argv[1:]))


def _tune_backend(kind: str, model: str, gpu: str | None, cost_model: str | None, verify_top: int):
    """auto: simulate, calibrated by this device's profile of the model when there is one, and verify the
    best trials on the real engine when the model runs here. Returns (backend, trials to verify)."""
    from chunkbench.bench import Backend, choose_backend
    from chunkbench.engine.config import MODEL_PRESETS, ModelConfig
    from chunkbench.profile import profile_path

    if kind != "auto":
        chosen, note = choose_backend(kind, model, gpu, cost_model)
        if note:
            console.print(f"[bold yellow]{note}[/]")
        return chosen, 0
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    runs_here = torch.cuda.is_available() or ModelConfig.from_name(model).num_params <= MODEL_PRESETS["small"].num_params
    profile = cost_model or profile_path(device, ModelConfig.from_name(model).name)
    if not gpu and Path(profile).exists():
        console.print(f"searching in simulation calibrated by {profile}"
                      + (f"; the best {verify_top} are re-measured on the real engine" if runs_here else ""))
        return Backend("sim", cost_model=profile), verify_top if runs_here else 0
    chosen = gpu or "h100-sxm"
    hint = "" if not runs_here else f" (run `chunkbench profile --model {model}` to calibrate for this machine)"
    console.print(f"[bold yellow]searching SIMULATED on {chosen} (roofline){hint}; no real-engine check[/]")
    return Backend("sim", chosen), 0


@app.command()
def gate(
    suite: Annotated[Path, typer.Option(help="Suite file: named cases, each a workload, policy, knobs, backend "
                                        "and the metrics it guards.")] = Path("sweeps/ci.toml"),
    baseline: Annotated[Path, typer.Option(help="Baseline JSON recorded with --update.")] = Path(
        "results/baselines/ci.json"),
    update: Annotated[bool, typer.Option("--update", help="Run the suite and rewrite the baseline (with this "
                                         "machine's description and the date).")] = False,
    junit: Annotated[Optional[Path], typer.Option(help="Write a JUnit XML report: one testcase per guarded "
                                                  "metric.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Write a Markdown table (e.g. to "
                                                         "$GITHUB_STEP_SUMMARY).")] = None,
) -> None:
    """Run the benchmark suite and compare with the baseline: exit 1 on a regression, 0 when clean, 2 on a
    usage error."""
    from chunkbench import gate as gating

    cases = gating.load_suite(suite)
    verdicts = gating.run_gate(cases, baseline, update)
    table = Table(title=f"chunkbench gate: {suite} against {baseline}")
    for column in ("case", "metric", "baseline", "now", "change", "95% interval", "verdict"):
        table.add_column(column, overflow="fold")
    style = {"REGRESSED": "bold red", "improved": "green", "ok": "default"}
    for v in verdicts:
        table.add_row(v.case, v.metric, f"{v.baseline:.4g}", f"{v.now:.4g}", f"{v.change:+.1%}",
                      f"{v.interval[0]:.4g}..{v.interval[1]:.4g}", f"[{style[v.verdict]}]{v.verdict}[/]")
    console.print(table)
    for path, text in ((junit, gating.junit_xml(verdicts)), (markdown_out, gating.markdown(verdicts))):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    regressions = [v for v in verdicts if v.verdict == "REGRESSED"]
    if update:
        console.print(f"baseline written to {baseline}")
    elif regressions:
        for v in regressions:
            print(f"chunkbench gate: REGRESSION {gating.describe(v)}", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
@with_options(ENGINE_OPTIONS)
def serve(
    model: Model = "tiny",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name the API reports.")] = None,
    **engine,
) -> None:
    """Serve the built-in engine over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics)."""
    import uvicorn

    from chunkbench.server import create_app

    config = EngineConfig.create(model, **engine)
    uvicorn.run(create_app(config, served_model_name), host=host, port=port, log_level="warning")


@app.command()
@with_options(WORKLOAD_OPTIONS)
def bench(
    endpoint: Annotated[str, typer.Option(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
                                          "(chunkbench serve, vLLM, SGLang).")],
    max_concurrency: Annotated[Optional[int], typer.Option(help="Most requests in flight (requests); "
                                                           "default: no limit.")] = None,
    served_model: Annotated[Optional[str], typer.Option("--model", help="Model name to send; default: the "
                                                        "server's first /v1/models entry.")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(help="Token ids of the random prompts are below this; "
                                                      "default: the server's, else 32000.")] = None,
    max_model_len: MaxModelLen = None,
    goodput: Goodput = None,
    seed: Seed = 0,
    out: Out = None,
    json_out: JsonOut = None,
    **workload_options,
) -> None:
    """Benchmark any OpenAI-compatible server with chunkbench's workloads and metrics (same JSON as `run`),
    including failed requests and their errors."""
    import asyncio

    import httpx

    from chunkbench.client import bench_endpoint
    from chunkbench.metrics import parse_goodput, summarize

    slos = parse_goodput(goodput)
    try:
        card = httpx.get(endpoint.rstrip("/") + "/models", timeout=10).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise UserError(f"--endpoint: no model list at {endpoint}/models: {exc}") from None
    limit = max_model_len or card.get("max_model_len") or 8192
    spec, requests = _workload(limit, seed=seed, **pick(workload_options, WORKLOAD_OPTIONS))
    workload = spec.name
    result = asyncio.run(bench_endpoint(endpoint, requests, vocab_size or card.get("vocab_size") or 32000,
                                        served_model or card.get("id"), max_concurrency, seed))
    summary = summarize(result.records, [], result.duration, slos)
    failures = [{"request": i, "error": e} for i, e in enumerate(result.errors) if e]
    payload = {**summary, "endpoint": endpoint, "workload": dataclasses.asdict(spec), "failed_requests": failures}
    out = out or _default_out("bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(payload, indent=2))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(payload, indent=2))
    from chunkbench.bench import BenchRun
    from chunkbench.harness import RunResult
    from chunkbench.report import comparison_table

    run_view = BenchRun(endpoint, None, summary, RunResult(result.records, [], result.duration, 0))
    console.print(comparison_table([run_view], title=f"{endpoint}, {workload}, {len(requests)} requests"))
    for failure in failures[:10]:
        console.print(f"[red]request {failure['request']} failed:[/] {failure['error']}")
    console.print(f"wrote {out}/summary.json")


kernels_app = typer.Typer(no_args_is_help=True, help="Check and benchmark the Triton attention kernels.")
app.add_typer(kernels_app, name="kernels")


@kernels_app.command("check")
def kernels_check(device: Device = "auto") -> None:
    """Run the kernel correctness cases against the torch reference on this device (CPU: the Triton
    interpreter, fp32/fp16 only; CUDA: also bf16)."""
    import os

    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available here")
    from chunkbench.kernels.check import compare_to_reference, standard_cases

    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.startswith("cuda") else [])
    table = Table("case", "max abs error", "result", title=f"paged_attention vs reference on {device}")
    failed = 0
    for name, case in standard_cases(dtypes):
        try:
            table.add_row(name, f"{compare_to_reference(device=device, **case):.2e}", "[green]ok")
        except AssertionError as exc:
            failed += 1
            table.add_row(name, "-", f"[red]FAIL {str(exc).splitlines()[0][:60]}")
    console.print(table)
    if failed:
        raise typer.Exit(1)


@kernels_app.command("bench")
def kernels_bench(json_out: JsonOut = None) -> None:
    """TFLOP/s and GB/s of paged_attention on prefill chunks (256-4096 tokens over 0-32k context) and decode
    batches, against torch SDPA (and flash-attn when installed), with % of the device's peak. CUDA only."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("kernels bench needs a CUDA device; on the CPU run `chunkbench kernels check`")
    from chunkbench.kernel_bench import run_kernel_bench

    rows = run_kernel_bench()
    table = Table("kind", "shape", "ours ms", "SDPA ms", "flash-attn ms", "ours / SDPA", "TFLOP/s", "GB/s",
                  "% of peak", title=f"paged_attention on {torch.cuda.get_device_name()}, bf16, llama-3-8b heads")
    for r in rows:
        table.add_row(r.kind, r.shape, f"{r.ours_ms:.3f}", f"{r.sdpa_ms:.3f}" if r.sdpa_ms else "-",
                      f"{r.flash_ms:.3f}" if r.flash_ms else "-",
                      f"{r.sdpa_ms / r.ours_ms:.2f}x" if r.sdpa_ms else "-", f"{r.tflops:.1f}", f"{r.gbps:.0f}",
                      f"{r.pct_of_peak:.0f}%" if r.pct_of_peak is not None else "-")
    console.print(table)
    if json_out:
        import dataclasses

        json_out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))


@app.callback()
def _root() -> None:
    """Measure and tune chunked prefill for LLM serving."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=argv, standalone_mode=False)  # returns the code of a typer.Exit
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("chunkbench: interrupted", file=sys.stderr)
        sys.exit(130)
    except TyperException as exc:  # usage errors: unknown flag, bad value type
        print(f"chunkbench: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as exc:
        print(f"chunkbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
