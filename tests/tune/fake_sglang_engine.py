"""The fake SGLang server's engine (tests/tune/fake_sglang.py): SGLang 0.5.23's scheduler in small, on sleeps,
and its Prometheus metrics under SGLang's names.

One loop runs forward passes. A pass's prefill is built as SGLang's PrefillAdder builds it: the request part-way
through its prompt first, then waiting requests in arrival order while --max-running-requests has room, at most
--max-prefill-tokens prompt tokens in all (a first request larger than that runs alone), and at most
--chunked-prefill-size of them (-1: no chunking): a prompt that does not fit is cut there and ends the batch, and
its rest goes first next pass. Running requests decode one token in each pass without a prefill, and in a
prefill pass too with --enable-mixed-chunk (else they wait it out). A pass takes --fake-step-ms plus
--fake-token-us per token it computes (prefill tokens and one per decode), so a smaller chunk costs a long
prompt more passes (its TTFT grows) and a larger one stalls the decodes longer. The pass that ends a prompt
samples its first token. Outputs go out per --stream-interval as SGLang's output streamer sends them: the first
token at once, then every stream-interval tokens, and the last. No KV cache is modelled: nothing is preempted.

Metrics (sglang/srt/observability/metrics_collector.py): the scheduler's gauges and queue-time histogram with its
labels (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank), the tokenizer's counters and latency histograms
with theirs (model_name, engine_type, and is_streaming where SGLang adds it), with SGLang's buckets; no _created
samples, as SGLang's multiprocess collector writes none. Health checks are not counted (SGLang's
log_metrics=False); the warm-up request is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

DEFAULT_CHUNK = 8192  # SGLang's chunked_prefill_size when unset, on a GPU of 60 to 160 GB
DEFAULT_MAX_RUNNING = 256

QUEUE_BUCKETS = [0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90]
QUEUE_BUCKETS += [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100]
ITL_BUCKETS += [0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
TOKEN_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500]
TOKEN_BUCKETS += [15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000]
TOKEN_BUCKETS += [300000, 400000, 600000, 800000, 1000000, 1100000]


@dataclass(eq=False)
class Req:
    prompt: int
    max_new: int
    stream: bool = True
    counted: bool = True  # in the metrics; health checks are not
    created: float = field(default_factory=time.perf_counter)
    prefilled: int = 0
    generated: int = 0
    sent: int = 0  # tokens already output
    first_out: float = 0.0
    last_out: float = 0.0
    scheduled: bool = False
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)  # (new tokens, finished) per output

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_new


class Engine:
    def __init__(self, args, metrics: Metrics):
        size = args.chunked_prefill_size or DEFAULT_CHUNK
        self.chunk = size if size > 0 else None
        self.budget = args.max_prefill_tokens
        self.max_running = args.max_running_requests or DEFAULT_MAX_RUNNING
        self.mixed, self.interval = args.enable_mixed_chunk, max(1, args.stream_interval)
        self.step_s, self.token_s = args.fake_step_ms / 1e3, args.fake_token_us / 1e6
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked: Req | None = None  # the request part-way through its prompt
        self.wake = asyncio.Event()
        self.metrics = metrics
        self.passes = 0

    def submit(self, req: Req) -> Req:
        self.waiting.append(req)
        self.wake.set()
        self._gauges()
        return req

    async def abort(self, req: Req) -> None:
        """A request whose client left: SGLang aborts it 2 s after its response closed (a background task of the
        response), if it has not finished by then; it is counted as aborted and as finished."""
        await asyncio.sleep(2.0)
        if req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        req.max_new = req.generated  # finished: a pass under way leaves it alone
        if req.counted:
            self.metrics.aborted.inc()
            self.metrics.finish(req, time.perf_counter(), aborted=True)
        self._gauges()

    def prefill_batch(self) -> list[tuple[Req, int]]:
        """(request, prompt tokens) of the next pass's prefill, as the module docstring says."""
        batch: list[tuple[Req, int]] = []
        input_left, chunk_left = self.budget, self.chunk
        slots = self.max_running - len(self.running) - (self.chunked is not None)
        for req in ([self.chunked] if self.chunked else []) + list(self.waiting):
            if req is not self.chunked and slots <= 0:
                break
            left = req.prompt - req.prefilled
            take = left if chunk_left is None else min(left, chunk_left)
            if take <= 0 or (batch and take > input_left):
                break
            batch.append((req, take))
            input_left -= take
            chunk_left = None if chunk_left is None else chunk_left - take
            slots -= req is not self.chunked
            if take < left:  # cut: the chunked request ends the batch
                break
        return batch

    async def run(self) -> None:
        while True:
            if not (self.waiting or self.running or self.chunked):
                self.wake.clear()
                await self.wake.wait()
                continue
            prefill = self.prefill_batch()
            decodes = list(self.running) if self.mixed or not prefill else []
            now = time.perf_counter()
            for req, _ in prefill:
                if not req.scheduled:  # its wait before its first forward pass
                    req.scheduled = True
                    self.waiting.remove(req)
                    if req.counted:
                        self.metrics.queue_time.observe(now - req.created)
            self._gauges(prefilling=len(prefill))
            tokens = sum(take for _, take in prefill)
            await asyncio.sleep(self.step_s + (tokens + len(decodes)) * self.token_s)
            self.passes += 1
            self.metrics.forward_pass(tokens, len(decodes))
            for req, take in prefill:
                if req.finished:  # aborted under way
                    continue
                req.prefilled += take
                if req.prefilled < req.prompt:
                    self.chunked = req
                    continue
                if self.chunked is req:
                    self.chunked = None
                self.running.append(req)
                self._output(req)
            for req in decodes:
                if not req.finished:
                    self._output(req)
            self.running = [r for r in self.running if not r.finished]
            self._gauges(prefilling=self.chunked is not None)

    def _output(self, req: Req) -> None:
        req.generated += 1
        unsent = req.generated - req.sent
        if not (req.finished or self.interval == 1 or unsent >= self.interval or req.sent == 0):
            return
        now = time.perf_counter()
        req.first_out = req.first_out or now
        if req.counted:
            self.metrics.output(req, now, unsent)
        req.sent, req.last_out = req.generated, now
        req.outputs.put_nowait((unsent, req.finished))

    def _gauges(self, prefilling: int = 0) -> None:
        """Running: the requests in a batch (decoding, or part-way through their prompt); queued: the rest."""
        self.metrics.running.set(len(self.running) + prefilling)
        self.metrics.queued.set(len(self.waiting))


class Metrics:
    """SGLang's Prometheus metrics that a benchmark reads, in a registry of their own."""

    def __init__(self, served: str, max_total_tokens: int, context_len: int):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()
        self.registry = CollectorRegistry()
        sched = {"model_name": served, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.labels = {"model_name": served, "engine_type": "unified"}

        def make(kind, name: str, labels: dict, extra: tuple = (), **kw):
            return kind(name, name.split(":")[1].replace("_", " "), [*labels, *extra], registry=self.registry, **kw)

        self.running = make(Gauge, "sglang:num_running_reqs", sched).labels(**sched)
        self.queued = make(Gauge, "sglang:num_queue_reqs", sched).labels(**sched)
        self.max_total_tokens = max_total_tokens
        make(Gauge, "sglang:max_total_num_tokens", sched).labels(**sched).set(max_total_tokens)
        make(Gauge, "sglang:context_len", sched).labels(**sched).set(context_len)
        self.queue_time = make(Histogram, "sglang:queue_time_seconds", sched, buckets=QUEUE_BUCKETS).labels(**sched)
        self.passes = make(Counter, "sglang:cuda_graph_passes_total", sched, ("mode",))
        self.realtime = make(Counter, "sglang:realtime_tokens_total", sched, ("mode",))
        self.sched = sched
        tok, streaming = self.labels, ("is_streaming",)
        self.prompt_tokens = make(Counter, "sglang:prompt_tokens_total", tok, streaming)
        self.generation_tokens = make(Counter, "sglang:generation_tokens_total", tok, streaming)
        self.requests = make(Counter, "sglang:num_requests_total", tok, streaming)
        self.aborted = make(Counter, "sglang:num_aborted_requests_total", tok).labels(**tok)
        self.ttft = make(Histogram, "sglang:time_to_first_token_seconds", tok, streaming, buckets=TTFT_BUCKETS)
        self.itl = make(Histogram, "sglang:inter_token_latency_seconds", tok, buckets=ITL_BUCKETS).labels(**tok)
        self.tpot = make(Histogram, "sglang:request_time_per_output_token_seconds", tok, streaming, buckets=ITL_BUCKETS)
        self.e2e = make(Histogram, "sglang:e2e_request_latency_seconds", tok, streaming, buckets=E2E_BUCKETS)
        self.prompt_hist = make(Histogram, "sglang:prompt_tokens_histogram", tok, buckets=TOKEN_BUCKETS)
        self.generation_hist = make(Histogram, "sglang:generation_tokens_histogram", tok, buckets=TOKEN_BUCKETS)

    def forward_pass(self, prefill_tokens: int, decodes: int) -> None:
        """A pass with a prefill counts as a prefill pass (a mixed chunk's decodes are not in its tokens)."""
        mode = "prefill_none" if prefill_tokens else "decode_none"
        self.passes.labels(**self.sched, mode=mode).inc()
        self.realtime.labels(**self.sched, mode="prefill_compute" if prefill_tokens else "decode").inc(
            prefill_tokens or decodes
        )

    def output(self, req: Req, now: float, new_tokens: int) -> None:
        """What SGLang's tokenizer manager observes of one output: its TTFT or ITL, then the request if it ended."""
        streaming = {**self.labels, "is_streaming": "true" if req.stream else "false"}
        if req.sent == 0:
            self.ttft.labels(**streaming).observe(now - req.created)
        else:  # as SGLang's batched observe: the interval in _sum, each new token in the bucket of interval/n
            for _ in range(new_tokens):
                self.itl.observe((now - req.last_out) / new_tokens)
        if req.finished:
            self.finish(req, now)

    def finish(self, req: Req, now: float, aborted: bool = False) -> None:
        streaming = {**self.labels, "is_streaming": "true" if req.stream else "false"}
        self.prompt_tokens.labels(**streaming).inc(req.prompt)
        self.generation_tokens.labels(**streaming).inc(req.generated)
        self.requests.labels(**streaming).inc()
        self.e2e.labels(**streaming).observe(now - req.created)
        if req.generated > 1 and not aborted:  # SGLang's TPOT: of requests that stopped or reached their length
            self.tpot.labels(**streaming).observe((now - req.first_out) / (req.generated - 1))
        self.prompt_hist.labels(**self.labels).observe(req.prompt)
        self.generation_hist.labels(**self.labels).observe(req.generated)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
