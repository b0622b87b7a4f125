"""vllm bench serve's datasets as workloads: `random` and `prefix_repetition` drawn as vLLM 0.32 draws their
token counts for the same seed, and files read as `KIND:PATH` (burstgpt, custom, hf, sharegpt, timed_trace;
their readers are in chunkbench/workloads/dataset_files.py). The registry, and each name's parse and check, are here.

Only token counts, shared prefixes and arrival times are taken from a dataset; the prompts' tokens are
chunkbench's own (harness.prompt_ids), seeded, with equal shared segments wherever the dataset repeats one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkbench.errors import UserError, check_number
from chunkbench.registry import Registry
from chunkbench.workloads.dataset_files import (
    PREFIX_REPETITION_KEYS,
    Drawn,
    load_burstgpt,
    load_custom,
    load_hf,
    load_sharegpt,
    load_timed_trace,
)
from chunkbench.workloads.user_files import MAX_TOKENS, check_file, load_tokenizer


@dataclass(frozen=True)
class Dataset:
    load: Callable  # (spec, path or None, n, rng) -> Drawn
    takes_path: bool
    help: str


def special_tokens(tokenizer_dir: str | None) -> int:
    """Tokens the tokenizer adds to a prompt (1 for Llama's BOS); 0 without a tokenizer."""
    if tokenizer_dir is None:
        return 0
    return int(load_tokenizer(tokenizer_dir).num_special_tokens_to_add())


def _random(spec, path, n: int, rng: np.random.Generator) -> Drawn:
    """vLLM's get_sampling_params: uniform integers around the means, the input less the special tokens."""
    ratio = spec.random_range_ratio
    real = max(0, spec.random_input_len - special_tokens(spec.tokenizer))
    in_low, in_high = math.floor(real * (1 - ratio)), math.ceil(real * (1 + ratio))
    out_low = max(math.floor(spec.random_output_len * (1 - ratio)), 1)
    out_high = max(math.ceil(spec.random_output_len * (1 + ratio)), 1)
    if spec.prefix_len + in_low < 1:
        raise UserError(
            "--random-input-len is too small: with --random-range-ratio and the tokenizer's special "
            "tokens, a prompt could have no token; raise it or --random-prefix-len"
        )
    prompts = rng.integers(in_low, in_high + 1, size=n)
    return Drawn(prompts, rng.integers(out_low, out_high + 1, size=n))


def _prefix_repetition(spec, path, n: int, rng) -> Drawn:
    """num_prefixes shared prefixes, n // num_prefixes requests each, in the order vLLM's seeded shuffle
    gives (Python's random, seeded, shuffles the requests built prefix by prefix)."""
    per_prefix = n // spec.prefix_repetition_num_prefixes
    if per_prefix == 0:
        raise UserError(
            f"--num-requests ({n}) must be at least --prefix-repetition-num-prefixes "
            f"({spec.prefix_repetition_num_prefixes})"
        )
    groups = [g for g in range(spec.prefix_repetition_num_prefixes) for _ in range(per_prefix)]
    random.Random(spec.seed).shuffle(groups)
    length = spec.prefix_repetition_prefix_len + spec.prefix_repetition_suffix_len
    shared = [
        ((PREFIX_REPETITION_KEYS + g, spec.prefix_repetition_prefix_len),) if spec.prefix_repetition_prefix_len else ()
        for g in groups
    ]
    return Drawn(np.full(len(groups), length), np.full(len(groups), spec.prefix_repetition_output_len), None, shared)


DATASETS: Registry[Dataset] = Registry("vLLM dataset")  # by kind, as vllm bench serve's --dataset-name names it
for _kind, _dataset in {
    "random": Dataset(
        _random,
        False,
        "vLLM's random: --random-input-len/--random-output-len tokens, "
        "--random-range-ratio around them, --random-prefix-len shared",
    ),
    "prefix_repetition": Dataset(
        _prefix_repetition,
        False,
        "--prefix-repetition-num-prefixes shared prefixes "
        "of --prefix-repetition-prefix-len tokens, a suffix, an output",
    ),
    "burstgpt": Dataset(
        load_burstgpt, True, "BurstGPT's CSV (GPT-4 rows, sampled by --seed; --arrival trace: its timestamps)"
    ),
    "custom": Dataset(load_custom, True, 'JSONL of {"prompt": ..., "output_tokens": ...}'),
    "hf": Dataset(load_hf, True, "a local or cached Hugging Face dataset with a prompt column"),
    "sharegpt": Dataset(load_sharegpt, True, "ShareGPT JSON"),
    "timed_trace": Dataset(
        load_timed_trace, True, "JSONL with timestamp, input/output lengths and hash_ids (Mooncake's, Qwen's traces)"
    ),
}.items():
    DATASETS.register(_kind, _dataset)
HELP = "; ".join(f"{kind}{':PATH' if d.takes_path else ''} ({d.help})" for kind, d in DATASETS.items())


def parse(name: str) -> tuple[str, Path | None] | None:
    """(kind, path) when `name` names a dataset: `random`, `prefix_repetition` or `KIND:PATH`; else None."""
    kind, sep, path = name.partition(":")
    if kind not in DATASETS:
        return None
    if DATASETS[kind].takes_path != bool(sep):
        form = f"{kind}:PATH" if DATASETS[kind].takes_path else kind
        raise UserError(f"--workload: write '{form}' for vLLM's {kind} dataset, got '{name}'")
    if sep and kind != "hf":  # hf: a folder, or a name in the datasets cache
        check_file(Path(path), f"--workload {kind}")
    return kind, Path(path) if sep else None


def validate(spec) -> None:
    """The dataset options of a WorkloadSpec, each in vLLM's range."""
    for name in (
        "random_input_len",
        "random_output_len",
        "prefix_repetition_num_prefixes",
        "timed_trace_chunk_hash_size",
    ):
        check_number("--" + name.replace("_", "-"), getattr(spec, name), low=1, high=MAX_TOKENS, integer=True)
    for name in ("prefix_repetition_prefix_len", "prefix_repetition_suffix_len"):
        check_number("--" + name.replace("_", "-"), getattr(spec, name), low=0, high=MAX_TOKENS, integer=True)
    check_number(
        "--prefix-repetition-output-len", spec.prefix_repetition_output_len, low=1, high=MAX_TOKENS, integer=True
    )
    check_number("--random-range-ratio", spec.random_range_ratio, low=0)
    if spec.random_range_ratio >= 1:
        raise UserError(f"--random-range-ratio must be in [0, 1), got {spec.random_range_ratio}")
    if spec.custom_output_len != -1:
        check_number("--custom-output-len", spec.custom_output_len, low=1, high=MAX_TOKENS, integer=True)
    if spec.hf_output_len is not None:
        check_number("--hf-output-len", spec.hf_output_len, low=1, high=MAX_TOKENS, integer=True)
    if spec.prefix_repetition_prefix_len + spec.prefix_repetition_suffix_len < 1:
        raise UserError("--prefix-repetition-prefix-len plus --prefix-repetition-suffix-len must be >= 1")


def draw(spec, kind: str, path: Path | None, n: int | None, rng: np.random.Generator) -> Drawn:
    return DATASETS[kind].load(spec, path, n, rng)
