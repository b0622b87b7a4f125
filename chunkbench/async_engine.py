"""The engine in a background thread, fed by asyncio callers: what `chunkbench serve` stands on.

Callers submit a request and read its tokens from an asyncio queue; the thread adds, aborts and steps.
Torch releases the GIL inside its kernels, so the event loop keeps serving HTTP while a step runs.

The loop is supervised: a step that raises fails the requests it carried (their queues get an error
event), frees their KV blocks, and the loop goes on. If the loop itself cannot go on (the scheduler
raised, or steps keep failing), every waiting caller gets an error, `dead` says why, and later
submissions fail at once, so nothing hangs on a queue no one will feed.

Prometheus metrics are recorded from the engine thread (prometheus_client is thread-safe), under vLLM
v1's names and labels (vllm/v1/metrics/loggers.py), so a vLLM dashboard reads them unchanged.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.outputs import SchedulerOutput, StepResult
from chunkbench.engine.request import Request, RequestStatus, SamplingParams


@dataclass
class TokenEvent:
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # "rejected": a bad request; "error": the engine failed it
    error: str | None = None
    stop_reason: int | None = None  # the stop_token_ids entry that ended it


# vLLM's buckets for its latency histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class EngineStats:
    """The /metrics registry: one per server, labelled model_name and engine as vLLM labels them."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}

        def metric(kind, name, doc, **kw):
            return kind(name, doc, list(labels), registry=self.registry, **kw).labels(**labels)

        self.running = metric(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = metric(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = metric(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.gpu_kv_usage = metric(Gauge, "vllm:gpu_cache_usage_perc", "KV-cache usage (vLLM's older name).")
        self.preemptions = metric(Counter, "vllm:num_preemptions", "Cumulative number of preemptions.")
        self.prompt_tokens = metric(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = metric(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.iteration_tokens = metric(Histogram, "vllm:iteration_tokens_total", "Number of tokens per engine step.",
                                       buckets=ITERATION_BUCKETS)
        self.ttft = metric(Histogram, "vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                           buckets=TTFT_BUCKETS)
        self.itl = metric(Histogram, "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.",
                          buckets=TOKEN_LATENCY_BUCKETS)
        self.tpot = metric(Histogram, "vllm:time_per_output_token_seconds", "Mean time per output token of a "
                           "request, in seconds.", buckets=TOKEN_LATENCY_BUCKETS)
        self.e2e = metric(Histogram, "vllm:e2e_request_latency_seconds", "End to end request latency in seconds.",
                          buckets=REQUEST_LATENCY_BUCKETS)
        self.queue_time = metric(Histogram, "vllm:request_queue_time_seconds", "Time spent in WAITING phase for "
                                 "request.", buckets=REQUEST_LATENCY_BUCKETS)
        tokens = buckets_1_2_5(max_model_len)
        self.request_prompt = metric(Histogram, "vllm:request_prompt_tokens", "Prompt tokens per request.",
                                     buckets=tokens)
        self.request_generation = metric(Histogram, "vllm:request_generation_tokens", "Generated tokens per "
                                         "request.", buckets=tokens)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                [*labels, "finished_reason"], registry=self.registry)
        self.success = {reason: self._success.labels(**labels, finished_reason=reason)
                        for reason in ("stop", "length", "abort")}
        # chunkbench only
        self.step_time = metric(Histogram, "chunkbench:step_seconds", "Engine step duration in seconds.",
                                buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.step_failures = metric(Counter, "chunkbench:step_failures", "Engine steps that raised; the "
                                    "requests they carried failed.")

    def record_step(self, output: SchedulerOutput, result: StepResult) -> None:
        self.step_time.observe(result.seconds)
        self.iteration_tokens.observe(output.num_tokens)
        self.preemptions.inc(len(output.preempted))

    def record_finished(self, request: Request, now: float) -> None:
        if request.finish_reason not in self.success:
            return
        self.success[request.finish_reason].inc()
        self.e2e.observe(max(0.0, (request.token_times[-1] if request.token_times else now) - request.arrival_time))
        if request.first_scheduled_time is not None:
            self.queue_time.observe(max(0.0, request.first_scheduled_time - request.arrival_time))
        self.request_prompt.observe(request.num_prompt_tokens)
        self.request_generation.observe(request.num_output_tokens)
        times = request.token_times
        if times:
            self.ttft.observe(max(0.0, times[0] - request.arrival_time))
        for a, b in zip(times, times[1:]):
            self.itl.observe(b - a)
        if len(times) > 1:
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))

    def render(self, engine: LLMEngine) -> bytes:
        self.running.set(len(engine.scheduler.running))
        self.waiting.set(len(engine.scheduler.waiting))
        usage = engine.block_manager.num_used_blocks / engine.block_manager.num_blocks
        self.kv_usage.set(usage)
        self.gpu_kv_usage.set(usage)
        return generate_latest(self.registry)


class AsyncEngine:
    MAX_CONSECUTIVE_FAILURES = 8  # failed steps in a row before the loop gives up (a broken device)

    def __init__(self, engine: LLMEngine, model_name: str | None = None) -> None:
        self.engine = engine
        self.stats = EngineStats(model_name or engine.config.model.name, engine.config.scheduler.max_model_len)
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._failures = 0
        self.dead: str | None = None  # why the loop stopped for good
        self.finished: dict[str, Request] = {}  # recent finished requests, for their server-side timings
        # LLMEngine.step() does not say which requests a step that raised carried: keep its schedule.
        self._scheduled: SchedulerOutput | None = None
        schedule = engine.scheduler.schedule

        def recording_schedule(now: float = 0.0) -> SchedulerOutput:
            self._scheduled = schedule(now)
            return self._scheduled

        engine.scheduler.schedule = recording_schedule
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    @property
    def healthy(self) -> bool:
        return self.dead is None and self.thread.is_alive()

    def submit(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
               arrival_time: float) -> asyncio.Queue:
        stream: asyncio.Queue = asyncio.Queue()
        if not self.healthy:
            stream.put_nowait(TokenEvent([], True, "error", f"the engine is not running: {self.dead}"))
            return stream
        self._commands.put(("add", request_id, prompt_token_ids, sampling, arrival_time,
                            asyncio.get_running_loop(), stream))
        self._wake.set()
        if not self.healthy:  # it died while we queued: its last act may have missed our command
            self._fail_queued_commands()
        return stream

    def abort(self, request_id: str, keep_tokens: int | None = None) -> None:
        """Stop the request. With `keep_tokens`, the server ended it (a stop string in that many tokens): it
        finishes as stopped with those tokens, as vLLM counts it, not as aborted."""
        self._commands.put(("abort", request_id, keep_tokens))
        self._wake.set()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)

    def _emit(self, request_id: str, event: TokenEvent) -> None:
        """Hand an event to the request's caller; the last one (finished) also drops its stream."""
        loop, stream, _ = self._streams.pop(request_id) if event.finished else self._streams[request_id]
        try:
            loop.call_soon_threadsafe(stream.put_nowait, event)
        except RuntimeError:  # the caller's event loop is closed: no one is listening
            self._streams.pop(request_id, None)

    def _fail(self, request_id: str, message: str) -> None:
        if request_id in self._streams:
            self._emit(request_id, TokenEvent([], True, "error", message))

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._run_commands()
                if not self.engine.has_unfinished():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self._step()
        except BaseException as exc:  # noqa: BLE001 - anything that stops the loop must fail its callers
            self.dead = f"{type(exc).__name__}: {exc}"
            self._fail_everything(f"the engine stopped: {self.dead}")

    def _drain(self):
        """The queued commands, taken one at a time until none is left."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_commands(self) -> None:
        for command in self._drain():
            if command[0] == "add":
                _, request_id, prompt, sampling, arrival, loop, stream = command
                self._streams[request_id] = (loop, stream, 0)
                try:
                    request = self.engine.add_request(prompt, sampling, request_id=request_id, arrival_time=arrival)
                except Exception as exc:  # noqa: BLE001 - this request fails, not the loop
                    self._fail(request_id, f"could not add the request: {type(exc).__name__}: {exc}")
                    continue
                if request.error:  # the next step() hands it back too, with no stream to feed
                    self._emit(request_id, TokenEvent([], True, "rejected", request.error))
            else:
                _, request_id, keep_tokens = command
                aborted = self.engine.abort(request_id)
                self._streams.pop(request_id, None)
                if aborted is not None:
                    if keep_tokens is not None:
                        aborted.status = RequestStatus.FINISHED_STOPPED
                        del aborted.output_token_ids[keep_tokens:], aborted.token_times[keep_tokens:]
                    self._remember(aborted)

    def _step(self) -> None:
        self._scheduled = None
        try:
            updated = self.engine.step()
        except Exception as exc:
            self._failures += 1
            if self._scheduled is None or self._failures >= self.MAX_CONSECUTIVE_FAILURES:
                raise  # the scheduler itself failed, or every step does: the loop cannot go on
            self._fail_step(self._scheduled, exc)
            return
        self._failures = 0
        for request in updated:
            entry = self._streams.get(request.request_id)
            if entry is None or request.error:
                continue
            loop, stream, sent = entry
            new = request.output_token_ids[sent:]
            if sent == 0 and new:
                self.stats.prompt_tokens.inc(request.num_prompt_tokens)
            self.stats.generation_tokens.inc(len(new))
            self._streams[request.request_id] = (loop, stream, sent + len(new))
            if request.is_finished:  # before its caller hears of it: a reply may be read as soon as it is sent
                self._remember(request)
            self._emit(request.request_id, TokenEvent(new, request.is_finished, request.finish_reason,
                                                      stop_reason=request.stop_reason))
        if self.engine.last_step is not None:
            self.stats.record_step(*self.engine.last_step)
        else:  # nothing schedulable right now (e.g. only rejections handed back): do not spin
            self._wake.wait(timeout=0.01)
            self._wake.clear()

    def _fail_step(self, output: SchedulerOutput, exc: Exception) -> None:
        """Fail the requests a raising step carried; aborting them frees their KV blocks."""
        self.stats.step_failures.inc()
        message = f"the engine step failed: {type(exc).__name__}: {exc}"
        for chunk in output.chunks:
            request = self.engine.abort(chunk.request_id)
            if request is not None:
                self._remember(request, record=False)  # not a success, so not in vllm:request_success
            self._fail(chunk.request_id, message)

    def _fail_everything(self, message: str) -> None:
        for request_id in list(self.engine.scheduler.requests):
            try:
                self.engine.abort(request_id)
            except Exception:  # noqa: BLE001 - free what can be freed; the callers hear of it below
                pass
        for request_id in list(self._streams):
            self._fail(request_id, message)
        self._fail_queued_commands()

    def _fail_queued_commands(self) -> None:
        for command in self._drain():
            if command[0] == "add":
                loop, stream = command[5], command[6]
                event = TokenEvent([], True, "error", f"the engine is not running: {self.dead}")
                try:
                    loop.call_soon_threadsafe(stream.put_nowait, event)
                except RuntimeError:
                    pass

    def _remember(self, request: Request, record: bool = True) -> None:
        if record:
            self.stats.record_finished(request, self.engine.clock.now())
        self.finished[request.request_id] = request
        while len(self.finished) > 10000:
            self.finished.pop(next(iter(self.finished)))


def now() -> float:
    return time.perf_counter()
