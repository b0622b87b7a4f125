"""A step cost that is linear in what the scheduler put in the step: the `linear` family of a server
calibration (sim/server_calibration.py, fitted by tune/calibrate_linear.py). No torch.

Why a second family: on a CPU server the roofline's shape is wrong. vLLM 0.32's CPU engine on the tier's tiny
Llama (fp32, eager, in-process) took 2.62/3.99/9.92/56.38 ms to prefill 16/128/512/2000 tokens and
1.72/2.14/3.34/4.82 ms to decode batches of 1/8/32/64: ~1.7 ms fixed per step, ~0.7 ms more for a step that
carries a prefill chunk, ~11 us per token, ~16 ns per causal attention pair and ~40-50 us per decode sequence.
The roofline has no prefill-step term and its compute/bandwidth split cannot make a 1.7 ms floor and a 11 us
token at once; fitted to that server it found 4.5 us of step overhead and 263 us per sequence (22% error). A
sum of per-step, per-token, per-pair and per-sequence terms, each >= 0, takes that shape directly. (Served, the
same build is slower: `vllm serve` binds torch to one of the two cores and keeps the other for itself, so the
fitted terms describe the server, not the in-process engine.)

A step's seconds = sum of STEP_COEFFICIENTS[k] * feature k:

- `step_s`: every step (scheduling, the forward's fixed launches, sampling, the output's IPC);
- `prefill_step_s`: a step with at least one prefill chunk (its input preparation and attention metadata);
- `token_s`: per token computed (the GEMMs' rows);
- `pair_s`: per causal (query, key) pair of the prefill chunks (StepShape.prefill_attention_pairs);
- `seq_s`: per sequence in the step (per-request input preparation, detokenizing and streaming its token);
- `key_s`: per key the decodes read (StepShape.decode_keys);
- `stall_s`: a step takes this much longer each time the session's count of sequences stepped passes a
  multiple of `stall_every`: the server's periodic work, paced by how much it does (Python's collector runs
  every so many allocations). On the tier's vLLM, decode steps of a burst (a dozen sequences down to one)
  stalled ~2 ms once in ~9 steps, the same step for every request, at irregular intervals (7, 9, 2, 4, 14, 3,
  17, 10 steps), its pooled ITL p90 and p99 1.5x and 1.8x the median; a light load's (two or three sequences a
  step) stalled too rarely to reach its p90. Deterministic, so a simulated run stays repeatable.
- `new_step_s`: a step whose number of tokens the session has not run before takes this much longer. vLLM
  0.32's CPU linear layers run oneDNN matmuls, and oneDNN builds (JIT-compiles) a primitive for each row count
  it meets, then keeps it for the process. `scripts/vllm_step_costs.py` on the tier's tiny Llama as the tier
  serves it (TCMalloc preloaded; 2026-12-04), median steps of 40 and of 20 lengths never run, then the same
  again: ~100 tokens 4.1/4.4 ms against 2.0/2.7; ~700 11.0/14.4 against 9.7/10.3; ~1,400 22.9/25.0 against
  19.5/20.3: 1.3-4.7 ms more, not growing with the step (on glibc's malloc it did: ~1,400 tokens 58.0 against
  26.4). The second pass ran each length again after 39 others had pushed it out of vLLM's own 32-entry cache
  of primitives, and cost what a hit does (oneDNN's process-wide cache still had it), so a session remembers
  its counts for good. A decode-heavy run meets each batch size once; a run whose steps mix decodes with a
  chunk's remainder meets new counts all along.

- `fresh_pair_s`: per attention pair of a step beyond the most that any of the FRESH_WINDOW steps before it
  computed. vLLM 0.32's CPU attention holds a prefill's scores, ~(query tokens)^2 x heads x 4 bytes, in memory
  it takes for the step; in between, the decodes' small allocations take the freed memory, so a large
  prefill after a run of small steps takes memory new to the process, and on these machines (a virtual
  machine, which backs a page when it is first touched) that costs ~3 ms a MB. Logged inside the tier's server
  (`scripts/vllm_step_log.py`, 2026-12-04), the calibration's workload run after its warm-up: a step of a
  727-token prompt among two decodes took 24-36 ms with 1,000-1,900 minor page faults and 17-44 ms of system
  time, where it took 7-13 ms without; a 428-token step faulted 716 pages (2.80 MiB; 428^2 x 4 heads x 4 bytes
  is 2.80 MiB), a 284-token one 290 (1.13 MiB; 1.23). Faults came and went over passes of the same requests on
  one launch (the process's memory still growing, ~25 MB over the first two) with TCMalloc, with TCMalloc releasing
  nothing (TCMALLOC_RELEASE_RATE=0), without prefix caching, and as system time with glibc's malloc on huge
  pages. A step after a larger one in the window (the prefill run's steps, back to back) pays nothing more; the
  window is a round number between what the log showed (a 547-token step 110 steps after the 729-token one
  faulted 33 pages; a 284-token step 532 steps after the 547-token one faulted 290).
  Refitting nine calibrations of that day with it: the workload run's error fell in eight (16.4 -> 13.1%,
  16.5 -> 9.1%, 20.1 -> 13.7%), and eight of nine met a presearch's bounds against five.
- `first_pair_s`: per causal pair of a step's first chunks (chunks with no context before them) beyond the
  most that any of the FIRST_WINDOW steps before it had. The scores a prompt's first chunk holds are what take
  new memory; a later chunk of the same prompt does not (vLLM 0.32's CPU attention over a context takes another
  path). Logged inside the tier's server (`scripts/vllm_step_log.py`, the held-out run of 2026-12-05): first
  chunks of 511-512 tokens after decode steps faulted 128-1,280 pages and took 8-24 ms, without faults 5.5-6.0
  ms; the chunks after them (290-508 tokens at contexts of 492-512) faulted 0-10 pages in nine of fourteen and
  took 5.5-15.1 ms, median 7.9. In that launch's mixed run the primer's chunks of 256 at contexts of 768-1,792
  took 3.9-4.7 ms: pairs against a context cost ~2 ns where `pair_s` alone, fitted on all pairs, had taken 14-30
  ns to make up the first chunks' faults. Faults came back after a few decode steps (17 steps after a 512-token
  chunk that faulted 2,475 pages, the same chunk faulted 1,172), so the window is short: 5, the one tried (in
  place of `fresh_pair_s` the fit kept it at 5 in all eleven calibrations below, and dropped it at 20 in all
  eleven and at 100 in ten).
  Refitting the eleven calibrations kept from 2026-12-04/05 with it beside `fresh_pair_s`: 4.8-24.1% over the
  runs (ten within 15%, against seven) and 5.4-20.4% on the workload run (ten within 15%, against nine), the
  fitted `pair_s` 5-20 ns; the held-out workload within 15% on all three figures in four either way
  (docs/measurements.md, "First chunks").

And one term outside the steps, `latency_s`: every token reaches the client this long after its step ends
(the server's request and response path: HTTP, input processing, the engine core's IPC, detokenizing and
streaming). It moves TTFT and E2EL, never an ITL: on the tier's vLLM (2 cores, the engine's torch thread bound to
one, the API server, engine core and client sharing the other) the decode burst's TTFTs were 7.6 ms and a light
workload's median TTFT 9.5 ms above what the fitted steps alone gave. The simulator adds it to each request's
token times (server_calibration.delayed), after the schedule, which it does not change.

And `jitter_s`, the mean of an exponential delay each token takes on that path on top of `latency_s`, its
stream keeping its order (a token delayed holds back the ones behind it, which then arrive together): the API
server, the engine core's Python and the client share one core, so a token's way out waits for whichever of
them holds it. On the tier's vLLM the light workload's ITLs had p10/p50/p90 of 1.05/1.52/2.84 ms, 1.3% of its
gaps under 0.3 ms (tokens sent together), while its decode steps are alike; without a spread the simulator's
p90 ITL came out 36% low. Refitting the tier's runs of 2026-12-04 (the primer fixed) with it, the fit found
1.18 ms and went from 12.1% to 7.6% over the runs and from 18.4% to 12.1% on the workload run (another set:
1.46 ms, 11.1% -> 8.0%, 15.7% -> 9.8%). The draws are seeded by the request's place in its run, so a simulated
run stays repeatable (`jitter_draws`, `jittered`). Tokens that arrive together are one chunk, one ITL
(server_calibration.streamed), as vLLM's server merges the outputs a stream has not sent yet: the tier's held-out
run of 2026-12-05 streamed 2,800 tokens in 2,624 chunks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.sim.shape import StepShape

STEP_COEFFICIENTS = ("step_s", "prefill_step_s", "token_s", "pair_s", "seq_s", "key_s", "stall_s", "new_step_s",
                     "fresh_pair_s", "first_pair_s")
COEFFICIENTS = STEP_COEFFICIENTS + ("latency_s", "jitter_s")
# 0 when a file lacks them
OPTIONAL = ("stall_s", "latency_s", "stall_every", "new_step_s", "jitter_s", "fresh_pair_s", "first_pair_s")
LATENCY, JITTER = COEFFICIENTS.index("latency_s"), COEFFICIENTS.index("jitter_s")
STALL, SEQUENCES, TOKENS, PAIRS = (STEP_COEFFICIENTS.index(k) for k in ("stall_s", "seq_s", "token_s", "pair_s"))
NEW_STEP, FRESH_PAIRS = STEP_COEFFICIENTS.index("new_step_s"), STEP_COEFFICIENTS.index("fresh_pair_s")
FIRST_PAIRS = STEP_COEFFICIENTS.index("first_pair_s")
# set by the step's place in its session (session_features)
SESSION_FEATURES = (STALL, NEW_STEP, FRESH_PAIRS, FIRST_PAIRS)
FRESH_WINDOW = 100  # fresh_pair_s: a step's attention pairs beyond the most of this many steps before it
FIRST_WINDOW = 5  # first_pair_s: a step's first chunks' pairs beyond the most of this many steps before it


def step_features(step: StepShape) -> tuple[float, ...]:
    """The features STEP_COEFFICIENTS multiply, in their order; SESSION_FEATURES depend on the steps before it
    in the session, which LinearStepCost remembers and session_features sets: 0 here, but for FIRST_PAIRS, which
    holds the step's first-chunk pairs (first_chunk_pairs) for session_features to turn into those beyond the
    window."""
    sequences = len(step.prefills) + len(step.decodes)
    return (1.0, float(bool(step.prefills)), float(step.num_tokens), float(step.prefill_attention_pairs),
            float(sequences), float(step.decode_keys), 0.0, 0.0, 0.0, first_chunk_pairs(step))


def first_chunk_pairs(step: StepShape) -> float:
    """The causal pairs of the step's chunks that have no context before them (a prompt's first chunk)."""
    return float(sum(q * (q + 1) // 2 for q, ctx in step.prefills if ctx == 0))


def stalls(sequences, every: int):
    """Which of a session's steps, with these many sequences each (in order), stall."""
    done = np.cumsum(sequences)
    return (done // every > (done - np.asarray(sequences)) // every) if every else np.zeros(len(done), dtype=bool)


def new_counts(tokens) -> np.ndarray:
    """Which of a session's steps, with these many tokens each (in order), run a count no step before them ran."""
    _, first = np.unique(np.asarray(tokens), return_index=True)
    new = np.zeros(len(tokens), dtype=bool)
    new[first] = True
    return new


def fresh_pairs(pairs, window: int = FRESH_WINDOW) -> np.ndarray:
    """A session's steps' attention pairs (in order) beyond the most any of the `window` steps before each
    computed."""
    pairs = np.asarray(pairs, dtype=float)
    padded = np.concatenate((np.zeros(window), pairs))
    recent = np.lib.stride_tricks.sliding_window_view(padded[:-1], window).max(axis=1) if len(pairs) else pairs
    return np.maximum(pairs - recent, 0.0)


def beyond_recent(recent: deque, pairs: float) -> float:
    """fresh_pairs for the next step of a session: its `pairs` beyond the most in `recent` (the window's steps,
    a deque of the window's length), which then remembers them."""
    extra = max(pairs - max(recent, default=0.0), 0.0)
    recent.append(pairs)
    return extra


def session_features(features: np.ndarray, stall_every: int) -> np.ndarray:
    """A session's step features (rows of step_features, in order) with SESSION_FEATURES filled in."""
    features = np.array(features, dtype=float)
    features[:, STALL] = stalls(features[:, SEQUENCES].astype(int), stall_every)
    features[:, NEW_STEP] = new_counts(features[:, TOKENS])
    features[:, FRESH_PAIRS] = fresh_pairs(features[:, PAIRS])
    features[:, FIRST_PAIRS] = fresh_pairs(features[:, FIRST_PAIRS], FIRST_WINDOW)
    return features


def jitter_draws(tokens: int, seed: int) -> np.ndarray:
    """The unit exponential draws of a stream's `tokens` tokens, the stream's `seed`-th in its run."""
    return np.random.default_rng(seed).exponential(size=tokens)


def jittered(times, jitter_s: float, draws: np.ndarray) -> np.ndarray:
    """A stream's token times (s, in order) as its client sees them with the output path's jitter (module
    docstring, `jitter_s`): each delayed by jitter_s times its draw (jitter_draws), none before the one ahead."""
    times = np.asarray(times, dtype=float)
    return np.maximum.accumulate(times + jitter_s * draws) if jitter_s and len(times) else times


def check_coefficients(coefficients: dict, where: str) -> dict:
    """The coefficients, COEFFICIENTS and `stall_every` (a whole number of steps, 0: no stall); a missing,
    negative or non-finite one is refused (it would predict a negative or NaN step time). OPTIONAL ones may be
    missing (0)."""
    try:
        values = {name: float(coefficients[name] if name not in OPTIONAL else coefficients.get(name, 0.0))
                  for name in COEFFICIENTS + ("stall_every",)}
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{where}: a linear calibration needs the coefficients {', '.join(COEFFICIENTS)}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values.values()) or values["stall_every"] % 1:
        raise UserError(f"{where}: linear coefficients must be finite and >= 0 (stall_every a whole number), "
                        f"got {coefficients}")
    return values | {"stall_every": int(values["stall_every"])}


@dataclass(frozen=True)
class LinearStepCost:
    """The CostModel protocol of sim/shape.py over STEP_COEFFICIENTS. Memory questions (KV blocks, activation
    peaks) go to `memory`, the reference roofline, as they did before this family existed."""

    coefficients: tuple[float, ...]  # STEP_COEFFICIENTS
    memory: object  # a RooflineCostModel on the calibration's reference device
    label: str = ""
    stall_every: int = 0
    idle_factor: float = 1.0  # measured request latencies cannot separate a cold step from a slow one
    # Sequences stepped so far (a session's cost model prices its steps in order; --step-time-target's
    # candidate steps would count too, a chunkbench-only knob that a vLLM calibration never searches).
    _stepped: list = field(default_factory=lambda: [0], compare=False, repr=False)
    _counts: set = field(default_factory=set, compare=False, repr=False)  # the token counts it has run
    _recent: deque = field(default_factory=lambda: deque(maxlen=FRESH_WINDOW), compare=False, repr=False)  # pairs
    _first: deque = field(default_factory=lambda: deque(maxlen=FIRST_WINDOW), compare=False, repr=False)

    def _session(self, sequences: int, tokens: int, pairs: float = 0.0, first: float = 0.0) -> float:
        """The SESSION_FEATURES' seconds of the next step of the session, which it then remembers."""
        before = self._stepped[0]
        self._stepped[0] = before + sequences
        every, seconds = self.stall_every, 0.0
        if every and (before + sequences) // every > before // every:
            seconds += self.coefficients[STALL]
        if tokens not in self._counts:
            self._counts.add(tokens)
            seconds += self.coefficients[NEW_STEP]
        return (seconds + self.coefficients[FRESH_PAIRS] * beyond_recent(self._recent, pairs)
                + self.coefficients[FIRST_PAIRS] * beyond_recent(self._first, first))

    def predict(self, step: StepShape) -> float:
        features = step_features(step)  # its session features (from FRESH_PAIRS on) are _session's to price
        return (math.fsum(c * f for c, f in zip(self.coefficients[:FRESH_PAIRS], features[:FRESH_PAIRS]))
                + self._session(len(step.prefills) + len(step.decodes), step.num_tokens, features[PAIRS],
                                features[FIRST_PAIRS]))

    def decode_step_cost(self, batch: int) -> Callable[[int], float]:
        """predict() of a decode-only step of `batch` decodes as a function of the keys it reads, bit for bit
        (the fast path, sim/fastforward.py)."""
        step_s, _, token_s, pair_s, seq_s, key_s = self.coefficients[:6]
        fixed = (step_s * 1.0, 0.0, token_s * float(batch), pair_s * 0.0, seq_s * float(batch))
        return lambda keys: math.fsum(fixed + (key_s * float(keys),)) + self._session(batch, batch)

    def rows_activation_bytes(self, rows: int, sampled: int) -> int:
        return self.memory.rows_activation_bytes(rows, sampled)

    def activation_bytes(self, step: StepShape) -> int:
        return self.memory.activation_bytes(step)

    def kv_blocks(self, config: EngineConfig) -> int:
        return self.memory.kv_blocks(config)

    def __str__(self) -> str:
        return self.label or "linear step cost"


def linear_text(coefficients: dict) -> str:
    """The coefficients in words, for labels and reports."""
    c = {k: float(coefficients.get(k, 0.0)) for k in COEFFICIENTS}
    return (f"{c['step_s'] * 1e3:.3g} ms per step + {c['prefill_step_s'] * 1e3:.3g} ms per prefill step + "
            f"{c['token_s'] * 1e6:.3g} us per token + {c['pair_s'] * 1e9:.3g} ns per attention pair + "
            f"{c['seq_s'] * 1e6:.3g} us per sequence + {c['key_s'] * 1e9:.3g} ns per decode key"
            + (f" + {c['stall_s'] * 1e3:.3g} ms every {int(coefficients['stall_every'])} sequences stepped"
               if coefficients.get("stall_every") else "")
            + (f" + {c['new_step_s'] * 1e3:.3g} ms at a token count new to the server" if c["new_step_s"] else "")
            + (f" + {c['fresh_pair_s'] * 1e9:.3g} ns per attention pair beyond the last {FRESH_WINDOW} steps' most"
               if c["fresh_pair_s"] else "")
            + (f" + {c['first_pair_s'] * 1e9:.3g} ns per first-chunk pair beyond the last {FIRST_WINDOW} steps' most"
               if c["first_pair_s"] else "")
            + f"; {c['latency_s'] * 1e3:.3g} ms to the client"
            + (f" (+ {c['jitter_s'] * 1e3:.3g} ms jitter on average)" if c["jitter_s"] else ""))
