"""Workloads from users' files: CSV/JSONL token counts (with optional arrival times and prefix groups) and
ShareGPT conversations (counted by a local tokenizer, or 4 characters per token). Every count is checked:
a bad file is one clear error, never a traceback or a silently wrong workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from chunkbench.errors import UserError

CHARS_PER_TOKEN = 4.0  # the usual English estimate for BPE tokenizers when no tokenizer is given
MAX_TOKENS = 10**8  # no request is longer: bigger numbers in a spec or file are mistakes, not workloads

COLUMN_ALIASES = {
    "prompt_len": ("prompt_len", "input_len", "prompt_tokens", "num_prefill_tokens"),
    "output_len": ("output_len", "output_tokens", "num_decode_tokens", "max_tokens"),
    "arrival_time": ("arrival_time", "arrived_at", "timestamp"),
    "prefix_group": ("prefix_group",),
    "prefix_len": ("prefix_len",),
}
OPTIONAL_COLUMNS = ("arrival_time", "prefix_group", "prefix_len")


def read_token_file(path: Path) -> pd.DataFrame:
    try:
        if path.suffix in (".jsonl", ".ndjson"):
            frame = pd.read_json(path, lines=True)
        else:
            frame = pd.read_csv(path)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise UserError(f"--workload: cannot read {path}: {str(exc).splitlines()[0]}") from None
    columns = {}
    for name, aliases in COLUMN_ALIASES.items():
        found = next((a for a in aliases if a in frame.columns), None)
        if found is None and name not in OPTIONAL_COLUMNS:
            raise UserError(f"--workload: {path} has no {name} column (accepted names: {', '.join(aliases)})")
        if found is not None:
            columns[name] = pd.to_numeric(frame[found], errors="coerce")
    result = check_counts(pd.DataFrame(columns), path)
    if "arrival_time" in result and (~np.isfinite(result["arrival_time"]) | (result["arrival_time"] < 0)).any():
        raise UserError(f"--workload: {path} has arrival times that are negative or not finite")
    return result


def check_counts(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """`frame` if it has rows and every value is present and its prompt_len/output_len are whole token
    counts in [1, MAX_TOKENS]; else one UserError naming the file."""
    if frame.empty:
        raise UserError(f"--workload: {path} has no rows")
    counts = frame[["prompt_len", "output_len"]]
    if (
        frame.isna().any().any()
        or (counts < 1).any().any()
        or (counts > MAX_TOKENS).any().any()
        or (counts != counts.round()).any().any()
    ):
        raise UserError(
            f"--workload: {path} has missing, non-numeric, fractional, non-positive or absurd "
            f"(> {MAX_TOKENS:,}) token counts"
        )
    return frame


def read_sharegpt(path: Path, tokenizer_dir: str | None) -> pd.DataFrame:
    """First human turn as the prompt, the first answer after it as the output."""
    import datasets

    datasets.disable_progress_bars()  # its bars would fill the terminal around our one-line errors
    try:
        rows = datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for a bad file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--workload: cannot read {path} as ShareGPT JSON: {first}") from None
    if "conversations" not in rows.column_names:
        raise UserError(f"--workload: {path} has no 'conversations' field (ShareGPT format)")
    count = token_counter(tokenizer_dir)
    prompts, outputs = [], []
    for conversation in rows["conversations"]:
        if not isinstance(conversation, list) or not all(isinstance(t, dict) for t in conversation):
            raise UserError(
                f"--workload: {path}: each 'conversations' must be a list of turns ({{'from': ..., 'value': ...}})"
            )
        turns = [t.get("value") or "" for t in conversation]
        turns = [t if isinstance(t, str) else "" for t in turns]
        if len(turns) >= 2 and turns[0] and turns[1]:
            prompts.append(count(turns[0]))
            outputs.append(count(turns[1]))
    if not prompts:
        raise UserError(f"--workload: {path} has no conversation with a prompt and an answer")
    return pd.DataFrame({"prompt_len": prompts, "output_len": outputs})


def token_counter(tokenizer_dir: str | None):
    if tokenizer_dir is None:
        return lambda text: max(1, round(len(text) / CHARS_PER_TOKEN))
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--tokenizer: cannot load a tokenizer from {tokenizer_dir}: {exc}") from None
    return lambda text: max(1, len(tokenizer(text)["input_ids"]))
