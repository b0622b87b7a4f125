"""The file datasets of vllm bench serve read into token counts (`KIND:PATH`: burstgpt, custom, hf, sharegpt,
timed_trace) as vLLM 0.32 reads them, and Drawn, what every workload source draws. The registry that names the
datasets, and the drawn ones (random, prefix_repetition), are in chunkbench/workloads/vllm_datasets.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from chunkbench.errors import UserError
from chunkbench.workloads.user_files import MAX_TOKENS, check_counts, read_sharegpt, token_counter

# Shared-segment keys of each source, apart so that no two sources' prefixes collide in one run.
PREFIX_REPETITION_KEYS, TIMED_TRACE_KEYS = 4_000_000, 5_000_000


@dataclass
class Drawn:
    """A dataset's requests before arrivals and clipping: token counts, optional timestamps (s) and
    shared prefix segments per request (harness.prompt_ids)."""

    prompts: np.ndarray
    outputs: np.ndarray
    arrivals: np.ndarray | None = None
    shared: list | None = None


def _read_frame(path: Path, reader: Callable, what: str) -> pd.DataFrame:
    try:
        return reader(path)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        why = "not JSON lines (one JSON object a line)" if what == "JSONL" else str(exc).splitlines()[0]
        raise UserError(f"--workload: cannot read {path} as {what}: {why}") from None


BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def load_burstgpt(spec, path: Path, n: int | None, rng) -> Drawn:
    """BurstGPT's CSV, as vLLM reads it: GPT-4 rows with a response, n of them sampled by the seed (with
    replacement when the file has fewer). --arrival trace replays the first n rows at their timestamps."""
    frame = _read_frame(path, pd.read_csv, "BurstGPT CSV")
    missing = [c for c in BURSTGPT_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(
            f"--workload burstgpt: {path} has no {', '.join(missing)} column (BurstGPT's columns: "
            f"{', '.join(BURSTGPT_COLUMNS)}, ...)"
        )
    rows = frame[
        (frame["Model"] == "GPT-4") & (pd.to_numeric(frame["Response tokens"], errors="coerce") > 0)
    ].reset_index(drop=True)
    if rows.empty:
        raise UserError(f"--workload burstgpt: {path} has no GPT-4 row with a response")
    n = n or len(rows)
    if spec.arrival == "trace":
        rows = rows.head(n)
    else:
        rows = rows.sample(n=n, random_state=spec.seed, replace=n > len(rows))
    counts = check_counts(
        pd.DataFrame(
            {
                "prompt_len": pd.to_numeric(rows["Request tokens"], errors="coerce"),
                "output_len": pd.to_numeric(rows["Response tokens"], errors="coerce"),
            }
        ),
        path,
    )
    arrivals = None
    if spec.arrival == "trace":
        times = pd.to_numeric(rows["Timestamp"], errors="coerce").to_numpy(float)
        if not np.isfinite(times).all():
            raise UserError(f"--workload burstgpt: {path} has timestamps that are not numbers")
        arrivals = (times - times.min()) * spec.time_scale
    return Drawn(counts["prompt_len"].to_numpy(np.int64), counts["output_len"].to_numpy(np.int64), arrivals)


def load_custom(spec, path: Path, n: int | None, rng) -> Drawn:
    """vLLM's custom JSONL: a `prompt` per line, its tokens counted (--tokenizer, else 4 characters per token;
    no chat template), and --custom-output-len tokens out (-1: the line's `output_tokens`)."""
    # prompts stay text, as vLLM 0.34 reads them: pandas would read a file of prompts like "00123" as numbers
    frame = _read_frame(path, lambda p: pd.read_json(p, lines=True, dtype={"prompt": str}), "JSONL")
    if "prompt" not in frame.columns:
        raise UserError(f"--workload custom: {path} has no 'prompt' field")
    if spec.custom_output_len == -1 and "output_tokens" not in frame.columns:
        raise UserError(f"--workload custom: {path} has no 'output_tokens' field for --custom-output-len -1")
    order = list(range(len(frame)))
    if spec.shuffle:
        random.Random(spec.seed).shuffle(order)  # vLLM's shuffle of the lines for the same seed
    frame = frame.iloc[order[:n] if n else order]
    count = token_counter(spec.tokenizer)
    prompts = [count(p) if isinstance(p, str) and p else 0 for p in frame["prompt"]]
    outputs = (
        pd.to_numeric(frame["output_tokens"], errors="coerce")
        if spec.custom_output_len == -1
        else [spec.custom_output_len] * len(frame)
    )
    counts = check_counts(pd.DataFrame({"prompt_len": prompts, "output_len": list(outputs)}), path)
    return Drawn(counts["prompt_len"].to_numpy(np.int64), counts["output_len"].to_numpy(np.int64))


HF_PROMPT_COLUMNS = ("prompt", "question", "instruction", "input", "text")
HF_ANSWER_COLUMNS = ("response", "answer", "output", "completion")


def load_hf(spec, path: Path, n: int | None, rng) -> Drawn:
    """A Hugging Face dataset from a local folder or the datasets cache (never downloaded): the first of
    HF_PROMPT_COLUMNS it has, and --hf-output-len tokens out, else the answer column's token count."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    if Path(path).is_file():
        raise UserError(
            f"--workload hf: {path} is a file; hf reads a dataset folder (Dataset.save_to_disk's, or data files "
            "by split) or a name in the datasets cache"
        )
    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(logging.CRITICAL + 1)  # its log line of a bad file: the error below says it
    try:
        if (Path(path) / "state.json").is_file():  # a datasets.Dataset.save_to_disk folder
            rows = datasets.load_from_disk(str(path))
        else:
            rows = datasets.load_dataset(str(path), name=spec.hf_subset, split=spec.hf_split)
    except Exception as exc:  # datasets raises many types for a missing or bad dataset
        while exc.__cause__ is not None:  # "An error occurred while generating the dataset": what it was
            exc = exc.__cause__
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"--workload hf: cannot load {path} here (local folder or the datasets cache, no download): {first}"
        ) from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if spec.shuffle:
        rows = rows.shuffle(seed=spec.seed)
    if n:
        rows = rows.select(range(min(n, len(rows))))
    prompt = next((c for c in HF_PROMPT_COLUMNS if c in rows.column_names), None)
    answer = next((c for c in HF_ANSWER_COLUMNS if c in rows.column_names), None)
    if prompt is None:
        raise UserError(f"--workload hf: {path} has none of the prompt columns {', '.join(HF_PROMPT_COLUMNS)}")
    if spec.hf_output_len is None and answer is None:
        raise UserError(
            f"--workload hf: {path} has no answer column ({', '.join(HF_ANSWER_COLUMNS)}): give --hf-output-len"
        )
    count = token_counter(spec.tokenizer)
    prompts = [count(t) if isinstance(t, str) and t else 0 for t in rows[prompt]]
    outputs = (
        [spec.hf_output_len] * len(prompts)
        if spec.hf_output_len is not None
        else [count(t) if isinstance(t, str) and t else 0 for t in rows[answer]]
    )
    counts = check_counts(pd.DataFrame({"prompt_len": prompts, "output_len": outputs}), path)
    return Drawn(counts["prompt_len"].to_numpy(np.int64), counts["output_len"].to_numpy(np.int64))


def load_sharegpt(spec, path: Path, n: int | None, rng) -> Drawn:
    frame = read_sharegpt(path, spec.tokenizer)
    if spec.shuffle:
        frame = frame.sample(frac=1.0, random_state=spec.seed).reset_index(drop=True)
    frame = frame.head(n) if n else frame
    return Drawn(frame["prompt_len"].to_numpy(np.int64), frame["output_len"].to_numpy(np.int64))


def load_timed_trace(spec, path: Path, n: int | None, rng) -> Drawn:
    """vLLM's timed_trace: JSONL lines with a timestamp, lengths and hash_ids. Each id is a block of
    --timed-trace-chunk-hash-size tokens (the last one cut to what is left of the input length); the prompt is
    the blocks, so equal ids at the start of two prompts are a shared prefix. Timestamps are seconds times
    --time-scale (--timed-trace-sec-multiplier), as given."""
    labels = (
        spec.timed_trace_label_timestamp,
        spec.timed_trace_label_input_length,
        spec.timed_trace_label_output_length,
    )
    keys: dict[tuple[int, int], int] = {}  # (hash id, block size) -> shared-segment key
    prompts, outputs, arrivals, shared = [], [], [], []
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--workload timed_trace: cannot read {path}: {exc}") from None
    for number, line in enumerate(lines[:n] if n else lines, start=1):
        where = f"--workload timed_trace: {path} line {number}"
        try:
            entry = json.loads(line)
        except ValueError:
            raise UserError(f"{where} is not JSON (a JSON object a line, with {', '.join(labels)})") from None
        missing = [label for label in labels if label not in entry] if isinstance(entry, dict) else labels
        if missing:
            raise UserError(f"{where}: not a JSON object with {', '.join(labels)} (no {', '.join(missing)})")
        timestamp, length, output = (entry[label] for label in labels)
        ids = entry.get(spec.timed_trace_label_hash_ids, [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise UserError(f"{where}: {spec.timed_trace_label_hash_ids} must be a list of integers")
        segments, left = [], _whole(length, where)
        for h in ids:
            size = min(spec.timed_trace_chunk_hash_size, left)
            segments.append((keys.setdefault((h, size), TIMED_TRACE_KEYS + len(keys)), size))
            left -= size
            if left <= 0:
                break
        if not segments:
            raise UserError(f"{where}: its hash_ids give the prompt no token (vLLM's prompt is the blocks)")
        prompts.append(sum(size for _, size in segments))
        outputs.append(_whole(output, where))
        arrivals.append(timestamp)
        shared.append(tuple(segments))
    if not prompts:
        raise UserError(f"--workload timed_trace: {path} has no rows")
    times = np.asarray(pd.to_numeric(pd.Series(arrivals), errors="coerce"), float)
    if not np.isfinite(times).all() or (times < 0).any():
        raise UserError(f"--workload timed_trace: {path} has timestamps that are negative or not numbers")
    return Drawn(np.array(prompts), np.array(outputs), times * spec.time_scale, shared)


def _whole(value, where: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != int(value)
        or not 1 <= value <= MAX_TOKENS
    ):
        raise UserError(f"{where}: token counts must be whole numbers in [1, {MAX_TOKENS:,}], got {value!r}")
    return int(value)
