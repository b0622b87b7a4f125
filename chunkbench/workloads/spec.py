"""Workloads: seeded, reproducible lists of requests (prompt length, output length, arrival time).

WorkloadSpec says what to draw; build_workload takes the source's token counts (chunkbench/workloads/named.py:
named workloads, synthetic distributions, real traces, vLLM's datasets, users' files), gives them arrival
times, shared prefixes and probes, and checks the result.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import numpy as np

from chunkbench.engine.limits import longest_prompt, prompt_fits
from chunkbench.errors import UserError, check_number
from chunkbench.workloads import vllm_datasets as datasets
from chunkbench.workloads.arrivals import MAX_SPAN_S, arrival_span, check_ramp, sample_arrivals
from chunkbench.workloads.named import NAMED, find  # noqa: F401  (NAMED: the named workloads, for --help)
from chunkbench.workloads.user_files import MAX_TOKENS

MAX_REQUESTS = 10**7  # requests in a workload: beyond is a mistake (1.2e12 asked numpy for 8.8 TiB of lengths)


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_len: int
    output_len: int
    arrival_time: float  # seconds from the start of the run
    # The prompt starts with these segments (key, tokens): equal keys give equal tokens across requests, so
    # shared system prompts and conversation histories hit the prefix cache. The rest is the request's own.
    shared: tuple[tuple[int, int], ...] = ()
    probe: bool = False  # a one-token probe beside the load (--probe-request-rate), reported apart


# ---------- the one entry point ----------


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that defines a workload; the same spec and seed give the same requests."""

    name: str = "chat"  # a named workload, "synthetic", or a file path
    num_requests: int | None = 100
    duration: float | None = None  # seconds of arrivals to keep
    rate: float = 1.0  # requests/s; inf: all at once (every arrival 0), as vLLM's --request-rate inf
    arrival: str | None = None  # None: the trace's timestamps when it has them, else poisson
    burstiness: float = 1.0
    time_scale: float = 1.0  # trace timestamps are multiplied by this
    prompt_len: str = "lognormal:256:0.8:4:4096"  # synthetic only
    output_len: str = "lognormal:128:0.6:4:1024"  # synthetic only
    tokenizer: str | None = None
    prefix_len: int = 0  # tokens of shared prefix put before every prompt (as vLLM's random dataset)
    num_prefixes: int = 1  # distinct shared prefixes, assigned round-robin
    seed: int = 0
    # Trace and file workloads (CSV/JSONL/ShareGPT, named traces): False (the default) takes the first
    # num_requests rows in file order (a ShareGPT file: conversation order), so a trace keeps its real
    # arrivals; True takes them in an order shuffled by `seed` first, as vLLM's dataset loaders do by default
    # (ShareGPT), and a timestamped trace's rows taken are put back in time order.
    shuffle: bool = False
    # vLLM's --ramp-up-*: the arrival rate goes from start to end req/s over the requests (linear or exponential
    # in the request's index) instead of staying at `rate`.
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    probe_request_rate: float = 0.0  # one-token probes per second beside the load (add_probes)
    # vllm bench serve's dataset options (workloads/vllm_datasets.py), with vLLM's defaults.
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    custom_output_len: int = 256  # -1: each line's output_tokens
    hf_subset: str | None = None
    hf_split: str = "train"
    hf_output_len: int | None = None  # None: the answer column's tokens
    timed_trace_chunk_hash_size: int = 16
    timed_trace_label_timestamp: str = "timestamp"
    timed_trace_label_input_length: str = "input_length"
    timed_trace_label_output_length: str = "output_length"
    timed_trace_label_hash_ids: str = "hash_ids"

    @property
    def ramp(self) -> tuple[str, float, float] | None:
        return (self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps) if self.ramp_up_strategy else None

    def validate(self) -> None:
        """Every number checked (build_workload does, before any work): finite (NaN passes `<= 0`), in
        range, whole where counted."""
        if self.num_requests is not None:
            check_number("--num-requests", self.num_requests, low=1, high=MAX_REQUESTS, integer=True)
        if self.duration is not None:
            check_number("--duration", self.duration, low=0, low_open=True)
        if self.rate != float("inf"):  # inf: every request at once, vllm bench serve's default
            check_number("--rate", self.rate, low=0, low_open=True)
        if self.burstiness != float("inf"):  # inf: constant gaps, as vLLM's get_request takes it
            check_number("--burstiness", self.burstiness, low=0, low_open=True)
        check_number("--time-scale", self.time_scale, low=0, low_open=True)
        check_number("--prefix-len", self.prefix_len, low=0, high=MAX_TOKENS, integer=True)
        check_number("--num-prefixes", self.num_prefixes, low=1, integer=True)
        check_number("--seed", self.seed, low=0, high=2**32 - 1, integer=True)
        check_ramp(self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)
        check_number("--probe-request-rate", self.probe_request_rate, low=0)
        datasets.validate(self)
        defaults = {f.name: f.default for f in fields(self)}
        for name in ("prompt_len", "output_len"):
            if self.name != "synthetic" and getattr(self, name) != defaults[name]:
                flag = "--" + name.replace("_", "-")
                raise UserError(
                    f"{flag} shapes synthetic workloads; workload '{self.name}' has its own lengths: "
                    f"add --workload synthetic, or leave {flag} out"
                )


def build_workload(spec: WorkloadSpec, max_model_len: int | None = None) -> list[WorkloadRequest]:
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    n = spec.num_requests or 1000
    source = find(spec.name)
    drawn = source.draw(spec, n, rng)
    prompts, outputs, shared = drawn.prompts, drawn.outputs, drawn.shared
    arrivals = drawn.arrivals if source.own_arrivals or spec.arrival in (None, "trace") else None
    n = len(prompts)
    if arrivals is None:
        if spec.arrival == "trace":
            raise UserError(f"--arrival trace: workload '{spec.name}' has no timestamps")
        arrivals = sample_arrivals(spec.arrival or "poisson", n, spec.rate, spec.burstiness, rng, spec.seed, spec.ramp)
    shared = shared or [()] * len(prompts)
    requests = [
        WorkloadRequest(int(p), int(o), float(a), sh) for p, o, a, sh in zip(prompts, outputs, arrivals, shared)
    ]
    if spec.prefix_len:  # a shared prefix before each prompt, round-robin over the prefixes
        requests = [
            WorkloadRequest(
                r.prompt_len + spec.prefix_len,
                r.output_len,
                r.arrival_time,
                ((2_000_000 + i % spec.num_prefixes, spec.prefix_len),) + r.shared,
            )
            for i, r in enumerate(requests)
        ]
    if spec.duration is not None:
        requests = [r for r in requests if r.arrival_time <= spec.duration]
    span = arrival_span(requests)
    if span > MAX_SPAN_S:
        raise UserError(
            f"the workload's arrivals span {span:.3g} s; at most {MAX_SPAN_S:.0e} s (times are seconds in "
            "floating point: far beyond, latencies are lost in rounding): raise --rate or lower "
            "--time-scale"
        )
    if max_model_len is not None:
        requests = clip_to_model(requests, max_model_len)
    return add_probes(requests, spec.probe_request_rate)


PROBE_PROMPT = 2  # vLLM's probe prompt "Hi": its token and a BOS


def add_probes(requests: list[WorkloadRequest], rate: float) -> list[WorkloadRequest]:
    """One-token probes (PROBE_PROMPT tokens in, one out) every 1/rate s from the first arrival to the last,
    merged in time order. vllm bench serve sends its probes one at a time, each after the last one's end and a
    pause of 1/rate (the client does so for `bench`); here, for the engine, the simulator and a tune's
    launched servers, they are due on a fixed clock: at a probe E2EL well under 1/rate, nearly the same count."""
    if not rate or not requests:
        return requests
    span = max(r.arrival_time for r in requests)
    if span * rate >= MAX_REQUESTS:  # 1e20/s asked Python for a list of 1e20 probes
        raise UserError(
            f"--probe-request-rate {rate:g}: {span:.3g} s of arrivals would hold {span * rate:.3g} probes, at most "
            f"{MAX_REQUESTS:.0e}: lower it"
        )
    probes = [WorkloadRequest(PROBE_PROMPT, 1, k / rate, probe=True) for k in range(int(span * rate) + 1)]
    return sorted(requests + probes, key=lambda r: r.arrival_time)


def clip_to_model(requests: list[WorkloadRequest], max_model_len: int) -> list[WorkloadRequest]:
    """Shorten requests longer than max_model_len (prompt first kept, then output), warning how many."""
    clipped = []
    for r in requests:
        if prompt_fits(r.prompt_len, max_model_len, max_tokens=r.output_len):
            prompt = min(r.prompt_len, longest_prompt(max_model_len, max_tokens=1))
            shared, room = [], prompt  # keep the shared segments that still fit
            for key, length in r.shared:
                shared.append((key, min(length, room)))
                room -= shared[-1][1]
            r = WorkloadRequest(
                prompt,
                min(r.output_len, max_model_len - prompt),
                r.arrival_time,
                tuple(seg for seg in shared if seg[1] > 0),
            )
        clipped.append(r)
    count = sum(a != b for a, b in zip(requests, clipped))
    if count:
        warnings.warn(
            f"{count} of {len(requests)} requests were clipped to max_model_len ({max_model_len})", stacklevel=2
        )
    return clipped
