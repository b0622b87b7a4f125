"""Arrival times of a workload's requests: Poisson, gamma (vLLM's burstiness), constant, all at once, or
`vllm bench serve`'s own schedule reproduced draw for draw; and the check that a real-clock run is not asked to
wait for days."""

from __future__ import annotations

import warnings

import numpy as np

from chunkbench.errors import UserError, check_number

ARRIVALS = ("poisson", "gamma", "constant", "all-at-once", "vllm")
MAX_SPAN_S = 1e9  # arrivals within ~30 years: float64 seconds keep microseconds
MAX_REAL_WAIT_S = 7 * 86400  # on a real clock (the engine, a server) the arrivals are waited for: a week at most


def arrival_span(requests: list) -> float:
    """Seconds from the run's start to its last arrival (of workload.WorkloadRequest-like requests)."""
    return max((r.arrival_time for r in requests), default=0.0)


def check_real_time(requests: list, where: str) -> None:
    """Refuse a workload whose arrivals would keep a real-clock run waiting for more than MAX_REAL_WAIT_S."""
    span = arrival_span(requests)
    if span > MAX_REAL_WAIT_S:
        raise UserError(
            f"the workload's arrivals span {span:,.0f} s ({span / 86400:,.1f} days) of waiting on {where}; "
            f"at most {MAX_REAL_WAIT_S // 86400} days: raise --rate, lower --time-scale, or simulate it "
            "(--backend sim)"
        )


RAMP_UPS = ("linear", "exponential")


def check_ramp(strategy: str | None, start: float | None, end: float | None) -> None:
    """vllm bench serve's --ramp-up-* rules (0.32 and 0.34 alike: main_async's "Validate ramp-up arguments",
    then get_request's assert that every request's rate is > 0): whole numbers of requests/s, both given,
    0 <= start <= end, and a start above 0 (exponential: by main_async; linear: its first request's rate would
    be 0). Without a strategy vLLM ignores the start and end: so does chunkbench, and says so."""
    if strategy is None:
        if start is not None or end is not None:
            warnings.warn(
                "--ramp-up-start-rps and --ramp-up-end-rps are ignored without --ramp-up-strategy "
                "(as vllm bench serve ignores them)",
                stacklevel=3,
            )
        return
    if strategy not in RAMP_UPS:
        raise UserError(f"--ramp-up-strategy must be one of {', '.join(RAMP_UPS)}, got '{strategy}'")
    if start is None or end is None:
        raise UserError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
    check_number("--ramp-up-start-rps", start, low=0, integer=True)
    check_number("--ramp-up-end-rps", end, low=0, integer=True)
    if start > end:
        raise UserError(
            f"--ramp-up-start-rps ({start:g}) must be at most --ramp-up-end-rps ({end:g}): a ramp-up rises, as "
            "vllm bench serve requires"
        )
    if start == 0:
        raise UserError(
            f"--ramp-up-start-rps must be at least 1 with --ramp-up-strategy {strategy}: the first request's "
            "rate would be 0 requests/s (vllm bench serve refuses it too)"
        )


def ramp_rates(strategy: str, start: float, end: float, n: int) -> np.ndarray:
    """Request i's rate under vLLM's --ramp-up-strategy: from `start` to `end` req/s over the n requests,
    linearly or geometrically in the request's index (0.32's _get_current_request_rate)."""
    progress = np.arange(n) / max(n - 1, 1)
    if strategy == "linear":
        return start + (end - start) * progress
    if strategy == "exponential":
        return start * (end / start) ** progress
    raise UserError(f"--ramp-up-strategy must be one of {', '.join(RAMP_UPS)}, got '{strategy}'")


def vllm_arrivals(
    n: int, rate: float, burstiness: float, seed: int, ramp: tuple[str, float, float] | None = None
) -> np.ndarray:
    """The send times of `vllm bench serve --request-rate RATE --burstiness B --seed SEED` (0.32's get_request):
    after np.random.seed(seed), one gamma gap per request (shape B, scale 1/(rate B); the first request waits
    its gap too), summed, then rescaled so the last is due at n / rate. With `ramp` (strategy, start, end:
    --ramp-up-*) each request's gap is drawn at its own rate (ramp_rates) and nothing is rescaled. A
    RandomState of its own draws the stream np.random's global one would, without touching it."""
    if n == 0:
        return np.zeros(0)
    rates = ramp_rates(*ramp, n) if ramp else np.full(n, rate)
    if not ramp and rate == float("inf"):
        return np.zeros(n)
    if burstiness == float("inf"):
        due = np.cumsum(1.0 / rates)
    else:
        state = np.random.RandomState(seed)
        due = np.cumsum([state.gamma(shape=burstiness, scale=1.0 / (r * burstiness)) for r in rates])  # as vLLM
    if not ramp and due[-1] != 0:
        due = due * ((n / rate) / due[-1])
    return due


def sample_arrivals(
    kind: str,
    n: int,
    rate: float,
    burstiness: float,
    rng: np.random.Generator,
    seed: int = 0,
    ramp: tuple[str, float, float] | None = None,
) -> np.ndarray:
    """Arrival times (s). gamma follows vLLM's shape: shape = burstiness, mean gap = 1/rate; burstiness 1 =
    poisson. vllm: vLLM's own schedule for `seed` (vllm_arrivals), the other kinds draw from `rng`. `ramp`
    (strategy, start, end): the rate rises (or falls) over the requests instead of staying at `rate`."""
    if kind == "all-at-once" or (rate == float("inf") and not ramp):  # vLLM's --request-rate inf: every gap 0
        return np.zeros(n)
    if rate <= 0:
        raise UserError(f"--rate must be > 0 requests/s, got {rate}")
    if kind == "vllm":
        if burstiness <= 0:
            raise UserError(f"--burstiness must be > 0, got {burstiness}")
        return vllm_arrivals(n, rate, burstiness, seed, ramp)
    rates = ramp_rates(*ramp, n) if ramp else np.full(n, rate)
    if kind == "constant":
        gaps = 1.0 / rates
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rates)
    elif kind == "gamma":
        if burstiness <= 0:
            raise UserError(f"--burstiness must be > 0, got {burstiness}")
        # inf: the gaps' spread vanishes (vLLM's get_request takes them constant)
        gaps = 1.0 / rates if burstiness == float("inf") else rng.gamma(burstiness, 1.0 / (rates * burstiness))
    else:
        raise UserError(f"--arrival must be one of {', '.join(ARRIVALS)} or trace, got '{kind}'")
    gaps[0] = 0.0  # the first request opens the run
    return np.cumsum(gaps)
