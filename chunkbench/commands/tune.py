"""`chunkbench tune`: search the scheduler knobs against SLAs. Its options are declared in groups in
tune_options.py; the steps below read them by name."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import typer

from chunkbench import servers
from chunkbench.backends.choice import resolve
from chunkbench.backends.launched import launch_command, launch_values
from chunkbench.bench.client_rules import known_version
from chunkbench.commands.common import announce, console
from chunkbench.commands.options import SLA_OPTIONS, Model, pick, with_options
from chunkbench.commands.tune_options import (
    TUNE_BACKEND_OPTIONS,
    TUNE_ENGINE_OPTIONS,
    TUNE_LAUNCH_OPTIONS,
    TUNE_SEARCH_OPTIONS,
    TUNE_WORKLOAD_OPTIONS,
)
from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError, check_number
from chunkbench.files import check_writable
from chunkbench.launch.node import Slot, plan_slots, varies_by_slot
from chunkbench.launch.template import check_endpoint, check_launch, placeholders
from chunkbench.launch.versions import launched_target
from chunkbench.tune.objectives import resolve as resolve_objective
from chunkbench.workloads.arrivals import MAX_REAL_WAIT_S


@with_options(SLA_OPTIONS)
@with_options(TUNE_WORKLOAD_OPTIONS)
@with_options(TUNE_ENGINE_OPTIONS)
@with_options(TUNE_LAUNCH_OPTIONS)
@with_options(TUNE_BACKEND_OPTIONS)
@with_options(TUNE_SEARCH_OPTIONS)
def tune(model: Model = "llama-3-8b", **options) -> None:
    """Search token budget, chunk caps, progressive chunk schedules and seats against SLAs; write the best
    config for chunkbench, vLLM and SGLang, trials.csv, plots and report.html."""
    args = SimpleNamespace(model=model, options=options, **options)  # the options by name: the steps read them
    run_tune(args)


def run_tune(args: SimpleNamespace) -> None:
    """Every option is checked, the workload built and the backend resolved before anything is written or
    launched; then the study runs (--presearch sim: calibrate, search in simulation, verify)."""
    from chunkbench.tune.run import study_folder, tune_and_report
    from chunkbench.tune.spec import TuneSpec, default_study_name
    from chunkbench.tune.verify import VERIFY_REPEATS

    slos = check_options(args)
    search_space, spec_workload, given = workload_spec(args)
    overrides = {
        k: v
        for k, v in dict(
            max_model_len=args.max_model_len,
            num_blocks=args.num_blocks,
            seed=args.seed,
            tensor_parallel_size=args.tensor_parallel_size,
            kv_cache_dtype=args.kv_cache_dtype,
        ).items()
        if v is not None
    }
    config = EngineConfig.create(args.model, **overrides)  # the fixed flags, validated
    resolved, search_space, versions = tune_backend(args, config, search_space)
    spec = TuneSpec(
        model=args.model,
        slos=slos,
        space=search_space,
        workload=spec_workload,
        backend=resolved.backend,
        objective=args.objective,
        n_trials=args.n_trials,
        timeout_s=args.timeout,
        seed=args.seed,
        max_sched_delay_ms=args.max_sched_delay,
        probe_seconds=args.probe_seconds,
        engine_overrides=overrides,
        versions=versions,
    )
    check_workload(spec_workload, search_space, given)
    name = args.study or default_study_name(spec)
    out, progress, repeats = args.out or study_folder(name), not args.no_progress, args.verify_repeats or VERIFY_REPEATS
    command = "chunkbench " + " ".join(sys.argv[1:])
    if args.presearch == "sim":
        from chunkbench.tune.presearch.search import presearch_tune

        check_number("--verify-top", args.verify_top, low=1)
        presearch_tune(
            spec,
            name,
            args.storage,
            out,
            args.verify_top,
            resolved.backend,
            args.calibration,
            device=args.gpu or "cpu",
            progress=progress,
            command=command,
            repeats=repeats,
        )
        return
    relaunch = resolved.backend.relaunched
    tune_and_report(
        spec,
        name,
        args.storage,
        out,
        args.verify_top if resolved.verify or relaunch else 0,
        progress=progress,
        command=command,
        jobs=args.jobs,
        backend_note=resolved.note,
        repeats=repeats,
    )


def check_options(args: SimpleNamespace) -> list:
    """The SLAs; the options checked, each refused in one line before anything starts. Sets the objective
    (auto resolved: tune/objectives/registry.py) and --probe-request-rate's default with --sla-probe."""
    from chunkbench.bench.slo import parse_slas

    slos = parse_slas(
        {
            "ttft": args.sla_ttft,
            "tbt": args.sla_tbt,
            "tpot": args.sla_tpot,
            "e2el": args.sla_e2el,
            "probe": args.sla_probe,
        },
        args.sla_percentile,
    )
    check_number("--probe-request-rate", args.probe_request_rate, low=0)
    if args.sla_probe and not args.probe_request_rate:
        args.probe_request_rate = DEFAULT_PROBE_RATE
    args.objective = resolve_objective(args.objective, bool(slos)).name
    check_number("--n-trials", args.n_trials, low=1)
    check_number("--jobs", args.jobs, low=1)
    check_number("--verify-top", args.verify_top, low=0)
    if args.verify_repeats is not None:
        check_number("--verify-repeats", args.verify_repeats, low=1, integer=True)
        if args.backend != "launch" or args.verify_top == 0:
            raise UserError("--verify-repeats counts the re-measurement runs of --backend launch (--verify-top >= 1)")
    check_number("--max-sched-delay", args.max_sched_delay, low=0, low_open=True)
    if args.probe_seconds is not None:
        check_number("--probe-seconds", args.probe_seconds, low=0, low_open=True, high=MAX_REAL_WAIT_S)
    check_number("--launch-timeout", args.launch_timeout, low=0, low_open=True)
    if args.presearch not in ("none", "sim"):
        raise UserError(f"--presearch must be none or sim, got '{args.presearch}'")
    if args.presearch == "sim" and args.backend != "launch":
        raise UserError("--presearch sim calibrates on launched servers: it needs --backend launch")
    if args.calibration is not None and args.presearch != "sim":
        raise UserError("--calibration is the server calibration of --presearch sim")
    if args.timeout is not None:
        check_number("--timeout", args.timeout, low=0, low_open=True)
    check_writable(args.out, "--out", folder=True)
    return slos


def workload_spec(args: SimpleNamespace):
    """The search space and the workload: the space file's [workload], overridden by the flags given (a flag
    left at its default keeps the file's value); also the flags given, for check_workload."""
    from chunkbench.tune.space import SearchSpace
    from chunkbench.workloads.spec import WorkloadSpec

    search_space = SearchSpace.load(args.space)
    given = dict(
        name=args.workload,
        rate=args.rate,
        num_requests=args.num_requests,
        seed=args.seed,
        probe_request_rate=args.probe_request_rate or None,
    )
    given |= {k: v for k, v in pick(args.options, TUNE_WORKLOAD_OPTIONS).items() if v != TUNE_WORKLOAD_OPTIONS[k][1]}
    spec_workload = WorkloadSpec(**{**search_space.workload, **{k: v for k, v in given.items() if v is not None}})
    return search_space, spec_workload, given


def tune_backend(args: SimpleNamespace, config: EngineConfig, search_space):
    """The backend the trials run on (announced), and the search space for it: --backend launch places its
    servers in slots, checks the template's placeholders, and a vLLM server gets the knobs vLLM has."""
    node = plan_slots(args.slots, args.port_base, args.gpus, args.gpus_per_trial, args.cpus, args.cpus_per_trial)
    endpoint = args.endpoint
    if args.backend == "launch":
        endpoint = launch_slots(args.launch, endpoint, args.jobs, node, config)
    elif any(v is not None for v in (args.slots, args.gpus, args.cpus)):
        raise UserError("--slots, --gpus and --cpus place launched servers: they need --backend launch")
    resolved = announce(
        resolve(
            args.backend,
            args.model,
            gpu=args.gpu,
            cost_model=args.cost_model,
            search=True,
            launch=args.launch,
            endpoint=endpoint,
            launch_timeout_s=args.launch_timeout,
            config=config,
            engine_overhead=args.engine_overhead,
        )
    )
    asked = known_version(args.vllm_version) if args.vllm_version is not None else None  # as bench checks it
    versions = {"vllm": servers.get("vllm").target(asked)}  # what the emitted vllm.yaml targets
    if not resolved.backend.relaunched:
        search_space, note = search_space.for_server(servers.get("vllm"), versions["vllm"], launched=False)
    else:
        kind, version, how = launched_target(args.launch, asked)
        versions |= {kind.name: version} if kind else {}
        backend = replace(resolved.backend, slot=node[0], node=tuple(node), versions=versions)
        resolved = replace(resolved, backend=backend)
        launch_command(args.launch, config, versions=versions)  # placeholders checked before anything starts
        if len(node) > 1:
            console.print(f"{len(node)} slots: " + "; ".join(map(str, node)), soft_wrap=True)
        console.print(f"launching {kind.label(version) if kind else 'a server'}: {how}", soft_wrap=True)
        search_space, note = search_space.for_server(kind, version) if kind else (search_space, None)
    if note:
        console.print(f"[yellow]{note}[/]", soft_wrap=True)
    return resolved, search_space, versions


def check_workload(spec_workload, search_space, given: dict) -> None:
    """A bad workload fails here, before anything is written; its message names the flag, and the space file
    where the value came from there instead."""
    from chunkbench.workloads.spec import build_workload

    try:
        build_workload(spec_workload)
    except UserError as exc:
        from_file = [
            k for k in search_space.workload if given.get(k) is None and f"--{k.replace('_', '-')}" in str(exc)
        ]
        raise (
            UserError(f"{exc} (set by [workload] {', '.join(from_file)} in --space {search_space.source})")
            if from_file
            else exc
        ) from None


DEFAULT_PROBE_RATE = 2.0  # --sla-probe without --probe-request-rate: probes per second (vLLM's docs' example)


def launch_slots(launch: str | None, endpoint: str | None, jobs: int, node: list, config: EngineConfig) -> str:
    """The endpoint of --backend launch (its default where --launch has {port}), after refusing what cannot
    work, before anything is launched: --jobs (trials of launched servers run in --slots), a template or an
    endpoint that does not form for every slot, one fixed port for several slots."""
    if jobs > 1:
        raise UserError("--jobs runs simulated trials in processes; launched servers run in --slots N")
    if not launch:
        raise UserError('--backend launch needs --launch COMMAND, e.g. "vllm serve {model} {vllm_flags} --port {port}"')
    check_launch(launch, config, node, launch_values(config) | Slot().values())
    if endpoint is None:
        if "port" not in placeholders("--launch", launch):
            raise UserError(
                "--backend launch needs --endpoint URL, the launched server's OpenAI base URL (or a {port} in "
                "--launch: the endpoint is then http://127.0.0.1:{port}/v1)"
            )
        endpoint = "http://127.0.0.1:{port}/v1"
    check_endpoint(endpoint, node)
    if len(node) > 1:
        for flag, text in (("--launch", launch), ("--endpoint", endpoint)):
            if not varies_by_slot(text):
                raise UserError(
                    f"{flag} names one fixed port, and {len(node)} slots would launch on it: put "
                    "{port} where the port goes (slot i gets --port-base + i)"
                )
    return endpoint


def register(app: typer.Typer) -> None:
    app.command()(tune)
