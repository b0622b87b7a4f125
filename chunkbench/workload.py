"""Workloads: seeded, reproducible lists of requests (prompt length, output length, arrival time).

Synthetic ones draw lengths and arrivals from distributions; named ones are presets of those or real traces
shipped in chunkbench/data; user files are CSV/JSONL with token counts, or ShareGPT JSON.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from chunkbench import vllm_datasets as datasets
from chunkbench.arrivals import MAX_SPAN_S, RAMP_UPS, arrival_span, sample_arrivals
from chunkbench.errors import UserError, check_number
from chunkbench.lengths import sample_lengths
from chunkbench.workload_files import MAX_TOKENS, read_sharegpt, read_token_file

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



# ---------- named workloads ----------

NAMED = {
    "chat": "short chat prompts (lognormal, median 256 tokens) and answers (median 128)",
    "long-doc": "long documents, 8k-32k-token prompts, 256-token answers",
    "rag-mix": "9 chats in 10 (median 200 tokens) with a 2k-6k-token document prompt among them",
    "azure-conv": "Azure LLM conversation trace (Splitwise, 2023), real arrivals",
    "azure-code": "Azure LLM coding trace (Splitwise, 2023), real arrivals",
    "arxiv-summarization": "arXiv summarization token counts (long prompts), Poisson arrivals at --rate",
    "multi-turn": "4-turn chats: each turn's prompt is the whole conversation so far plus a new message",
}
MULTI_TURN_TURNS, MULTI_TURN_GAP_S = 4, 5.0  # turns per conversation; seconds between a conversation's turns
TRACE_FILES = {"azure-conv": "splitwise_conv.csv", "azure-code": "splitwise_code.csv",
               "arxiv-summarization": "arxiv_summarization.csv"}


def _named_lengths(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if name == "chat":
        return sample_lengths("lognormal:256:0.8:4:4096", n, rng), sample_lengths("lognormal:128:0.6:4:1024", n, rng)
    if name == "long-doc":
        return sample_lengths("uniform:8192:32768", n, rng), sample_lengths("fixed:256", n, rng)
    # rag-mix: every 10th request (from a seeded offset) is a long document.
    prompts = sample_lengths("lognormal:200:0.6:16:1024", n, rng)
    outputs = sample_lengths("lognormal:128:0.5:16:512", n, rng)
    docs = np.arange(n) % 10 == rng.integers(10)
    prompts[docs] = rng.integers(2048, 6145, docs.sum())
    return prompts, outputs


def _multi_turn(n: int, rate: float, rng: np.random.Generator) -> list[WorkloadRequest]:
    """Conversations start as a Poisson process at rate / turns; turn t comes MULTI_TURN_GAP_S after t-1.
    The answers in later prompts are the workload's, not the model's (as when replaying a chat dataset), so
    the cache serves each turn the previous turn's prompt, not its generated answer."""
    conversations = -(-n // MULTI_TURN_TURNS)
    starts = sample_arrivals("poisson", conversations, rate / MULTI_TURN_TURNS, 1.0, rng)
    requests = []
    for c, start in enumerate(starts):
        users = sample_lengths("lognormal:128:0.6:8:1024", MULTI_TURN_TURNS, rng)
        answers = sample_lengths("lognormal:128:0.6:8:512", MULTI_TURN_TURNS, rng)
        history: tuple[tuple[int, int], ...] = ()
        for t in range(MULTI_TURN_TURNS):
            segments = history + ((c * 2 * MULTI_TURN_TURNS + 2 * t, int(users[t])),)
            requests.append(WorkloadRequest(sum(length for _, length in segments), int(answers[t]),
                                            float(start + t * MULTI_TURN_GAP_S), segments))
            history = segments + ((c * 2 * MULTI_TURN_TURNS + 2 * t + 1, int(answers[t])),)
    return sorted(requests, key=lambda r: r.arrival_time)[:n]


def read_trace(name: str) -> pd.DataFrame:
    with resources.files("chunkbench.data").joinpath(TRACE_FILES[name]).open() as f:
        return pd.read_csv(f)


# ---------- the one entry point ----------

@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that defines a workload; the same spec and seed give the same requests."""

    name: str = "chat"  # a named workload, "synthetic", or a file path
    num_requests: int | None = 100
    duration: float | None = None  # seconds of arrivals to keep
    rate: float = 1.0  # requests/s
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
    # vllm bench serve's dataset options (chunkbench/datasets.py), with vLLM's defaults.
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
        check_number("--rate", self.rate, low=0, low_open=True)
        check_number("--burstiness", self.burstiness, low=0, low_open=True)
        check_number("--time-scale", self.time_scale, low=0, low_open=True)
        check_number("--prefix-len", self.prefix_len, low=0, high=MAX_TOKENS, integer=True)
        check_number("--num-prefixes", self.num_prefixes, low=1, integer=True)
        check_number("--seed", self.seed, low=0, high=2**32 - 1, integer=True)
        if self.ramp_up_strategy is not None:
            if self.ramp_up_strategy not in RAMP_UPS:
                raise UserError(f"--ramp-up-strategy must be one of {', '.join(RAMP_UPS)}, got "
                                f"'{self.ramp_up_strategy}'")
            if self.ramp_up_start_rps is None or self.ramp_up_end_rps is None:
                raise UserError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
            check_number("--ramp-up-start-rps", self.ramp_up_start_rps, low=0, low_open=True)
            check_number("--ramp-up-end-rps", self.ramp_up_end_rps, low=0, low_open=True)
        elif self.ramp_up_start_rps is not None or self.ramp_up_end_rps is not None:
            raise UserError("--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy linear|exponential")
        check_number("--probe-request-rate", self.probe_request_rate, low=0)
        datasets.validate(self)
        defaults = {f.name: f.default for f in fields(self)}
        for name in ("prompt_len", "output_len"):
            if self.name != "synthetic" and getattr(self, name) != defaults[name]:
                flag = "--" + name.replace("_", "-")
                raise UserError(f"{flag} shapes synthetic workloads; workload '{self.name}' has its own lengths: "
                                f"add --workload synthetic, or leave {flag} out")


def build_workload(spec: WorkloadSpec, max_model_len: int | None = None) -> list[WorkloadRequest]:
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    n = spec.num_requests or 1000
    arrivals = None
    shared = None  # per request shared prefix segments, when the source has them
    dataset = datasets.parse(spec.name)
    if dataset is not None:
        drawn = datasets.draw(spec, *dataset, spec.num_requests if dataset[1] else n, rng)
        prompts, outputs, shared = drawn.prompts, drawn.outputs, drawn.shared
        arrivals = drawn.arrivals if spec.arrival in (None, "trace") else None
        n = len(prompts)
    elif spec.name in TRACE_FILES or Path(spec.name).suffix in (".csv", ".jsonl", ".ndjson", ".json"):
        if spec.name in TRACE_FILES:
            frame = read_trace(spec.name).rename(columns={"num_prefill_tokens": "prompt_len",
                                                          "num_decode_tokens": "output_len",
                                                          "arrived_at": "arrival_time"})
        else:
            path = Path(spec.name)
            if not path.is_file():
                raise UserError(f"--workload: no such file: {path}")
            frame = read_sharegpt(path, spec.tokenizer) if path.suffix == ".json" else read_token_file(path)
        if spec.shuffle:
            frame = frame.sample(frac=1.0, random_state=spec.seed).reset_index(drop=True)
        frame = frame.head(spec.num_requests) if spec.num_requests else frame
        if spec.shuffle and "arrival_time" in frame:
            frame = frame.sort_values("arrival_time", kind="stable").reset_index(drop=True)
        prompts, outputs = frame["prompt_len"].to_numpy(np.int64), frame["output_len"].to_numpy(np.int64)
        if "prefix_group" in frame:  # a group's requests share their first prefix_len tokens
            lens = frame["prefix_len"] if "prefix_len" in frame else pd.Series(np.zeros(len(frame)))
            shared = [((1_000_000 + int(g), min(int(length), int(p))),) if length > 0 else ()
                      for g, length, p in zip(frame["prefix_group"], lens, prompts)]
        if "arrival_time" in frame and spec.arrival in (None, "trace"):
            arrivals = frame["arrival_time"].to_numpy(float) * spec.time_scale  # as given, as vLLM's timed_trace
        n = len(prompts)
    elif spec.name == "multi-turn":
        requests = _multi_turn(n, spec.rate, rng)
        prompts = np.array([r.prompt_len for r in requests])
        outputs = np.array([r.output_len for r in requests])
        arrivals = np.array([r.arrival_time for r in requests])
        shared = [r.shared for r in requests]
    elif spec.name in NAMED:
        prompts, outputs = _named_lengths(spec.name, n, rng)
    elif spec.name == "synthetic":
        prompts = sample_lengths(spec.prompt_len, n, rng, "--prompt-len")
        outputs = sample_lengths(spec.output_len, n, rng, "--output-len")
    else:
        raise UserError(f"--workload: unknown workload '{spec.name}'; use one of "
                        f"{', '.join([*NAMED, 'synthetic', *datasets.DATASETS])} (KIND:PATH for a file "
                        "dataset) or a .csv/.jsonl/.json file")
    if arrivals is None:
        if spec.arrival == "trace":
            raise UserError(f"--arrival trace: workload '{spec.name}' has no timestamps")
        arrivals = sample_arrivals(spec.arrival or "poisson", n, spec.rate, spec.burstiness, rng, spec.seed,
                                   spec.ramp)
    shared = shared or [()] * len(prompts)
    requests = [WorkloadRequest(int(p), int(o), float(a), sh)
                for p, o, a, sh in zip(prompts, outputs, arrivals, shared)]
    if spec.prefix_len:  # a shared prefix before each prompt, round-robin over the prefixes
        requests = [WorkloadRequest(r.prompt_len + spec.prefix_len, r.output_len, r.arrival_time,
                                    ((2_000_000 + i % spec.num_prefixes, spec.prefix_len),) + r.shared)
                    for i, r in enumerate(requests)]
    if spec.duration is not None:
        requests = [r for r in requests if r.arrival_time <= spec.duration]
    span = arrival_span(requests)
    if span > MAX_SPAN_S:
        raise UserError(f"the workload's arrivals span {span:.3g} s; at most {MAX_SPAN_S:.0e} s (times are seconds in "
                        "floating point: far beyond, latencies are lost in rounding): raise --rate or lower "
                        "--time-scale")
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
    probes = [WorkloadRequest(PROBE_PROMPT, 1, k / rate, probe=True) for k in range(int(span * rate) + 1)]
    return sorted(requests + probes, key=lambda r: r.arrival_time)


def clip_to_model(requests: list[WorkloadRequest], max_model_len: int) -> list[WorkloadRequest]:
    """Shorten requests longer than max_model_len (prompt first kept, then output), warning how many."""
    clipped = []
    for r in requests:
        if r.prompt_len + r.output_len > max_model_len:
            prompt = min(r.prompt_len, max_model_len - 1)
            shared, room = [], prompt  # keep the shared segments that still fit
            for key, length in r.shared:
                shared.append((key, min(length, room)))
                room -= shared[-1][1]
            r = WorkloadRequest(prompt, min(r.output_len, max_model_len - prompt), r.arrival_time,
                                tuple(seg for seg in shared if seg[1] > 0))
        clipped.append(r)
    count = sum(a != b for a, b in zip(requests, clipped))
    if count:
        warnings.warn(f"{count} of {len(requests)} requests were clipped to max_model_len ({max_model_len})",
                      stacklevel=2)
    return clipped

