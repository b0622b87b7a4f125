"""A simulated calibration run's schedule, recorded once and priced again under other coefficients of a linear
family (sim/linear_cost.py, sim/cpu_linear_cost.py): the fast objective of the linear fit
(tune/presearch/linear.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from chunkbench.backends.sim import SimBackend
from chunkbench.sim.linear_cost import LinearFamily
from chunkbench.sim.server_calibration import ServerCalibration, jitter_draws
from chunkbench.tune.presearch.runs import simulate_run
from chunkbench.tune.spec import TuneSpec


class Recorder:
    """A cost model that writes down each step's features (its family's) before the real one prices it."""

    def __init__(self, model, family: LinearFamily) -> None:
        self.model, self.family, self.rows = model, family, []
        self.idle_factor = model.idle_factor

    def predict(self, step) -> float:
        self.rows.append(self.family.step_features(step))
        return self.model.predict(step)

    def kv_blocks(self, config) -> int:
        return self.model.kv_blocks(config)

    def activation_bytes(self, step) -> int:
        return self.model.activation_bytes(step)


@dataclass
class RecordingBackend(SimBackend):
    """The simulator of a calibration, step by step (no fast path: every step is priced and recorded)."""

    recorder: Recorder | None = None

    def cost(self, config):
        self.recorder = Recorder(super().cost(config), self.server_calibration.cost_family)
        return self.recorder


@dataclass
class Trace:
    """One simulated run's schedule, for pricing it again under other coefficients (module docstring)."""

    features: np.ndarray  # [steps, the family's step terms]
    release: np.ndarray  # per step: the latest arrival among the requests it admits (-inf: none)
    idle: np.ndarray  # per step: the engine waited for an arrival before it (as recorded)
    token_steps: list[np.ndarray]  # per simulated request: the step of each of its tokens
    arrivals: np.ndarray  # per simulated request (s)
    measured_order: list[int]  # per simulated request: its index among the measured run's requests
    draws: list[np.ndarray]  # per simulated request: its tokens' jitter draws (server_calibration.jitter_draws)
    family: LinearFamily  # whose terms a coefficient vector holds, in its order (LinearFamily.terms)

    def __post_init__(self) -> None:
        """Every request's tokens end to end, so figures() prices them all in a few array operations (a fit
        calls it tens of thousands of times)."""
        lengths = np.array([len(steps) for steps in self.token_steps], dtype=int)
        if np.any(lengths == 0):  # a request the simulator rejected: no TTFT to price (calibration runs fit)
            raise ValueError("a trace's request got no token")
        self._steps = np.concatenate(self.token_steps) if len(lengths) else np.zeros(0, dtype=int)
        self._draws = np.concatenate(self.draws) if len(lengths) else np.zeros(0)
        self._last = np.cumsum(lengths) - 1
        self._first = self._last - lengths + 1
        self._request = np.repeat(np.arange(len(lengths)), lengths)
        self._gap = np.ones(len(self._steps), dtype=bool)  # a token after one of its own request's
        self._gap[self._first] = False
        self._latency, self._jitter = self.family.latency_index, self.family.jitter_index

    def ends(self, c: np.ndarray) -> np.ndarray:
        """Each step's end under coefficients `c` (the family's terms: the step terms, then the client's)."""
        seconds = self.features @ c[: self.features.shape[1]]
        total = np.cumsum(seconds)
        before = np.concatenate(([0.0], total[:-1]))
        return total + np.maximum.accumulate(self.release - before)

    def figures(self, c: np.ndarray) -> dict:
        """TTFT, pooled ITL and E2EL (ms) under coefficients `c`, as run_figures gives them."""
        times = self.ends(c)[self._steps] + c[self._latency]  # when the client would see each token, but for jitter
        jitter = c[self._jitter] if self._jitter is not None else 0.0
        if jitter and len(times):  # server_calibration.jittered, each request's tokens lifted above the one's before
            lift = self._request * (float(np.ptp(times)) + jitter * float(self._draws.max()) + 1.0)
            times = np.maximum.accumulate(times + jitter * self._draws + lift) - lift
        gaps = np.diff(times)[self._gap[1:]]  # tokens of one time are one chunk: no gap (server_calibration.streamed)
        return {
            "ttft_ms": (1e3 * (times[self._first] - self.arrivals)).tolist(),
            "itl_ms": (1e3 * gaps[gaps > 0]).tolist(),
            "e2el_ms": (1e3 * (times[self._last] - self.arrivals)).tolist(),
        }


def trace(spec: TuneSpec, calibration: ServerCalibration, run: dict) -> Trace:
    """Simulate `run` under `calibration` (of a linear family) once, recording its schedule (the jitter left out:
    it moves no step)."""
    family = calibration.cost_family
    if not isinstance(family, LinearFamily):
        raise TypeError(f"a trace prices a linear family's terms, not {family.name}'s")
    if family.jitter_index is not None:
        calibration = dataclasses.replace(
            calibration, coefficients=(calibration.coefficients or {}) | {family.terms[family.jitter_index]: 0.0}
        )
    backend = RecordingBackend(server_calibration=calibration, fast_forward=False)
    result, workload, _ = simulate_run(calibration, spec, run, backend)
    rows = backend.recorder.rows[-len(result.steps) :] if result.steps else []  # the run's (after its warm-up)
    if not len(rows) == len(result.steps) == len(result.step_requests):
        raise RuntimeError(f"recorded {len(rows)} steps' features for {len(result.steps)} steps")
    starts = np.array([s.start for s in result.steps])
    seconds = np.array([s.seconds for s in result.steps])
    ends = starts + seconds
    tolerance = 0.25 * float(seconds.min()) if len(seconds) else 0.0
    # A step cannot start before the requests it admits arrived: priced faster than recorded, it waits for them.
    arrivals = np.array([r.arrival_time for r in result.requests])
    release, seen = np.full(len(starts), -np.inf), set()
    for step, (ids, _) in enumerate(result.step_requests):
        for i in set(ids) - seen:
            release[step] = max(release[step], arrivals[i])
        seen.update(ids)
    idle = starts > np.concatenate(([-np.inf], ends[:-1])) + tolerance  # the engine waited for an arrival
    release = np.where(idle, np.maximum(release, starts), release)
    latency = calibration.coefficients.get("latency_s", 0.0)  # delayed() added it to the token times
    token_steps = [np.searchsorted(ends, np.asarray(r.token_times) - latency - tolerance) for r in result.requests]
    sends = run.get("send_s", ())
    order = list(range(len(workload)))
    if len(sends) == len(workload) and run["workload"].get("arrival") != "all-at-once":  # as simulate_run sorts
        order = sorted(order, key=lambda i: sends[i])
    session = family.session_features(backend.recorder.rows, calibration.coefficients or {})
    draws = [jitter_draws(len(steps), seed) for seed, steps in enumerate(token_steps)]  # as delayed() draws them
    return Trace(session[len(session) - len(rows) :], release, idle, token_steps, arrivals, order, draws, family)
