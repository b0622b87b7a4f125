"""The /metrics registry of `chunkbench serve`, recorded from the engine thread (prometheus_client is
thread-safe), under vLLM v1's names and labels (vllm/v1/metrics/loggers.py), so a vLLM dashboard reads them
unchanged.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.outputs import SchedulerOutput, StepResult
from chunkbench.engine.request import Request

# vLLM's buckets for its latency histograms.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
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
        self.iteration_tokens = metric(
            Histogram, "vllm:iteration_tokens_total", "Number of tokens per engine step.", buckets=ITERATION_BUCKETS
        )
        self.ttft = metric(
            Histogram, "vllm:time_to_first_token_seconds", "Time to first token in seconds.", buckets=TTFT_BUCKETS
        )
        self.itl = metric(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Inter-token latency in seconds.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.tpot = metric(
            Histogram,
            "vllm:time_per_output_token_seconds",
            "Mean time per output token of a request, in seconds.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = metric(
            Histogram,
            "vllm:e2e_request_latency_seconds",
            "End to end request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = metric(
            Histogram,
            "vllm:request_queue_time_seconds",
            "Time spent in WAITING phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        tokens = buckets_1_2_5(max_model_len)
        self.request_prompt = metric(
            Histogram, "vllm:request_prompt_tokens", "Prompt tokens per request.", buckets=tokens
        )
        self.request_generation = metric(
            Histogram, "vllm:request_generation_tokens", "Generated tokens per request.", buckets=tokens
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.success = {
            reason: self._success.labels(**labels, finished_reason=reason) for reason in ("stop", "length", "abort")
        }
        # chunkbench only
        self.step_time = metric(
            Histogram,
            "chunkbench:step_seconds",
            "Engine step duration in seconds.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.step_failures = metric(
            Counter, "chunkbench:step_failures", "Engine steps that raised; the requests they carried failed."
        )

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
