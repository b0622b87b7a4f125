"""Workloads from users' files: CSV/JSONL token counts (with optional arrival times and prefix groups) and
ShareGPT conversations (counted by a local tokenizer, or 4 characters per token). Every count is checked:
a bad file is one clear error, never a traceback or a silently wrong workload."""

from __future__ import annotations

import codecs
import functools
import json
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
    check_file(path)
    try:
        if path.suffix in (".jsonl", ".ndjson"):
            frame = pd.read_json(path, lines=True)
        else:
            frame = pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
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


def check_file(path: Path, where: str = "--workload") -> int:
    """A data file's size, once it is known to be a readable regular file that is not empty and begins as text
    (UTF-8: every file kind read here is text); else one UserError starting `where` and naming the file."""
    if not path.exists():
        raise UserError(f"{where}: no such file: {path}")
    if not path.is_file():
        raise UserError(
            f"{where}: {path} is a folder, not a file" if path.is_dir() else f"{where}: {path} is not a file"
        )
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise UserError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if not head.strip():
        raise UserError(f"{where}: {path} is empty")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at the end is not an error
    except UnicodeDecodeError:
        raise UserError(f"{where}: {path} is not text (UTF-8): is it the right file?") from None
    return path.stat().st_size


def read_sharegpt(path: Path, tokenizer_dir: str | None) -> pd.DataFrame:
    """First human turn as the prompt, the first answer after it as the output; conversations with fewer
    than two turns are skipped (as vLLM's ShareGPT loader does). Read once per file and tokenizer."""
    check_file(path)
    return _sharegpt(str(path), path.stat().st_mtime_ns, tokenizer_dir).copy()


@functools.lru_cache(maxsize=2)
def _sharegpt(path: str, mtime_ns: int, tokenizer_dir: str | None) -> pd.DataFrame:
    entries = _json_entries(Path(path))
    if not any(isinstance(e, dict) and "conversations" in e for e in entries):
        raise UserError(f"--workload: {path} has no 'conversations' field (ShareGPT format)")
    count = token_counter(tokenizer_dir)
    prompts, outputs = [], []
    for entry in entries:
        conversation = entry.get("conversations") if isinstance(entry, dict) else None
        if conversation is None:
            continue
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


def _json_entries(path: Path) -> list:
    """A JSON file's list of entries (ShareGPT's: one list, as vLLM reads it), or JSON lines, one each."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise UserError(
                f"--workload: {path} is not JSON ({exc.msg.lower()} at line {exc.lineno}, column {exc.colno}); "
                'ShareGPT\'s format is a list of {"conversations": [...]} objects'
            ) from None
        data = []
        for number, line in enumerate(text.splitlines(), start=1):  # JSON lines
            try:
                data += [json.loads(line)] if line.strip() else []
            except json.JSONDecodeError as line_exc:
                raise UserError(f"--workload: {path} line {number} is not JSON ({line_exc.msg.lower()})") from None
    if isinstance(data, dict):
        return [data]
    if not isinstance(data, list):
        kind = {str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")
        raise UserError(
            f"--workload: {path} holds a JSON {kind}; ShareGPT's format is a list of "
            '{"conversations": [...]} objects'
        )
    return data


def token_counter(tokenizer_dir: str | None):
    if tokenizer_dir is None:
        return lambda text: max(1, round(len(text) / CHARS_PER_TOKEN))
    tokenizer = load_tokenizer(tokenizer_dir)
    return lambda text: max(1, len(tokenizer(text)["input_ids"]))


def load_tokenizer(tokenizer_dir: str):
    """--tokenizer's Hugging Face tokenizer: a local folder or a name in its cache (never downloaded), or one
    UserError in the user's terms."""
    from transformers import AutoTokenizer

    if Path(tokenizer_dir).is_file():
        raise UserError(f"--tokenizer: {tokenizer_dir} is a file; give the tokenizer's folder")
    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError, TypeError):
        raise UserError(
            f"--tokenizer: no tokenizer that Hugging Face can load at {tokenizer_dir} (a folder with tokenizer.json "
            "or tokenizer_config.json and its vocabulary, or a name in its cache; nothing is downloaded)"
        ) from None
