"""`chunkbench bench --endpoint`: the workloads and metrics of `run`, against any OpenAI-compatible server
(chunkbench serve, vLLM, SGLang), measured as `vllm bench serve` measures them, by the rules of one release
(chunkbench/bench/client_rules.py; 0.32's unless given). Each request's body and the read of its event stream
are chunkbench/bench/openai_stream.py's; this is the run loop around them (_dispatch: each request sent when due,
after waiting for a --max-concurrency slot; latencies start at the send).

A request fails, and is kept with its error, when its stream fails, on a dropped connection, or at its timeout.
As vLLM, no warm-up unless `num_warmups` asks for some. The HTTP client is aiohttp with vllm bench serve's
connection settings, so chunkbench's client costs are vLLM's (docs/measurements/client.md, "The HTTP library").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
import httpx

from chunkbench import web
from chunkbench.bench.client_rules import OLDEST, ClientRules
from chunkbench.bench.gc_pause import frozen_heap
from chunkbench.bench.harness import prompt_ids
from chunkbench.bench.metrics import RequestRecord
from chunkbench.bench.openai_stream import (
    APIS,
    Prepared,
    Received,
    prepare,
    probe_body,
    read_stream,
    request_body,
    request_headers,
)
from chunkbench.workloads.arrivals import check_real_time
from chunkbench.workloads.spec import WorkloadRequest


@dataclass(frozen=True)
class EndpointResult:
    records: list[RequestRecord]  # times relative to `start`; failed requests keep the chunk times they got
    response_ids: list[str | None]
    errors: list[str | None]
    duration: float  # clock start to the end of the last request, failed ones too (s)
    end_times: list[float] = field(default_factory=list)  # when each request ended, relative to start (s)
    start: float = 0.0  # time.perf_counter() at the clock start, after any warm-ups
    warmup_error: str | None = None  # a warm-up's failure (the run goes on), None when they passed or were off
    probes: list[tuple[float, str | None]] = field(default_factory=list)  # --probe-request-rate: (E2EL s, error)


async def _request(
    session: aiohttp.ClientSession,
    url: str,
    body: Prepared,
    headers: dict,
    timeout_s: float,
    disconnect_after: int | None = None,
    rules: ClientRules = OLDEST,
) -> tuple[float, float, Received, str | None]:
    """(send time, end time, what arrived, error): one request, failures caught and named."""
    received = Received()
    send = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            error = await read_stream(session, url, body, headers, received, disconnect_after, rules)
    except TimeoutError:
        error = f"timed out after {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    if error is None and not received.chunk_times:
        error = "no tokens received"
    return send, time.perf_counter(), received, error


async def bench_endpoint(
    endpoint: str,
    workload: list[WorkloadRequest],
    vocab_size: int,
    model: str | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    timeout_s: float = 600.0,
    disconnect: dict[int, int] | None = None,
    *,
    api: str = "completions",
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    num_warmups: int = 0,
    sampling: dict | None = None,
    probe_rate: float = 0.0,
    rules: ClientRules = OLDEST,
) -> EndpointResult:
    """Run `workload` against `endpoint` (the base URL, e.g. http://host:8000/v1).

    timeout_s: per request, from its send to its end; a request past it fails. api: "completions" or "chat".
    sampling: request fields from SAMPLING_FIELDS (none by default, as vLLM 0.32). num_warmups: untimed copies
    of request 0 sent at once before the clock starts (vLLM's --num-warmups, default 0).
    `disconnect` maps request index -> chunks after which that client hangs up (for robustness tests).
    probe_rate: as vllm bench serve's --probe-request-rate, one-token requests ("Hi", one token out) one at a
    time beside the load, each followed by a pause of 1/probe_rate s, outside --max-concurrency's slots, from
    before the first request until the last has ended; their E2ELs are kept apart (EndpointResult.probes).
    rules: the vLLM release's client rules (client_rules.py): how chat chunks are timed, whether the probes
    share the pool and count in the duration, whether the server's per-request metrics are kept."""
    if api not in APIS:
        raise ValueError(f"api must be one of {', '.join(APIS)}, got {api!r}")
    check_real_time(workload, "the server")
    url = endpoint.rstrip("/") + APIS[api]
    all_headers = request_headers(api_key, headers) | {"content-type": "application/json"}
    bodies = [
        prepare(request_body(api, model, prompt_ids(i, w, vocab_size, seed), w.output_len, sampling))
        for i, w in enumerate(workload)
    ]
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def limited(body: Prepared, disconnect_after: int | None = None):
        async with semaphore:
            return await _request(session, url, body, all_headers, timeout_s, disconnect_after, rules)

    connection = _connection(max_concurrency)
    with frozen_heap():  # no full collection of the imports inside a timed request (chunkbench/bench/gc_pause.py)
        async with aiohttp.ClientSession(**connection) as session:
            await _first_contact(session, endpoint)
            warmups = await asyncio.gather(*(limited(bodies[0]) for _ in range(num_warmups if bodies else 0)))
            warmup_error = next((error for *_, error in warmups if error), None)
            probes: list[tuple[float, str | None]] = []
            probing = asyncio.Event()
            prober = (
                asyncio.create_task(
                    _probe_loop(
                        session,
                        url,
                        probe_body(api, model, sampling),
                        all_headers,
                        timeout_s,
                        probe_rate,
                        probes,
                        probing,
                        rules,
                    )
                )
                if probe_rate
                else None
            )
            start, dispatched, outcomes = await _dispatch(workload, bodies, limited, disconnect or {})
            if prober is not None:
                probing.set()
                await prober
            probes_end = time.perf_counter() if prober is not None and rules.probe_tail_in_duration else None
    return _result(workload, start, dispatched, outcomes, warmup_error, probes, probes_end)


def _connection(max_concurrency: int | None) -> dict:
    """vllm bench serve's session: a pool of at most max_concurrency connections (0: no limit), kept alive 60 s,
    proxies from the environment (HTTP_PROXY, NO_PROXY) as there."""
    connector = aiohttp.TCPConnector(
        limit=max_concurrency or 0,
        limit_per_host=max_concurrency or 0,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
    )
    timeout = aiohttp.ClientTimeout(total=None)  # each request's own limit is asyncio.timeout in _request
    return dict(connector=connector, timeout=timeout, trust_env=True)


async def _first_contact(session: aiohttp.ClientSession, endpoint: str) -> None:
    """One GET of /metrics before the clock: the client's lazy imports and the first connection then block no
    timed send. No generation: the server is not warmed."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with session.get(endpoint.rstrip("/").removesuffix("/v1") + "/metrics") as response:
            await response.read()


async def _dispatch(workload: list[WorkloadRequest], bodies: list[Prepared], send, disconnect: dict[int, int]):
    """Start the clock and send each request when it is due, in arrival order (list order on ties); return the
    clock start, when each request was dispatched, and each one's outcome once all have ended. Every body is
    built and encoded before the clock starts, so a send costs the loop a task and a write; how late the loop
    dispatched each request against its due time is kept (send lag)."""
    order = sorted(range(len(workload)), key=lambda i: workload[i].arrival_time)  # stable: list order on ties
    dispatched = [0.0] * len(workload)
    tasks: dict[int, asyncio.Task] = {}
    start = time.perf_counter()
    for i in order:  # vLLM's get_request: sleep to the due time, then start the request's task
        due = start + workload[i].arrival_time
        if due > time.perf_counter():
            await asyncio.sleep(due - time.perf_counter())
        dispatched[i] = time.perf_counter()
        tasks[i] = asyncio.create_task(send(bodies[i], disconnect.get(i)))
    return start, dispatched, [await tasks[i] for i in range(len(workload))]


def _result(
    workload: list[WorkloadRequest],
    start: float,
    dispatched: list[float],
    outcomes: list,
    warmup_error: str | None,
    probes: list[tuple[float, str | None]],
    probes_end: float | None = None,
) -> EndpointResult:
    """The run's records and per-request outcomes, times relative to the clock start. The duration ends with
    the last request, or (0.32's rules, `probes_end`) when the probes had stopped, if later."""
    records = [_record(w, start, dispatch, *outcome) for w, dispatch, outcome in zip(workload, dispatched, outcomes)]
    end_times = [end - start for _, end, _, _ in outcomes]
    return EndpointResult(
        records,
        [received.response_id for _, _, received, _ in outcomes],
        [error for *_, error in outcomes],
        max([*end_times, probes_end - start] if probes_end is not None else end_times, default=0.0),
        end_times,
        start,
        warmup_error,
        probes,
    )


async def _probe_loop(
    session,
    url: str,
    body: Prepared,
    headers: dict,
    timeout_s: float,
    rate: float,
    into: list[tuple[float, str | None]],
    stop: asyncio.Event,
    rules: ClientRules = OLDEST,
) -> None:
    """One probe at a time until `stop`: send, wait for its end, pause 1/rate s (as vLLM's probe_loop). 0.33's
    rules: on a connection of their own (vLLM's session of one), the pause cut short by `stop` (the clock has
    stopped); 0.32's: through the run's pool, and the last pause waited out (the duration holds it)."""
    async with contextlib.AsyncExitStack() as stack:
        if rules.probes_own_connection:
            session = await stack.enter_async_context(aiohttp.ClientSession(**_connection(1)))
        while not stop.is_set():
            send, end, _, error = await _request(session, url, body, headers, timeout_s, rules=rules)
            into.append((end - send, error))
            if rules.probe_tail_in_duration:
                await asyncio.sleep(1.0 / rate)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)


def _record(
    w: WorkloadRequest, start: float, dispatch: float, send: float, end: float, received: Received, error: str | None
) -> RequestRecord:
    """The request's arrival is when it was due; the loop dispatched it at `dispatch` (the send lag after the
    due time), it was sent at `send` (after any wait for a slot), and its latencies start there."""
    usage = received.completion_tokens is not None
    return RequestRecord(
        prompt_len=received.prompt_tokens or w.prompt_len,
        output_len=w.output_len,
        arrival_time=w.arrival_time,
        token_times=[t - start for t in received.chunk_times],
        error=error,
        send_time=send - start,
        dispatch_time=dispatch - start,
        num_output_tokens=received.completion_tokens if usage else received.text_chunks,
        output_token_source="usage" if usage else "chunks",
        end_time=end - start,
        response_id=received.response_id,
        probe=w.probe,
        server_queue_time=received.server_queue_time,
        server_ttft=received.server_ttft,
    )


def wait_healthy(base_url: str, timeout_s: float, process=None) -> None:
    """Poll <base>/health until it answers 200; raise RuntimeError on timeout or if `process` exits."""
    deadline = time.monotonic() + timeout_s
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was healthy")
        try:
            if web.get(health, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1 if time.monotonic() < deadline - timeout_s + 5 else 0.5)  # a quick start is seen quickly
    raise RuntimeError(f"the server was not healthy at {health} within {timeout_s:.0f} s")
