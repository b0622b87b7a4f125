"""The benchmark loop: feed a workload into an LLMEngine at its arrival times, step it, record everything.

On the real clock requests are added when their arrival time has passed and the engine idles (sleeps)
until the next arrival when it has nothing to do. On a virtual clock (the simulator) idle time is skipped.
Either way a request's arrival time is its scheduled arrival, so TTFT counts time it waited behind a
running step. Ctrl-C stops the run and keeps what finished.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chunkbench.bench.gc_pause import paused_gc
from chunkbench.bench.metrics import RequestRecord
from chunkbench.engine.engine import LLMEngine, RealClock
from chunkbench.engine.outputs import StepRecord
from chunkbench.engine.request import Request, SamplingParams
from chunkbench.sim.fastforward import fast_forward
from chunkbench.workloads.arrivals import check_real_time
from chunkbench.workloads.spec import WorkloadRequest


@dataclass
class RunResult:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    duration: float  # first arrival to the last token (s)
    num_kv_blocks: int
    interrupted: bool = False
    wall_seconds: float = 0.0
    server: dict | None = None  # endpoint runs: figures from the server's /metrics (server_metrics.server_figures)
    stopped: bool = False  # `stop` ended the run early: the records are partial, the summary meaningless
    # Per step (aligned with `steps`): the requests it computed, as workload indices (their engine ids), and the
    # tokens each computed, in step order; steps.parquet's request_ids/request_tokens. Empty for endpoint runs.
    step_requests: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)


def prompt_ids(request_index: int, request: WorkloadRequest, vocab_size: int, seed: int) -> list[int]:
    """Deterministic random prompt tokens: the request's shared segments (the same tokens wherever a segment
    key recurs, so prefixes repeat), then its own tokens. Content does not change timing."""
    ids: list[int] = []
    for key, length in request.shared:
        ids += np.random.default_rng([seed, 1, key]).integers(0, vocab_size, length).tolist()
    own = request.prompt_len - len(ids)
    return ids + np.random.default_rng([seed, 0, request_index]).integers(0, vocab_size, own).tolist()


def warm_up(engine: LLMEngine, steps: int = 3) -> None:
    """Run a few unmeasured steps (a budget-sized prefill, then decodes): kernels, allocator, caches."""
    if steps <= 0:
        return
    budget = engine.config.scheduler.max_num_batched_tokens
    length = max(1, min(budget, engine.config.scheduler.max_model_len - steps, 512))
    request = engine.add_request([1] * length, SamplingParams(max_tokens=steps, ignore_eos=True), request_id="warmup")
    while not request.is_finished:
        engine.step()


STOP_CHECK_STEPS = 256  # how often `stop` is asked (steps)


def run_workload(
    engine: LLMEngine,
    workload: list[WorkloadRequest],
    *,
    seed: int = 0,
    warmup_steps: int = 3,
    progress: bool = True,
    description: str = "run",
    stop=None,
) -> RunResult:
    """Serve `workload` on `engine` and record per-request token times and per-step composition.
    `stop(requests, start, now)`, asked every STOP_CHECK_STEPS steps with the requests added so far, may end
    the run early (a capacity probe that has certainly missed its SLA: chunkbench/bench/early_stop.py)."""
    if isinstance(engine.clock, RealClock):  # it sleeps until each arrival
        check_real_time(workload, "the engine")
    if not engine.clock.virtual:
        warm_up(engine, warmup_steps)
    loop = WorkloadLoop(engine, workload, seed)
    wall_start = time.perf_counter()
    bar = Progress(
        TextColumn(f"[bold]{description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        disable=not progress,
        transient=True,
    )
    with paused_gc(engine.clock.virtual), bar:  # no collector pauses in a simulated run (chunkbench/bench/gc_pause.py)
        task = bar.add_task(description, total=len(workload), rate="")
        try:
            loop.serve(bar, task, stop)
        except KeyboardInterrupt:
            loop.interrupted = True
        records = loop.records()
    ends = [rec.token_times[-1] for rec in records if rec.ok]
    first = min((rec.arrival_time for rec in records), default=0.0)
    return RunResult(
        requests=records,
        steps=loop.steps,
        duration=max(ends, default=first) - first,
        num_kv_blocks=engine.block_manager.num_blocks,
        interrupted=loop.interrupted,
        wall_seconds=time.perf_counter() - wall_start,
        stopped=loop.stopped,
        step_requests=loop.step_requests,
    )


class WorkloadLoop:
    """run_workload's loop and what it keeps between steps: the requests added (by workload index, in arrival
    order), each step's record and the requests it computed, the decodes each request had paused, and the
    output tokens so far (for the progress bar)."""

    def __init__(self, engine: LLMEngine, workload: list[WorkloadRequest], seed: int):
        self.engine, self.workload, self.seed = engine, workload, seed
        self.vocab = engine.config.model.vocab_size
        # Token ids matter to a model and to prefix-cache hashes only: the simulator (its fast path on) without a
        # prefix cache gets placeholder prompts of the right lengths; drawing random ids took longer than simulating.
        self.placeholders = getattr(engine.executor, "fast_forward", False) and not engine.block_manager.enable_caching
        self.order = sorted(range(len(workload)), key=lambda i: workload[i].arrival_time)
        self.requests: list[Request | None] = [None] * len(workload)
        self.steps: list[StepRecord] = []
        self.step_requests: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.fast = getattr(engine.executor, "fast_forward", False)  # the simulator may skip decode-only stretches
        self.start = engine.clock.now()
        self.next_index = 0
        # Paused decodes per request index: how many steps left it out, and which token gaps they fell in.
        self.paused_steps: dict[int, int] = {}
        self.paused_gaps: dict[int, set[int]] = {}
        self.interrupted = self.stopped = False
        self.output_tokens = 0

    def serve(self, bar: Progress, task, stop) -> None:
        """Add each request once its arrival time has passed and step the engine (idling until the next arrival
        when it has nothing to do) until every request finished or `stop` ends the run."""
        engine, workload, order = self.engine, self.workload, self.order
        next_check = STOP_CHECK_STEPS
        finished = 0
        while self.next_index < len(order) or engine.has_unfinished():
            if stop is not None and len(self.steps) >= next_check:
                next_check = len(self.steps) + STOP_CHECK_STEPS
                if stop([self.requests[i] for i in order[: self.next_index]], self.start, engine.clock.now()):
                    self.stopped = True
                    break
            now = engine.clock.now() - self.start
            self.add_arrived(now)
            if not engine.has_unfinished():
                gap = workload[order[self.next_index]].arrival_time - now
                engine.executor.idle(gap)  # the simulator's next step runs cold
                engine.clock.wait(gap)  # sleeps on the real clock, jumps on the others
                continue
            self.advance()
            done = self.next_index - len(engine.scheduler.requests)  # added and no longer the scheduler's
            if done != finished:
                finished = done
                elapsed = engine.clock.now() - self.start
                bar.update(task, completed=finished, rate=f"{self.output_tokens / max(elapsed, 1e-9):,.0f} out tok/s")

    def add_arrived(self, now: float) -> None:
        """Add to the engine every request whose arrival time (relative to the start) is at or before `now`."""
        engine, workload, order = self.engine, self.workload, self.order
        while self.next_index < len(order) and workload[order[self.next_index]].arrival_time <= now:
            i = order[self.next_index]
            w = workload[i]
            self.requests[i] = engine.add_request(
                [0] * w.prompt_len if self.placeholders else prompt_ids(i, w, self.vocab, self.seed),
                SamplingParams(max_tokens=w.output_len, ignore_eos=True),
                request_id=str(i),
                arrival_time=self.start + w.arrival_time,
            )
            self.next_index += 1

    def advance(self) -> None:
        """Run the next step; the simulator runs decode-only stretches up to the next event in one go."""
        engine, order = self.engine, self.order
        next_arrival = self.workload[order[self.next_index]].arrival_time if self.next_index < len(order) else math.inf
        batch = engine.scheduler.running.copy() if self.fast else None  # a stretch decodes these, in order
        skipped = fast_forward(engine, self.start, next_arrival, self.steps)  # 0: not now
        if skipped:
            self.output_tokens += skipped * self.steps[-1].decode_tokens  # a stretch's steps all decode as many
            ids = tuple(int(r.request_id) for r in batch)
            self.step_requests += [(ids, (1,) * len(ids))] * skipped
            return
        step_start = engine.clock.now()
        updated = engine.step()
        if engine.last_step is None and not updated:  # work left, none schedulable: a scheduler bug
            raise RuntimeError(
                f"the engine has unfinished requests but scheduled nothing "
                f"({len(engine.scheduler.waiting)} waiting, "
                f"{len(engine.scheduler.running)} running)"
            )
        if engine.last_step is not None:
            self.record_step(step_start, *engine.last_step)

    def record_step(self, step_start: float, output, result) -> None:
        """Record an engine step (its scheduler output and executor result): its StepRecord, the decodes it
        paused, its sampled tokens, and the requests it computed."""
        decodes = output.num_decode_tokens
        # StepRecord's fields in order: start, seconds, prefill and decode tokens, running,
        # waiting, KV blocks used, preempted, cached tokens, paused decodes, activation peak
        self.steps.append(
            StepRecord(
                step_start - self.start,
                result.seconds,
                output.num_tokens - decodes,
                decodes,
                output.num_running,
                output.num_waiting,
                output.num_used_blocks,
                len(output.preempted),
                output.num_cached_tokens,
                len(output.paused_decodes),
                result.activation_bytes,
            )
        )
        for request_id in output.paused_decodes:  # it got no token: the pause is in its next gap
            i = int(request_id)
            self.paused_steps[i] = self.paused_steps.get(i, 0) + 1
            self.paused_gaps.setdefault(i, set()).add(len(self.requests[i].token_times))
        self.output_tokens += len(result.sampled)
        chunks = output.chunks
        self.step_requests.append(
            (tuple([int(c.request_id) for c in chunks]), tuple([len(c.token_ids) for c in chunks]))
        )

    def records(self) -> list[RequestRecord]:
        """The added requests' records; after an interrupt or a stop, only those that finished."""
        partial = self.interrupted or self.stopped
        return [
            _record(r, w, self.start, self.paused_steps.get(i, 0), self.paused_gaps.get(i, set()))
            for i, (r, w) in enumerate(zip(self.requests, self.workload))
            if r is not None and (r.is_finished or not partial)
        ]  # keep what finished


def _record(
    request: Request, w: WorkloadRequest, start: float, num_paused: int = 0, paused_gaps: set[int] = frozenset()
) -> RequestRecord:
    """Times relative to the run start."""
    return RequestRecord(
        prompt_len=w.prompt_len,
        output_len=w.output_len,
        arrival_time=request.arrival_time - start,
        token_times=[t - start for t in request.token_times] if start else list(request.token_times),  # t - 0.0 is t
        first_scheduled_time=None if request.first_scheduled_time is None else request.first_scheduled_time - start,
        num_preemptions=request.num_preemptions,
        num_cached_tokens=request.num_cached_tokens,
        num_paused_decodes=num_paused,
        paused_gaps=tuple(sorted(paused_gaps)),
        probe=w.probe,
        error=request.error or {"abort": "aborted", None: "unfinished"}.get(request.finish_reason),
    )
