"""Arrival times of a workload's requests: Poisson, gamma (vLLM's burstiness), constant, all at once, or
`vllm bench serve`'s own schedule reproduced draw for draw; and the check that a real-clock run is not asked to
wait for days."""

from __future__ import annotations

import numpy as np

from chunkbench.errors import UserError

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
        raise UserError(f"the workload's arrivals span {span:,.0f} s ({span / 86400:,.1f} days) of waiting on {where}; "
                        f"at most {MAX_REAL_WAIT_S // 86400} days: raise --rate, lower --time-scale, or simulate it "
                        "(--backend sim)")


def vllm_arrivals(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """The send times of `vllm bench serve --request-rate RATE --burstiness B --seed SEED` (0.32's get_request,
    no ramp-up): after np.random.seed(seed), one gamma gap per request (shape B, scale 1/(rate B); the first
    request waits its gap too), summed, then rescaled so the last is due at n / rate. A RandomState of its own
    draws the stream np.random's global one would, without touching it."""
    if n == 0:
        return np.zeros(0)
    if rate == float("inf"):
        return np.zeros(n)
    if burstiness == float("inf"):
        due = np.cumsum(np.full(n, 1.0 / rate))
    else:
        state = np.random.RandomState(seed)
        theta = 1.0 / (rate * burstiness)
        due = np.cumsum([state.gamma(shape=burstiness, scale=theta) for _ in range(n)])  # one draw each, as vLLM
    if due[-1] != 0:
        due = due * ((n / rate) / due[-1])
    return due


def sample_arrivals(kind: str, n: int, rate: float, burstiness: float, rng: np.random.Generator,
                    seed: int = 0) -> np.ndarray:
    """Arrival times (s). gamma follows vLLM's shape: shape = burstiness, mean gap = 1/rate; burstiness 1 =
    poisson. vllm: vLLM's own schedule for `seed` (vllm_arrivals), the other kinds draw from `rng`."""
    if kind == "all-at-once":
        return np.zeros(n)
    if rate <= 0:
        raise UserError(f"--rate must be > 0 requests/s, got {rate}")
    if kind == "vllm":
        if burstiness <= 0:
            raise UserError(f"--burstiness must be > 0, got {burstiness}")
        return vllm_arrivals(n, rate, burstiness, seed)
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif kind == "gamma":
        if burstiness <= 0:
            raise UserError(f"--burstiness must be > 0, got {burstiness}")
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    else:
        raise UserError(f"--arrival must be one of {', '.join(ARRIVALS)} or trace, got '{kind}'")
    gaps[0] = 0.0  # the first request opens the run
    return np.cumsum(gaps)
