"""`chunkbench bench --endpoint`: the workloads and metrics of `run`, against any OpenAI-compatible server
(chunkbench serve, vLLM, SGLang). An async client sends each request at its arrival time, streams, and
timestamps every chunk; failures are kept with their error.

Prompts are token ids (the /v1/completions API accepts them), the same ids `run` feeds the engine;
`ignore_eos` and `max_tokens` make every request produce its workload's output length, as vLLM's
`bench serve` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from chunkbench.harness import prompt_ids
from chunkbench.metrics import RequestRecord
from chunkbench.workload import WorkloadRequest


@dataclass
class EndpointResult:
    records: list[RequestRecord]
    response_ids: list[str | None]
    errors: list[str | None]
    duration: float


async def _one(client: httpx.AsyncClient, url: str, model: str | None, prompt: list[int], w: WorkloadRequest,
               start: float, semaphore: asyncio.Semaphore | None, disconnect_after: int | None):
    await asyncio.sleep(max(0.0, start + w.arrival_time - time.perf_counter()))
    body = {"prompt": prompt, "max_tokens": w.output_len, "temperature": 0.0, "ignore_eos": True, "stream": True}
    if model:
        body["model"] = model
    async with semaphore or _nothing():
        sent = time.perf_counter()
        times: list[float] = []
        response_id = None
        try:
            async with client.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    return sent, times, response_id, f"HTTP {response.status_code}: {text[:300]}"
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    response_id = event.get("id", response_id)
                    if any(c.get("text") or (c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                        times.append(time.perf_counter())
                        if disconnect_after is not None and len(times) >= disconnect_after:
                            return sent, times, response_id, "disconnected by the client"
        except httpx.HTTPError as exc:
            return sent, times, response_id, f"{type(exc).__name__}: {exc}"
        error = None if len(times) >= 1 else "no tokens received"
        return sent, times, response_id, error


class _nothing:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


async def bench_endpoint(endpoint: str, workload: list[WorkloadRequest], vocab_size: int, model: str | None = None,
                         max_concurrency: int | None = None, seed: int = 0, timeout_s: float = 600.0,
                         disconnect: dict[int, int] | None = None) -> EndpointResult:
    """`disconnect` maps request index -> tokens after which that client hangs up (for robustness tests)."""
    url = endpoint.rstrip("/") + "/completions"
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max_concurrency or 1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(
            _one(client, url, model, prompt_ids(i, w, vocab_size, seed), w, start, semaphore,
                 (disconnect or {}).get(i))
            for i, w in enumerate(workload)))
    records, ids, errors = [], [], []
    for w, (sent, times, response_id, error) in zip(workload, outcomes):
        # The request "arrives" when it was due; a client-side queue (max concurrency) counts as waiting.
        records.append(RequestRecord(prompt_len=w.prompt_len, output_len=w.output_len, arrival_time=w.arrival_time,
                                     token_times=[t - start for t in times] if not error else [],
                                     first_scheduled_time=sent - start, error=error))
        ids.append(response_id)
        errors.append(error)
    ends = [r.token_times[-1] for r in records if r.ok]
    return EndpointResult(records, ids, errors, max(ends, default=0.0))


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
