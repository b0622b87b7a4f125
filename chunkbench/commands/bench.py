"""The steps of `chunkbench bench` (declared in serve.py): check its options, read vllm bench serve's flags,
choose the vLLM release whose client rules the run measures by (bench/client_rules.py), run the workload
against the server, print the result, and write --save-result and --plot-timeline.

Each step takes the command's options as one namespace (`args`): bench's own (commands/bench_options.py's
BENCH_OPTIONS) by name, and the workload's and vllm bench serve's other flags as `args.options`."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from chunkbench.bench.timeline import parse_thresholds, write_timeline
from chunkbench.commands.bench_options import SAMPLING_OPTIONS
from chunkbench.commands.common import clip_shown, console, default_out, load_workload, save_json
from chunkbench.commands.options import WORKLOAD_OPTIONS, pick
from chunkbench.commands.vllm_flags import dataset_workload, server_url
from chunkbench.errors import UserError, check_number
from chunkbench.files import check_writable

SAMPLING = tuple(SAMPLING_OPTIONS)  # the sampling flags given are sent, in this order


def run_bench(args: SimpleNamespace) -> None:
    """`chunkbench bench`: every option is checked before the first request, then the server is measured and
    the result printed and written."""
    from chunkbench.bench.slo import parse_goodput
    from chunkbench.bench.vllm_result import parse_percentiles

    sampling, headers = check_client_options(args)
    check_writable(args.out, "--out", folder=True)
    check_writable(args.json_out, "--json")
    metrics, percentiles = parse_percentiles(args.percentile_metrics, args.metric_percentiles)
    thresholds = parse_thresholds(args.timeline_itl_thresholds)
    slos = parse_goodput(args.goodput)
    endpoint, api, served_model, options = resolve_vllm_flags(args)
    spec, requests = read_workload(args, options)  # a bad dataset file is said before the server is asked
    backend = connect(args, endpoint, api, served_model, sampling, headers)
    timing = choose_timing(args, backend)
    requests, run = measure(args, backend, endpoint, requests, slos)
    out, failures = save_outputs(args, run, spec, endpoint, timing.record())
    title = f"{endpoint}, {spec.name}, {len(requests)} requests"
    print_result(run, title, failures, args.probe_request_rate, out)
    path = None
    if args.save_result:
        path = write_vllm_result(args, run, spec, api, backend.model, bool(slos), metrics, percentiles)
    if args.plot_timeline:
        where = path.with_suffix(".timeline.html") if args.save_result else out / "timeline.html"
        write_timeline(run.result.requests, where, thresholds, title)
        console.print(f"wrote {where}")


def check_client_options(args: SimpleNamespace) -> tuple[dict, dict[str, str]]:
    """Check the client's options; return the sampling parameters given (sent with every request) and the
    --header values by name."""
    from chunkbench.bench.openai_stream import APIS

    if args.max_concurrency is not None:
        check_number("--max-concurrency", args.max_concurrency, low=1)
    if args.vocab_size is not None:
        check_number("--vocab-size", args.vocab_size, low=2)
    if args.num_warmups < 0:  # vllm bench serve's range(num_warmups): none
        console.print(f"[yellow]warning:[/] --num-warmups {args.num_warmups}: no warm-ups, as in vllm bench serve")
        args.num_warmups = 0
    args.probe_request_rate = probe_rate(args.probe_request_rate)
    if args.vllm_version is not None:
        from chunkbench.bench.client_rules import known_version

        known_version(args.vllm_version)
    if args.api not in APIS:  # checked again once vLLM's --backend or --endpoint path has chosen it
        raise UserError(f"--api must be {' or '.join(APIS)}, got '{args.api}'")
    check_number("--request-timeout", args.request_timeout, low=0, low_open=True)
    sampling = {name: getattr(args, name) for name in SAMPLING if getattr(args, name) is not None}
    for name, value in sampling.items():  # finite, before any request (JSON has no NaN; the server judges ranges)
        check_number("--" + name.replace("_", "-"), value)
    return sampling, parse_headers(args.header)


def probe_rate(rate: float) -> float:
    """--probe-request-rate as vllm bench serve's benchmark takes it: a rate that is not > 0 (NaN too) sends no
    probes, inf sends them back to back (each after the last one's end, with no pause)."""
    if rate > 0:
        return rate
    if rate != 0:
        console.print(
            f"[yellow]warning:[/] --probe-request-rate {rate}: no probes (vllm bench serve sends them only at a "
            "rate above 0)"
        )
    return 0.0


def parse_headers(items: list[str] | None) -> dict[str, str]:
    """--header NAME:VALUE (or vllm bench serve's KEY=VALUE) values as a dict (names and values stripped). A
    header's name holds neither ':' nor '=', so the first of them ends it."""
    headers = {}
    for item in items or []:
        name, sep, value = re.split(r"([:=])", item, maxsplit=1) if re.search(r"[:=]", item) else (item, "", "")
        if not sep or not name.strip():
            raise UserError(f"--header must be NAME:VALUE or NAME=VALUE, got '{item}'")
        headers[name.strip()] = value.strip()
    return headers


def resolve_vllm_flags(args: SimpleNamespace) -> tuple[str, str, str | None, dict]:
    """vllm bench serve's names for the server, API, model and dataset read into chunkbench's: (the /v1 base URL,
    the API, the model to send, the workload options). Synthetic arrivals default to vLLM's own schedule."""
    options = args.options
    endpoint, api = server_url(
        args.endpoint, options["base_url"], options["host"], options["port"], options["vllm_backend"], args.api
    )
    served_model = options["served_model_name"] or args.served_model
    if options["dataset_name"] is not None:
        options["workload"] = dataset_workload(options["dataset_name"], options["dataset_path"])
    self_timed = not options["no_self_timed"]
    options = pick(options, WORKLOAD_OPTIONS)
    if options["arrival"] is None and not (self_timed and has_timestamps(options["workload"])):
        options["arrival"] = "vllm"  # vllm bench serve's schedule for the same --rate, --burstiness, --seed
    return endpoint, api, served_model, options


def has_timestamps(workload: str) -> bool:
    """Whether the workload brings its own arrival times (chunkbench/workloads/named.py's table)."""
    from chunkbench.workloads.named import has_timestamps as brings_them

    return brings_them(workload)


def connect(
    args: SimpleNamespace, endpoint: str, api: str, served_model: str | None, sampling: dict, headers: dict[str, str]
):
    """The server as a backend (its model, vocabulary and context length read from it where not given)."""
    from chunkbench.backends.endpoint import EndpointBackend

    return EndpointBackend.connect(
        endpoint,
        served_model,
        args.vocab_size,
        args.options["tokenizer"],
        max_concurrency=args.max_concurrency,
        api=api,
        api_key=args.api_key,
        headers=headers,
        timeout_s=args.request_timeout,
        num_warmups=args.num_warmups,
        sampling=sampling,
        probe_rate=args.probe_request_rate,
    )


def choose_timing(args: SimpleNamespace, backend):
    """The vLLM release whose client rules the run measures by (--vllm-version, else the server's /version),
    given to the client and said."""
    from chunkbench.bench.client_rules import choose_timing as choose

    timing = choose(backend.endpoint, args.vllm_version)
    backend.client_options["rules"] = timing.rules
    console.print(timing.line())
    return timing


def read_workload(args: SimpleNamespace, options: dict):
    """The workload's spec and requests, not yet fit to a context length (the server's may set it). A bad
    --dataset-path file is named by vllm bench serve's flag, as given."""
    try:
        return load_workload(None, seed=args.seed, **options)
    except UserError as exc:
        if args.options["dataset_name"] is None:
            raise
        raise UserError(re.sub(r"^--workload(?: [a-z_]+)?", "--dataset-path", str(exc), count=1)) from None


def measure(args: SimpleNamespace, backend, endpoint: str, requests: list, slos):
    """Fit the prompts to --max-model-len, else the server's, else 8192, and run them against the server: (the
    requests, the run)."""
    from chunkbench.bench.runs import run_benchmark

    requests = clip_shown(requests, args.max_model_len or backend.max_model_len or 8192)
    run = run_benchmark(
        None, requests, backend=backend, label=endpoint, goodput_ms=slos, seed=args.seed, progress=False, warmup_steps=0
    )
    return requests, run


def save_outputs(args: SimpleNamespace, run, spec, endpoint: str, timing: dict) -> tuple[Path, list[dict]]:
    """Write summary.json and requests.parquet (with the failed requests and their errors) in --out, and --json;
    return the folder and the failures. `timing`: the vLLM version measured as, and where it came from."""
    from chunkbench.bench.runs import save_run

    failures = [{"request": i, "error": r.error} for i, r in enumerate(run.result.requests) if r.error]
    out = args.out or default_out("bench")
    payload = save_run(run, out, spec, endpoint=endpoint, failed_requests=failures, **timing)
    save_json(args.json_out, payload)
    return out, failures


def print_result(run, title: str, failures: list[dict], probe_request_rate: float, out: Path) -> None:
    """Print the metrics table, the first failures, the probes' figures (with --probe-request-rate) and what
    was written."""
    from chunkbench.bench.report import comparison_table

    console.print(comparison_table([run], title=title))
    for failure in failures[:10]:
        console.print(f"[red]request {failure['request']} failed:[/] {failure['error']}")
    if probe_request_rate:
        s = run.summary
        console.print(
            f"probes: {s['probe_completed']} completed, {s['probe_failed']} failed"
            + (
                f"; E2EL median {s['probe_median_e2el_ms']:,.1f} ms, p99 {s['probe_p99_e2el_ms']:,.1f} ms, "
                f"max {s['probe_max_e2el_ms']:,.1f} ms"
                if s["probe_completed"]
                else ""
            )
        )
    console.print(f"wrote {out}/summary.json, requests.parquet")


def write_vllm_result(
    args: SimpleNamespace, run, spec, api: str, model: str, goodput: bool, metrics, percentiles
) -> Path:
    """--save-result: the result in vllm bench serve's keys and layout; return its path. Timed workloads (a
    trace, all at once, multi-turn) and --request-rate inf report vLLM's request rate of inf."""
    import math

    from chunkbench.bench.vllm_result import result_path, save_vllm_result, vllm_result

    timed = spec.arrival in (None, "trace", "all-at-once") or spec.name == "multi-turn" or math.isinf(spec.rate)
    result = vllm_result(
        run.summary,
        run.result.requests,
        api=api,
        model_id=model,
        tokenizer_id=spec.tokenizer or model,
        label=args.label,
        request_rate="inf" if timed else spec.rate,
        burstiness=spec.burstiness,
        max_concurrency=args.max_concurrency,
        goodput=goodput,
        metrics=metrics,
        percentiles=percentiles,
        detailed=args.save_detailed,
    )
    path = result_path(args.result_dir, args.result_filename, result)
    save_vllm_result(result, path)
    console.print(f"wrote {path} (vllm bench serve --save-result's layout)")
    return path
