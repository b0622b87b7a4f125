"""Where a workload's requests come from, by `--workload` name: one table (SOURCES) of the named workloads,
`synthetic`, the real traces shipped in chunkbench/data, and vllm bench serve's datasets
(chunkbench/workloads/vllm_datasets.py); a path ending in .csv/.jsonl/.json is a user's file. Each source draws
token counts and, where it has them, arrival times and shared prefix segments; workloads/spec.py's
build_workload does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from chunkbench.errors import UserError
from chunkbench.registry import Registry
from chunkbench.workloads import vllm_datasets
from chunkbench.workloads.arrivals import sample_arrivals
from chunkbench.workloads.dataset_files import Drawn
from chunkbench.workloads.lengths import sample_lengths
from chunkbench.workloads.user_files import read_sharegpt, read_token_file

FILE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json")
MULTI_TURN_TURNS, MULTI_TURN_GAP_S = 4, 5.0  # turns per conversation; seconds between a conversation's turns
PREFIX_GROUP_KEYS = 1_000_000  # shared-segment keys of a file's prefix groups


@dataclass(frozen=True)
class Source:
    help: str
    draw: Callable  # (spec, n, rng) -> Drawn; n: the requests asked for (num_requests, else 1000)
    timestamps: bool = False  # it brings arrival times (a trace), used unless --arrival says otherwise
    own_arrivals: bool = False  # its arrival times are part of it (multi-turn's turns): --arrival is ignored


def _lengths(prompt: str, output: str) -> Callable:
    return lambda spec, n, rng: Drawn(sample_lengths(prompt, n, rng), sample_lengths(output, n, rng))


def _rag_mix(spec, n: int, rng: np.random.Generator) -> Drawn:
    """Every 10th request (from a seeded offset) is a long document."""
    prompts = sample_lengths("lognormal:200:0.6:16:1024", n, rng)
    outputs = sample_lengths("lognormal:128:0.5:16:512", n, rng)
    docs = np.arange(n) % 10 == rng.integers(10)
    prompts[docs] = rng.integers(2048, 6145, docs.sum())
    return Drawn(prompts, outputs)


def _multi_turn(spec, n: int, rng: np.random.Generator) -> Drawn:
    """Conversations start as a Poisson process at rate / turns; turn t comes MULTI_TURN_GAP_S after t-1.
    The answers in later prompts are the workload's, not the model's (as when replaying a chat dataset), so
    the cache serves each turn the previous turn's prompt, not its generated answer."""
    conversations = -(-n // MULTI_TURN_TURNS)
    starts = sample_arrivals("poisson", conversations, spec.rate / MULTI_TURN_TURNS, 1.0, rng)
    turns = []  # (arrival, prompt, output, segments)
    for c, start in enumerate(starts):
        users = sample_lengths("lognormal:128:0.6:8:1024", MULTI_TURN_TURNS, rng)
        answers = sample_lengths("lognormal:128:0.6:8:512", MULTI_TURN_TURNS, rng)
        history: tuple[tuple[int, int], ...] = ()
        for t in range(MULTI_TURN_TURNS):
            segments = history + ((c * 2 * MULTI_TURN_TURNS + 2 * t, int(users[t])),)
            turns.append(
                (float(start + t * MULTI_TURN_GAP_S), sum(length for _, length in segments), int(answers[t]), segments)
            )
            history = segments + ((c * 2 * MULTI_TURN_TURNS + 2 * t + 1, int(answers[t])),)
    turns = sorted(turns, key=lambda turn: turn[0])[:n]
    return Drawn(
        np.array([t[1] for t in turns]),
        np.array([t[2] for t in turns]),
        np.array([t[0] for t in turns]),
        [t[3] for t in turns],
    )


def _synthetic(spec, n: int, rng: np.random.Generator) -> Drawn:
    return Drawn(
        sample_lengths(spec.prompt_len, n, rng, "--prompt-len"), sample_lengths(spec.output_len, n, rng, "--output-len")
    )


def read_trace(file: str) -> pd.DataFrame:
    with resources.files("chunkbench.data").joinpath(file).open() as f:
        return pd.read_csv(f).rename(
            columns={
                "num_prefill_tokens": "prompt_len",
                "num_decode_tokens": "output_len",
                "arrived_at": "arrival_time",
            }
        )


def _frame(spec, frame: pd.DataFrame) -> Drawn:
    """A trace's or a user's file's rows: the first num_requests (or, with --shuffle, that many in a seeded
    order, put back in time order when timestamped), prefix groups as shared segments, timestamps as given."""
    if spec.shuffle:
        frame = frame.sample(frac=1.0, random_state=spec.seed).reset_index(drop=True)
    frame = frame.head(spec.num_requests) if spec.num_requests else frame
    if spec.shuffle and "arrival_time" in frame:
        frame = frame.sort_values("arrival_time", kind="stable").reset_index(drop=True)
    prompts, outputs = frame["prompt_len"].to_numpy(np.int64), frame["output_len"].to_numpy(np.int64)
    shared = None
    if "prefix_group" in frame:  # a group's requests share their first prefix_len tokens
        lens = frame["prefix_len"] if "prefix_len" in frame else pd.Series(np.zeros(len(frame)))
        shared = [
            ((PREFIX_GROUP_KEYS + int(g), min(int(length), int(p))),) if length > 0 else ()
            for g, length, p in zip(frame["prefix_group"], lens, prompts)
        ]
    arrivals = frame["arrival_time"].to_numpy(float) * spec.time_scale if "arrival_time" in frame else None
    return Drawn(prompts, outputs, arrivals, shared)


def _trace(file: str) -> Callable:
    return lambda spec, n, rng: _frame(spec, read_trace(file))


def _user_file(spec, n: int, rng) -> Drawn:
    path = Path(spec.name)  # each reader checks the file (user_files.check_file)
    return _frame(spec, read_sharegpt(path, spec.tokenizer) if path.suffix == ".json" else read_token_file(path))


SOURCES: Registry[Source] = Registry("workload")  # find() names what --workload accepts besides these
for _name, _source in {
    "chat": Source(
        "short chat prompts (lognormal, median 256 tokens) and answers (median 128)",
        _lengths("lognormal:256:0.8:4:4096", "lognormal:128:0.6:4:1024"),
    ),
    "long-doc": Source(
        "long documents, 8k-32k-token prompts, 256-token answers", _lengths("uniform:8192:32768", "fixed:256")
    ),
    "rag-mix": Source("9 chats in 10 (median 200 tokens) with a 2k-6k-token document prompt among them", _rag_mix),
    "azure-conv": Source(
        "Azure LLM conversation trace (Splitwise, 2023), real arrivals", _trace("splitwise_conv.csv"), timestamps=True
    ),
    "azure-code": Source(
        "Azure LLM coding trace (Splitwise, 2023), real arrivals", _trace("splitwise_code.csv"), timestamps=True
    ),
    "arxiv-summarization": Source(
        "arXiv summarization token counts (long prompts), Poisson arrivals at --rate", _trace("arxiv_summarization.csv")
    ),
    "multi-turn": Source(
        "4-turn chats: each turn's prompt is the whole conversation so far plus a new message",
        _multi_turn,
        timestamps=True,
        own_arrivals=True,
    ),
    "synthetic": Source("lengths from --prompt-len and --output-len", _synthetic),
}.items():
    SOURCES.register(_name, _source)
NAMED = {name: source.help for name, source in SOURCES.items() if name != "synthetic"}


def find(name: str) -> Source:
    """The source of a --workload value, or one line naming what is accepted."""
    dataset = vllm_datasets.parse(name)
    if dataset is not None:
        kind, path = dataset

        def draw(spec, n, rng):
            return vllm_datasets.draw(spec, kind, path, spec.num_requests if path else n, rng)

        return Source(vllm_datasets.DATASETS[kind].help, draw, timestamps=kind == "timed_trace")
    if name in SOURCES:
        return SOURCES[name]
    if Path(name).suffix in FILE_SUFFIXES:
        return Source("a user's file", _user_file, timestamps=True)
    raise UserError(
        f"--workload: unknown workload '{name}'; use one of "
        f"{', '.join([*SOURCES, *vllm_datasets.DATASETS])} (KIND:PATH for a file dataset) or a "
        ".csv/.jsonl/.json file"
    )


def has_timestamps(name: str) -> bool:
    """Whether the workload brings its own arrival times (a trace, multi-turn, a timed_trace; a user's file
    keeps them when it has them). An unknown name has none: building it says why."""
    try:
        return find(name).timestamps
    except UserError:
        return False
