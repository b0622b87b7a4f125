"""`chunkbench bench --endpoint`: the workloads and metrics of `run`, against any OpenAI-compatible server
(chunkbench serve, vLLM, SGLang), measured as `vllm bench serve` measures them.

An async client sends each request at its arrival time (after waiting for a --max-concurrency slot, the
client queue time) and streams it. Latencies start at the send. Every streamed event that carries a choice is
timestamped, an empty or a multi-token one too, as vLLM does; the token count is the server's
usage.completion_tokens (asked for with stream_options.include_usage), else the chunks with text.

A request fails, and is kept with its error, on an HTTP error, an `{"error": ...}` event, a `data:` line that
is not JSON, a stream that ends before `[DONE]`, a dropped connection, or its timeout. One untimed warm-up
request goes first (as vLLM's); its prompt is drawn apart from the workload's so that it warms the server,
not the prefix cache for request 0.

Prompts are token ids for /v1/completions (the ids `run` feeds the engine); /v1/chat/completions takes text,
so a chat prompt is one common English word per token id: about prompt_len tokens for a BPE tokenizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass, field, replace

import httpx

from chunkbench.gc_pause import frozen_heap
from chunkbench.harness import prompt_ids
from chunkbench.metrics import RequestRecord
from chunkbench.workload import WorkloadRequest, check_real_time

APIS = {"completions": "/completions", "chat": "/chat/completions"}
# Words that are one token (with their leading space) in the common BPE vocabularies.
CHAT_WORDS = ("the of and to in is for on that with as was by at from it be this are or an not have".split()
              + "but which one all were we when there can more has been if will also new time other".split())


@dataclass(frozen=True)
class EndpointResult:
    records: list[RequestRecord]  # times relative to `start`; failed requests keep the chunk times they got
    response_ids: list[str | None]
    errors: list[str | None]
    duration: float  # clock start to the end of the last request, failed ones too (s)
    end_times: list[float] = field(default_factory=list)  # when each request ended, relative to start (s)
    start: float = 0.0  # time.perf_counter() at the clock start, after the warm-up
    warmup_error: str | None = None  # the warm-up's failure (the run goes on), None when it passed or was off


@dataclass
class _Stream:
    """What one request received so far; kept when a timeout cancels the read."""

    chunk_times: list[float] = field(default_factory=list)
    text_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    response_id: str | None = None
    done: bool = False


def prompt_text(ids: list[int]) -> str:
    return "".join(" " + CHAT_WORDS[t % len(CHAT_WORDS)] for t in ids).lstrip()


def request_body(api: str, model: str | None, prompt: list[int], max_tokens: int) -> dict:
    body = {"temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        body |= {"messages": [{"role": "user", "content": prompt_text(prompt)}], "max_completion_tokens": max_tokens}
    else:
        body |= {"prompt": prompt, "max_tokens": max_tokens}
    return body | ({"model": model} if model else {})


def request_headers(api_key: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """Authorization: Bearer from `api_key`, else $OPENAI_API_KEY (as vLLM); `headers` added last."""
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    return ({"Authorization": f"Bearer {key}"} if key else {}) | dict(headers or {})


async def _stream(client: httpx.AsyncClient, url: str, body: dict, headers: dict, into: _Stream,
                  disconnect_after: int | None) -> str | None:
    """Send one request and read its event stream into `into`; the error, or None."""
    chat = "messages" in body
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            return f"HTTP {response.status_code}: {text[:300]}"
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data:"):  # blank separators, SSE comments (':'), other SSE fields
                continue
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
            if "error" in event:
                return f"error event: {json.dumps(event['error'])[:300]}"
            into.response_id = event.get("id", into.response_id)
            if choices := event.get("choices"):
                into.chunk_times.append(now)
                text = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
                into.text_chunks += bool(text)
                if disconnect_after is not None and len(into.chunk_times) >= disconnect_after:
                    return "disconnected by the client"
            if usage := event.get("usage"):
                into.completion_tokens = usage.get("completion_tokens", into.completion_tokens)
                into.prompt_tokens = usage.get("prompt_tokens", into.prompt_tokens)
    return "the stream ended before [DONE]"


async def _request(client: httpx.AsyncClient, url: str, body: dict, headers: dict, timeout_s: float,
                   disconnect_after: int | None = None) -> tuple[float, float, _Stream, str | None]:
    """(send time, end time, what arrived, error): one request, failures caught and named."""
    received = _Stream()
    send = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            error = await _stream(client, url, body, headers, received, disconnect_after)
    except TimeoutError:
        error = f"timed out after {timeout_s:g} s"
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    if error is None and not received.chunk_times:
        error = "no tokens received"
    return send, time.perf_counter(), received, error


async def bench_endpoint(endpoint: str, workload: list[WorkloadRequest], vocab_size: int, model: str | None = None,
                         max_concurrency: int | None = None, seed: int = 0, timeout_s: float = 600.0,
                         disconnect: dict[int, int] | None = None, *, api: str = "completions",
                         api_key: str | None = None, headers: dict[str, str] | None = None,
                         warmup: bool = True) -> EndpointResult:
    """Run `workload` against `endpoint` (the base URL, e.g. http://host:8000/v1).

    timeout_s: per request, from its send to its end; a request past it fails. api: "completions" or "chat".
    `disconnect` maps request index -> chunks after which that client hangs up (for robustness tests)."""
    if api not in APIS:
        raise ValueError(f"api must be one of {', '.join(APIS)}, got {api!r}")
    check_real_time(workload, "the server")
    url = endpoint.rstrip("/") + APIS[api]
    all_headers = request_headers(api_key, headers)
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=100)
    with frozen_heap():  # no ~130 ms collection of the imports inside a timed request (gc_pause.py)
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
            warmup_error = None
            if warmup and workload:  # untimed; a distinct prompt, so request 0 finds no prefix it put in the cache
                first = replace(workload[0], shared=())
                body = request_body(api, model, prompt_ids(0, first, vocab_size, seed + 1), first.output_len)
                warmup_error = (await _request(client, url, body, all_headers, timeout_s))[3]

            async def one(i: int, w: WorkloadRequest):
                body = request_body(api, model, prompt_ids(i, w, vocab_size, seed), w.output_len)
                await asyncio.sleep(max(0.0, start + w.arrival_time - time.perf_counter()))
                async with semaphore:
                    return await _request(client, url, body, all_headers, timeout_s, (disconnect or {}).get(i))

            start = time.perf_counter()
            outcomes = await asyncio.gather(*(one(i, w) for i, w in enumerate(workload)))
    records = [_record(w, start, *outcome) for w, outcome in zip(workload, outcomes)]
    end_times = [end - start for _, end, _, _ in outcomes]
    return EndpointResult(records, [received.response_id for _, _, received, _ in outcomes],
                          [error for *_, error in outcomes], max(end_times, default=0.0), end_times, start,
                          warmup_error)


def _record(w: WorkloadRequest, start: float, send: float, end: float, received: _Stream,
            error: str | None) -> RequestRecord:
    """The request's arrival is when it was due; its latencies start at the send (RequestRecord.send_time)."""
    usage = received.completion_tokens is not None
    return RequestRecord(prompt_len=received.prompt_tokens or w.prompt_len, output_len=w.output_len,
                         arrival_time=w.arrival_time, token_times=[t - start for t in received.chunk_times],
                         error=error, send_time=send - start,
                         num_output_tokens=received.completion_tokens if usage else received.text_chunks,
                         output_token_source="usage" if usage else "chunks", end_time=end - start,
                         response_id=received.response_id)


def scrape_metrics(endpoint: str) -> dict:
    """The server's Prometheus /metrics as {sample name: [(labels, value)]}; {} when it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(endpoint.rstrip("/").removesuffix("/v1") + "/metrics", timeout=5.0)
        if response.status_code != 200:
            return {}
        samples: dict = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        return samples
    except (httpx.HTTPError, ValueError):
        return {}


def _total(samples: dict, name: str, **labels) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's histogram_quantile: the q-quantile of cumulative bucket counts {upper bound: count},
    linear within the bucket it falls in."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    rank, lower, below = q * total, 0.0, 0.0
    for upper in bounds:
        if buckets[upper] >= rank:
            if upper == float("inf"):
                return lower
            inside = buckets[upper] - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, buckets[upper]
    return lower


def server_figures(before: dict, after: dict) -> dict:
    """What the run added to the server's vLLM-named metrics: the scheduling delay (its queue-time histogram,
    median and p99), its mean tokens per engine step and the number of requests it finished. {} when the server
    exposes none of them."""
    figures = {}
    name = "vllm:request_queue_time_seconds_bucket"
    if name in after:
        buckets: dict[float, float] = {}
        for labels, value in after[name]:
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
        for labels, value in before.get(name, []):
            buckets[float(labels["le"])] -= value
        if buckets and buckets[max(buckets)] > 0:
            figures |= {"median_scheduling_delay_ms": 1000 * histogram_quantile(0.5, buckets),
                        "p99_scheduling_delay_ms": 1000 * histogram_quantile(0.99, buckets),
                        "scheduling_delay_source": "server"}
    steps = _total(after, "vllm:iteration_tokens_total_count") - _total(before, "vllm:iteration_tokens_total_count")
    if steps > 0:  # the engine's mean tokens per step (its iteration-tokens histogram's sum over its count)
        figures["server_mean_step_tokens"] = (_total(after, "vllm:iteration_tokens_total_sum")
                                       - _total(before, "vllm:iteration_tokens_total_sum")) / steps
    if "vllm:request_success_total" in after:
        figures["server_requests"] = int(_total(after, "vllm:request_success_total")
                                         - _total(before, "vllm:request_success_total"))
    return figures


def wait_healthy(base_url: str, timeout_s: float, process=None) -> None:
    """Poll <base>/health until it answers 200; raise RuntimeError on timeout or if `process` exits."""
    deadline = time.monotonic() + timeout_s
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was healthy")
        try:
            if httpx.get(health, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy at {health} within {timeout_s:.0f} s")
