"""One request to an OpenAI-compatible server, as `vllm bench serve` builds and reads it: the body, the
headers, and the event stream read into what arrived. The run loop that sends them is chunkbench/bench/client.py.

Every streamed event that carries a choice is timestamped, an empty or a multi-token one too, as vLLM does; on
/v1/chat/completions under 0.33's rules (chunkbench/bench/client_rules.py) only those whose delta carries output.
The token count is the server's usage.completion_tokens (asked for with stream_options.include_usage), else the
chunks with text. Under 0.33's rules the final usage chunk's `metrics` (ms) are kept as the server's queue time
and TTFT (s). A stream fails on an HTTP error, an `{"error": ...}` event, a `data:` line that is not JSON, or an
end before `[DONE]`. As vLLM, no sampling parameter is sent unless given (the server's defaults apply).

Prompts are token ids for /v1/completions (the ids `run` feeds the engine); /v1/chat/completions takes text,
so a chat prompt is one common English word per token id: about prompt_len tokens for a BPE tokenizer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import aiohttp

from chunkbench.bench.client_rules import OLDEST, ClientRules

APIS = {"completions": "/completions", "chat": "/chat/completions"}
# vllm bench serve's sampling flags (all unset by default, so none is sent) and their request fields.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
# Words that are one token (with their leading space) in the common BPE vocabularies.
CHAT_WORDS = (
    "the of and to in is for on that with as was by at from it be this are or an not have".split()
    + "but which one all were we when there can more has been if will also new time other".split()
)


@dataclass
class Received:
    """What one request received so far; kept when a timeout cancels the read."""

    chunk_times: list[float] = field(default_factory=list)
    text_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    response_id: str | None = None
    done: bool = False
    server_queue_time: float | None = None  # the final usage chunk's metrics.queue_time_ms, in s
    server_ttft: float | None = None  # its metrics.time_to_first_token_ms (from scheduling), in s


def prompt_text(ids: list[int]) -> str:
    return "".join(" " + CHAT_WORDS[t % len(CHAT_WORDS)] for t in ids).lstrip()


def request_body(api: str, model: str | None, prompt: list[int], max_tokens: int, sampling: dict | None = None) -> dict:
    """The request as vLLM's client builds it; `sampling` (SAMPLING_FIELDS given by the user) merged last."""
    body = {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        body |= {"messages": [{"role": "user", "content": prompt_text(prompt)}], "max_completion_tokens": max_tokens}
    else:
        body |= {"prompt": prompt, "max_tokens": max_tokens}
    return body | ({"model": model} if model else {}) | (sampling or {})


def request_headers(api_key: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """Authorization: Bearer from `api_key`, else $OPENAI_API_KEY (as vLLM); `headers` added last."""
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    return ({"Authorization": f"Bearer {key}"} if key else {}) | dict(headers or {})


@dataclass(frozen=True)
class Prepared:
    """One request ready to send: its encoded body (built before the clock starts)."""

    body: bytes
    chat: bool


def prepare(body: dict) -> Prepared:
    return Prepared(json.dumps(body).encode(), "messages" in body)


async def read_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: Prepared,
    headers: dict,
    into: Received,
    disconnect_after: int | None,
    rules: ClientRules = OLDEST,
) -> str | None:
    """Send one request and read its event stream into `into` by `rules`; the error, or None. Every line of a
    network read carries that read's arrival time."""
    async with session.post(url, data=body.body, headers=headers) as response:
        if response.status != 200:
            text = (await response.read()).decode(errors="replace")
            return f"HTTP {response.status}: {text[:300]}"
        pending = b""
        async for data in response.content.iter_any():
            now = time.perf_counter()
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                error = _event(line.decode(errors="replace"), now, body.chat, into, disconnect_after, rules)
                if error is not None or into.done:
                    return error
    return "the stream ended before [DONE]"


def _event(
    line: str, now: float, chat: bool, into: Received, disconnect_after: int | None, rules: ClientRules
) -> str | None:
    """Take one line of the event stream into `into` (`into.done` at [DONE]); an error, or None."""
    if not line.startswith("data:"):  # blank separators, SSE comments (':'), other SSE fields
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        into.done = True
        return None
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return f"a data line is not JSON: {data[:200]}"
    if not isinstance(event, dict):
        return f"a data line is not a JSON object: {data[:200]}"
    if rules.server_metrics and isinstance(metrics := event.get("metrics"), dict):
        into.server_queue_time, into.server_ttft = (
            _seconds(metrics.get("queue_time_ms")),
            _seconds(metrics.get("time_to_first_token_ms")),
        )
    if "error" in event:
        return f"error event: {json.dumps(event['error'])[:300]}"
    into.response_id = event.get("id", into.response_id)
    choices = event.get("choices")
    if choices and (not (chat and rules.chat_output_only) or carries_output(choices[0].get("delta"))):
        into.chunk_times.append(now)
        text = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
        into.text_chunks += bool(text)
        if disconnect_after is not None and len(into.chunk_times) >= disconnect_after:
            return "disconnected by the client"
    if usage := event.get("usage"):
        into.completion_tokens = usage.get("completion_tokens", into.completion_tokens)
        into.prompt_tokens = usage.get("prompt_tokens", into.prompt_tokens)
    return None


def carries_output(delta) -> bool:
    """0.33's test of a chat chunk: its delta carries generated output (text, reasoning, a tool call), or an
    empty text without a role (a token that decodes to nothing); the opening chunk that names the role and an
    empty finish chunk do not."""
    if not isinstance(delta, dict):
        return False
    if any(delta.get(key) for key in ("content", "reasoning", "reasoning_content", "tool_calls", "function_call")):
        return True
    return delta.get("content") == "" and "role" not in delta


def _seconds(ms) -> float | None:
    """A metric in ms as s; None unless a number (as vLLM's client, which refuses booleans too)."""
    return ms / 1000.0 if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None


def probe_body(api: str, model: str | None, sampling: dict | None) -> Prepared:
    """vLLM's probe: the text "Hi", one token out."""
    body = request_body(api, model, [], 1, sampling)
    if api == "chat":
        body["messages"][0]["content"] = "Hi"
    else:
        body["prompt"] = "Hi"
    return prepare(body)
