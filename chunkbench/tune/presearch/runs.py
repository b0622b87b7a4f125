"""The calibration runs of `tune --presearch sim` (tune/presearch/server.py): what each is, the warm-up before it,
and the same run again in the simulator, with the figures a fit compares.

The designs separate the cost terms (designs says how): a *prefill* run, a *decode* run, a *mixed* run and a
*workload* run of the tune's own requests, each after an untimed warm-up on its launch (warmup_requests). A burst
is built so that what the client cannot see does not matter: its prompts are all one length, and a *primer*
goes first (Design), so that the burst joins the server's queue together; its figures are counted from its last
send (from_burst_end). Measured: docs/guides/presearch.md and docs/guides/simulator.md ("Server calibration
families").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from chunkbench.backends.sim import SimBackend
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadRequest, WorkloadSpec, build_workload

STAT_PCTS = (50, 90, 99)
TAIL_STATS = ("p90", "p99")  # Design.tails
QUEUE_FLOOR_MS = 50.0  # relative error of a near-zero queue time means nothing: below this, absolute
WORKLOAD_REQUESTS = 32  # the fourth calibration run: at most this many of the tune's own requests
WARMUP_OUTPUT = 8  # tokens out of the warm-up's long request (warmup_requests); its decodes take twice that
PRIMER_LEAD_S = 0.005  # a burst follows its primer by this much: enough for the primer to reach the server first


@dataclass(frozen=True)
class Design:
    """One calibration run. A burst's *primer* goes first, the longest prompt one step of the design's largest
    budget takes (up to 2,048 tokens, one below the context length), with one token out, PRIMER_LEAD_S ahead of
    the burst: the burst reaches the engine while it is busy with the primer and joins the queue behind it
    together (without it, the server's first step catches however many requests have arrived by then). The
    primer's step must outlast the burst's way in (the API server hands requests to its engine one at a time); a
    server fast enough to finish the primer before the burst is sent is told so (`primer_outran_burst`)."""

    name: str
    knobs: dict  # engine keyword arguments on top of the tune's fixed flags
    workload: WorkloadSpec
    # E2EL (first send to last token) is what a run's duration, and so goodput, hangs on: pooled ITL
    # percentiles are mostly the big batches' gaps, a request's end also counts its last, small-batch steps.
    fitted: tuple[str, ...] = ("ttft_ms", "itl_ms", "e2el_ms")
    take: int | None = None  # run the workload's first `take` requests (None: all it builds)
    primer: int = 0  # a burst's primer: a request of this many prompt tokens, one out, PRIMER_LEAD_S ahead
    repeat: bool = False  # a workload of fewer than `take` requests runs again after itself (design_requests)
    # Figures fitted by their TAIL_STATS alone. The prefill run's ITLs are bimodal with a couple of dozen gaps in
    # all: a plain decode step, or a gap behind a budget-sized prefill step (a request that got its first token
    # waits for the prompts behind it). Its mean and median jump between the modes; its p90 and p99 lie in the
    # upper one, the one place a calibration times a full step of first chunks alone (the TTFTs sum them with
    # the client latency). Measured: docs/guides/simulator.md ("Server calibration families").
    tails: tuple[str, ...] = ()


def design_requests(
    workload: dict, take: int | None, primer: int, max_model_len: int, repeat: bool = False
) -> list[WorkloadRequest]:
    """A design's requests (its fields as recorded in a run): the workload, cut, behind its primer. `repeat`: a
    workload of fewer than `take` requests runs again after itself until it has `take` (each copy one mean
    gap after the last arrival of the one before): the same load, with tails of more than a dozen requests (a
    p99 of 12 TTFTs is their maximum)."""
    requests = build_workload(WorkloadSpec(**workload), max_model_len)
    if repeat and take and requests and len(requests) < take:
        last = max(w.arrival_time for w in requests)
        period = last + (last / (len(requests) - 1) if len(requests) > 1 else 1.0)
        requests = [
            dataclasses.replace(w, arrival_time=w.arrival_time + k * period)
            for k in range(-(-take // len(requests)))
            for w in requests
        ]
    requests = requests[:take]
    if not primer:
        return requests
    return [WorkloadRequest(primer, 1, 0.0)] + [
        dataclasses.replace(w, arrival_time=w.arrival_time + PRIMER_LEAD_S) for w in requests
    ]


def designs(spec: TuneSpec, num_requests: int = 8) -> list[Design]:
    """The four calibration runs for this tune: a *prefill* run (long prompts, a few tokens out, arriving
    together: TTFT is a queue of compute-bound prefills -> the compute scale), a *decode* run (short prompts,
    answers of many lengths: a batch that drains from a dozen to one, ITL at every batch size -> bandwidth and
    step overhead), a *mixed* run (prompts of up to three chunks at the space's smallest budget, so chunks share
    steps with decodes) and a *workload* run: the tune's own workload (its first WORKLOAD_REQUESTS requests, at
    their own arrivals, repeated up to that many when it has fewer) at the space's middle budget, so the
    constants also fit the load the trials will run at. In the three designed ones every request arrives at once,
    behind its primer: the schedule then does not hinge on where an arrival falls against a step boundary, so
    the figures move smoothly with the constants (Poisson arrivals make the fit's objective jagged; the workload
    run adds them back, anchored by the three). Budgets come from the search space so the server
    accepts them; only the token budget varies (a --launch template may not pass other knobs through)."""
    budgets = sorted(spec.space.values.get("max_num_batched_tokens", [512]))
    max_len = spec.base_config().scheduler.max_model_len
    big = max([b for b in budgets if b <= 2048] or budgets[:1])
    long_prompt = max(64, min(1024, max_len // 2, big))
    primer = max(long_prompt, min(big, max_len - 1))  # one step of the largest budget, one token out

    def burst(n: int, prompt: str, output: str) -> WorkloadSpec:
        return WorkloadSpec(
            name="synthetic",
            num_requests=n,
            arrival="all-at-once",
            seed=spec.seed,
            prompt_len=prompt,
            output_len=output,
        )

    # The tune's own workload, its first requests at its own arrivals, at the space's middle budget: the load
    # the trials will see (bursts alone fit a per-step overhead that is too high at light load).
    # Built whole, then cut: a synthetic workload of fewer requests would draw other lengths and arrivals.
    # Mixed: prompts of up to three of the smallest budget's chunks, sharing steps with the decodes of the prompts
    # before them; one output length, so the order of the burst cannot matter.
    mixed_prompt = max(16, min(long_prompt, 3 * budgets[0]))
    return [
        Design(
            "prefill",
            {"max_num_batched_tokens": big},
            burst(num_requests, f"fixed:{long_prompt}", "fixed:4"),
            tails=("itl_ms",),
            primer=primer,
        ),
        Design(
            "decode",
            {"max_num_batched_tokens": big},
            burst(num_requests + 4, "fixed:32", "uniform:16:96"),
            primer=primer,
        ),
        Design(
            "mixed",
            {"max_num_batched_tokens": budgets[0]},
            burst(num_requests + 2, f"fixed:{mixed_prompt}", "fixed:32"),
            primer=primer,
        ),
        Design(
            "workload",
            {"max_num_batched_tokens": budgets[len(budgets) // 2]},
            spec.workload,
            take=WORKLOAD_REQUESTS,
            repeat=True,
        ),
    ]


def primer_outran_burst(run: dict) -> bool:
    """The run's primer got its token before its burst's last request was sent: the server was idle when
    the burst came, and its first step may have caught only part of it (the client cannot see which)."""
    sends, ttfts = run.get("send_s") or [], run["ttft_ms"]
    return bool(run.get("primer")) and bool(sends) and bool(ttfts) and ttfts[0] < 1e3 * (max(sends) - sends[0])


def run_figures(result) -> dict:
    """Per-request TTFTs and E2ELs and pooled ITLs (ms; `itl_counts`: each request's share of them, in order) of
    one run, and the server's figures when it had any."""
    done = [r for r in result.requests if r.error is None and r.token_times]
    return {
        "ttft_ms": [1e3 * r.ttft for r in done],
        "itl_ms": [1e3 * g for r in done for g in r.itls],
        "itl_counts": [len(r.itls) for r in done],
        "e2el_ms": [1e3 * r.e2el for r in done],
        "server": dict(result.server or {}),
        "send_s": [r.arrival_time if r.send_time is None else r.send_time for r in result.requests],
    }


def from_burst_end(figures: dict) -> dict:
    """A primed burst's figures (run_figures, every request completed) with the burst's TTFTs and E2ELs counted
    from its last send rather than each request's own; the primer's are its own. The client's sends of a burst
    can spread over tens of milliseconds while the server takes them in one step, and the simulator sends a
    burst at once: from each request's own send the figures would put the client's spread into TTFTs, which a
    fit gives to the client latency."""
    sends = figures["send_s"]
    if len(sends) < 2 or len(sends) != len(figures["ttft_ms"]):
        return figures  # a request failed: which figure is whose is not known
    last = max(sends[1:])
    spread = [0.0] + [1e3 * (last - sent) for sent in sends[1:]]
    return figures | {key: [v - d for v, d in zip(figures[key], spread)] for key in ("ttft_ms", "e2el_ms")}


def warmup_requests(budget: int, max_model_len: int) -> list[WorkloadRequest]:
    """An untimed run before each design on its launch: a budget-sized prompt among a batch of decodes. A fresh
    server's first large steps are slow (on a CPU build, several times their later time): a cost that depends
    on what the server has not run yet, which no step cost describes."""
    prompt = max(1, min(budget, max_model_len - WARMUP_OUTPUT))
    return [WorkloadRequest(prompt, WARMUP_OUTPUT, 0.0)] + [WorkloadRequest(32, 2 * WARMUP_OUTPUT, 0.0)] * 8


def warm_up(serve, config, seed: int, label: str = "warm-up") -> bool:
    """Run warmup_requests for `config`'s budget on a session's server (or simulator), untimed; whether the
    server served every one of them."""
    s = config.scheduler
    result = serve(
        warmup_requests(s.max_num_batched_tokens, s.max_model_len),
        seed=seed,
        warmup_steps=0,
        progress=False,
        label=label,
    )
    return all(r.ok for r in result.requests)


def simulate_design(calibration: ServerCalibration, spec: TuneSpec, run: dict) -> dict:
    """The same run in the simulator under `calibration`, with the server-style figures it can give."""
    result, workload, config = simulate_run(calibration, spec, run)
    return simulated_figures(result, workload, config)


def simulate_run(calibration: ServerCalibration, spec: TuneSpec, run: dict, backend: SimBackend | None = None):
    """(the simulated RunResult, its requests, its engine config) of the same run under `calibration`, on
    `backend` (a SimBackend of that calibration unless given: tune/presearch/linear_trace.py records its steps)."""
    config = spec.base_config(**run["knobs"])
    workload = design_requests(
        run["workload"], run.get("take"), run.get("primer", 0), config.scheduler.max_model_len, run.get("repeat", False)
    )
    if len(run.get("send_s", ())) == len(workload) and run["workload"].get("arrival") != "all-at-once":
        # Simulate the arrivals the server saw (the client's send times), not the ones the workload planned.
        # Not for a burst: its sends spread over a few milliseconds, and which of them the server's steps
        # caught the client cannot see; a burst is simulated as designed (its primer, then the burst at once).
        first = min(run["send_s"])
        workload = sorted(
            (dataclasses.replace(w, arrival_time=t - first) for w, t in zip(workload, run["send_s"])),
            key=lambda w: w.arrival_time,
        )
    with (backend or SimBackend(server_calibration=calibration)).session(config) as serve:
        # what the server ran before it on its launch (server.run_design): a session's cost can depend on
        # it (sim/cpu_linear_cost.py, new token counts)
        if run.get("warmed_up"):
            warm_up(serve, config, spec.seed + 1, f"{run['name']} warm-up")
        for attempt in range(run.get("attempt", 0) + 1):  # measured again after a pause: the kept one is last
            result = serve(workload, seed=spec.seed + 2 * attempt, warmup_steps=0, progress=False, label=run["name"])
    return result, workload, config


def simulated_figures(result, workload: list[WorkloadRequest], config) -> dict:
    """run_figures of a simulated run, and the server's figures as the simulator can give them."""
    figures = run_figures(result)
    delays = [
        1e3 * (r.first_scheduled_time - r.arrival_time) for r in result.requests if r.first_scheduled_time is not None
    ]
    tokens = [s.prefill_tokens + s.decode_tokens for s in result.steps]
    # The client's untimed warm-up (request 0's lengths, alone) is inside the server's counters: count its
    # steps (whole-budget prefill chunks, then one token a step) and tokens here too.
    first = workload[0] if workload else None
    warm_steps = -(-first.prompt_len // config.scheduler.max_num_batched_tokens) + first.output_len - 1 if first else 0
    warm_tokens = first.prompt_len + first.output_len - 1 if first else 0
    figures["server"] = {
        "median_scheduling_delay_ms": float(np.median(delays)) if delays else 0.0,
        "server_mean_step_tokens": (sum(tokens) + warm_tokens) / max(1, len(tokens) + warm_steps),
    }
    return figures


def stats(values: list[float] | np.ndarray) -> dict[str, float]:
    if not len(values):
        return {}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean())} | {f"p{p}": v for p, v in zip(STAT_PCTS, percentiles(array).tolist())}


@functools.lru_cache(maxsize=4096)
def _percentile_plan(n: int) -> tuple[np.ndarray, ...]:
    """numpy's 'linear' percentile for n values: the order statistics below and above each of STAT_PCTS (-1
    past the last), the weight of the one above, its complement, and which interpolate down from above."""
    virtual = (n - 1) * np.true_divide(np.asarray(STAT_PCTS), 100)
    top = virtual >= n - 1
    below = np.where(top, -1, np.floor(virtual)).astype(np.intp)
    above = np.where(top, -1, np.floor(virtual) + 1).astype(np.intp)
    weight = virtual - below
    return below, above, weight, 1 - weight, weight >= 0.5


def percentiles(array: np.ndarray) -> np.ndarray:
    """np.percentile(array, STAT_PCTS), bit for bit (numpy's own index and interpolation arithmetic), at a
    tenth of its cost: a fit takes ~300,000 of them, most of a minute through numpy's general path."""
    below, above, weight, rest, down = _percentile_plan(len(array))
    ordered = np.sort(array)
    low, high = ordered[below], ordered[above]
    step = high - low
    return np.where(down, high - step * rest, low + step * weight)


def relative(simulated: float, measured: float) -> float:
    """log(simulated / measured): the relative error near zero, but symmetric, so 10x too slow does not weigh
    nine times 10x too fast (which would let one bimodal percentile steer the whole fit)."""
    return math.log(max(simulated, 1e-9) / measured)


def targets(measured: dict) -> list[tuple[str, str, float]]:
    """(figure, statistic, measured value) of each statistic a fit compares in one run (of its `tails`, the
    TAIL_STATS alone). A run whose stream paused every time it was measured (server.run_design: `paused`)
    gives its medians only: a pause of a few hundred ms moves the means and tails of a few dozen requests, which
    no step cost should be fitted to."""
    tails = measured.get("tails", ())
    return [
        (key, k, v)
        for key in measured.get("fitted", ("ttft_ms", "itl_ms"))
        for k, v in stats(measured[key]).items()
        if v > 0 and (k == "p50" or not measured.get("paused")) and (key not in tails or k in TAIL_STATS)
    ]


def residuals(measured: dict, simulated: dict, compared: list | None = None) -> tuple[list[float], list[float]]:
    """(TTFT/ITL/E2EL relative errors, server-figure errors) of one run; `compared`: its targets(), when a fit
    has them already."""
    compared = targets(measured) if compared is None else compared
    simulated_stats = {key: stats(simulated[key]) for key in {key for key, _, _ in compared}}
    main = [relative(simulated_stats[key].get(k, 0.0), v) for key, k, v in compared]
    extra = []
    server, sim_server = measured.get("server", {}), simulated.get("server", {})
    if "median_scheduling_delay_ms" in server:
        m = server["median_scheduling_delay_ms"]
        extra.append((sim_server["median_scheduling_delay_ms"] - m) / max(m, QUEUE_FLOOR_MS))
    if server.get("server_mean_step_tokens"):
        m = server["server_mean_step_tokens"]
        extra.append((sim_server["server_mean_step_tokens"] - m) / m)
    return main, extra
