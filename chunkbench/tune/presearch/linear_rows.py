"""What the linear fit (tune/presearch/linear.py) reads off a run's measured figures against the schedule it
recorded (tune/presearch/linear_trace.py): the per-request rows its start point is fitted on, and the stall period.

Start point: non-negative least squares over per-request sums of step features, in relative error: each
request's decode span (E2EL - TTFT: the steps after its first token up to its last) and its TTFT (the steps
from the engine's last start after idling up to its first token, plus the client latency; the jitter is left
to the descent), and its mean lone decode step (decode_rows). The stall period (sim/cpu_linear_cost.py,
`stall_every`): from the decode run's slow gaps (stall_period).
"""

from __future__ import annotations

import numpy as np

from chunkbench.sim.cpu_linear_cost import NEW_STEP
from chunkbench.sim.linear_cost import SEQUENCES
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.presearch.linear_trace import Trace, trace
from chunkbench.tune.spec import TuneSpec

STALL_RATIO = 1.4  # stall_period: a decode gap this many times the decode run's median is a stalled step
MAX_STALL_PERIOD = 30  # stall_period: a decode run's longest request stalled in fewer gaps: none modelled
MIN_STALL_GAPS = 20  # stall_period: a longest request with fewer gaps tells nothing
MIN_DECODE_GAPS = 5  # decode_rows: a request with fewer lone decode gaps gives no row
BUNCHED = 0.2  # decode_rows: a gap below this share of the run's median is tokens sent together


def request_rows(t: Trace, run: dict) -> tuple[list[np.ndarray], list[float]]:
    """Per request, (summed features, measured seconds) of its decode span and of its TTFT (module docstring).
    A burst's TTFTs are matched by rank (its requests are alike: which one the server took first the client
    cannot see); spans and a run at its own arrivals by request."""
    rows, targets = [], []
    n = len(t.token_steps)
    if len(run["ttft_ms"]) != n or len(run["e2el_ms"]) != n:  # a request failed: no request-by-request match
        return rows, targets
    span_row, ttft_row = t.family.client_row(False), t.family.client_row(True)
    # the step features summed over steps, and the client latency (in a TTFT once, in a decode span never)
    cumulative = np.vstack([np.zeros(t.features.shape[1]), np.cumsum(t.features, axis=0)])
    releases = np.flatnonzero(t.idle)
    burst = run["workload"].get("arrival") == "all-at-once"
    ttft_rank = np.argsort(np.argsort([s[0] for s in t.token_steps], kind="stable"), kind="stable")
    measured_ttft = sorted(run["ttft_ms"]) if burst else None
    for j, steps in enumerate(t.token_steps):
        i = t.measured_order[j]
        span = 1e-3 * (run["e2el_ms"][i] - run["ttft_ms"][i])
        if len(steps) > 1 and span > 0:
            rows.append(np.append(cumulative[steps[-1] + 1] - cumulative[steps[0] + 1], span_row))
            targets.append(span)
        first = steps[0]
        k = releases[np.searchsorted(releases, first, side="right") - 1]
        ttft = 1e-3 * (measured_ttft[ttft_rank[j]] if burst else run["ttft_ms"][i])
        target = ttft + t.arrivals[j] - t.release[k]
        if target > 0:
            rows.append(np.append(cumulative[first + 1] - cumulative[k], ttft_row))
            targets.append(target)
    decode, seconds = decode_rows(t, run)
    return rows + decode, targets + seconds


def request_gaps(t: Trace, run: dict) -> list[np.ndarray | None]:
    """Per simulated request, its measured gaps (ms, in order) where it got one per simulated token, else None:
    a stream the server merged (vLLM sends the tokens a stream has not sent yet as one chunk) has fewer gaps,
    and which tokens went together the client cannot see. Split by the run's per-request `itl_counts`; a run
    recorded without them (an older file) only when no request merged, when the pooled count says where each
    request's gaps begin."""
    lengths = {t.measured_order[j]: len(steps) for j, steps in enumerate(t.token_steps)}
    counts = run.get("itl_counts") or [lengths[i] - 1 for i in range(len(lengths))]
    if len(counts) != len(lengths) or sum(counts) != len(run["itl_ms"]):
        return [None] * len(lengths)  # a request failed, or a run without counts merged somewhere
    gaps, offsets = np.asarray(run["itl_ms"]), np.concatenate(([0], np.cumsum(counts)))
    return [
        gaps[offsets[i] : offsets[i + 1]] if counts[i] == lengths[i] - 1 else None
        for i in (t.measured_order[j] for j in range(len(t.token_steps)))
    ]


def decode_rows(t: Trace, run: dict) -> tuple[list[np.ndarray], list[float]]:
    """Per request, its mean decode step: the mean features of the decode-only steps that each made one of its
    gaps alone, against the mean of those gaps measured, unusual steps left out on both sides (a gap STALL_RATIO
    times the run's median; a step of the family's `unusual` columns, such as a stall). What pins the fixed step
    against the per-sequence term: the TTFT and span rows sum many steps of many batch sizes. A request whose
    stream merged gives none (request_gaps)."""
    if not run["itl_ms"]:
        return [], []
    median = 1e-3 * float(np.median(run["itl_ms"]))
    # below BUNCHED of the median: tokens the server sent together after a pause, not a step
    slow, bunched = STALL_RATIO * median, BUNCHED * median
    rows, targets = [], []
    unusual, span_row = t.family.unusual, t.family.client_row(False)
    for steps, measured in zip(t.token_steps, request_gaps(t, run)):
        if measured is None:
            continue
        own = 1e-3 * measured
        keep = [
            k
            for k in range(1, len(steps))
            if steps[k] == steps[k - 1] + 1
            and bunched < own[k - 1] < slow
            and not t.features[steps[k], 1]  # a prefill step
            and not any(t.features[steps[k], u] for u in unusual)
        ]
        if len(keep) >= MIN_DECODE_GAPS:
            rows.append(np.append(t.features[[steps[k] for k in keep]].mean(axis=0), span_row))
            targets.append(float(np.mean([own[k - 1] for k in keep])))
    return rows, targets


def direct_estimate(traces: list[Trace], runs: list[dict]) -> np.ndarray | None:
    """Non-negative least squares of the per-request rows, each weighted by 1/its measured seconds."""
    from scipy.optimize import nnls

    rows, targets, terms = [], [], len(traces[0].family.terms)
    for t, run in zip(traces, runs):
        r, y = request_rows(t, run)
        rows += r
        targets += y
    if len(rows) < terms:
        return None
    x, y = np.asarray(rows), np.asarray(targets)
    usable = (y > 0) & np.isfinite(y) & np.all(np.isfinite(x), axis=1)
    x, y = x[usable], y[usable]
    if len(y) < terms:
        return None
    x, scale = x / y[:, None], np.abs(x / y[:, None]).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients, _ = nnls(x / scale, np.ones(len(y)), maxiter=50 * x.shape[1])
    return coefficients / scale


def stall_period(runs: list[dict], spec: TuneSpec, first: ServerCalibration) -> int:
    """How many sequences stepped between stalls (sim/cpu_linear_cost.py, `stall_s`), from the decode run's
    longest request whose stream did not merge (request_gaps): after its first token it took (nearly) every step
    of the run, each a decode of a batch that only shrinks (a dozen to one), so a gap STALL_RATIO times its
    median or more is a stall; the steps' sequences come from the run simulated under `first` (of the
    linear-cpu family). 0 (none) below one stalled gap in MAX_STALL_PERIOD."""
    run = next((r for r in runs if r["name"] == "decode"), None)
    if run is None:
        return 0
    t = trace(spec, first, run)
    known = [
        (len(steps), j, gaps)
        for j, (steps, gaps) in enumerate(zip(t.token_steps, request_gaps(t, run)))
        if gaps is not None and len(gaps) >= MIN_STALL_GAPS
    ]
    if not known:  # every long stream merged, or a request failed
        return 0
    _, j, gaps = max(known, key=lambda k: k[:2])  # the longest whose stream did not merge
    steps = t.token_steps[j]
    # a gap ending at a step of a batch size new to the session is slow for that reason (`new_step_s`)
    slow = (gaps >= STALL_RATIO * np.median(gaps)) & (t.features[steps[1:], NEW_STEP] == 0)
    stalled = int(np.sum(slow))
    if stalled < len(gaps) / MAX_STALL_PERIOD or not stalled:
        return 0
    return max(1, int(round(t.features[steps[0] + 1 : steps[-1] + 1, SEQUENCES].sum() / stalled)))
