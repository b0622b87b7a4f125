"""Token-budget scheduler: the request queues, KV blocks and preemption under a batching policy
(engine/policies/: static, continuous, orca, chunked; see docs/architecture.md).

Every step has a token budget (`max_num_batched_tokens`) and a seat limit (`max_num_seqs`). The policy picks
`n` uncomputed tokens of each request it schedules; the step that computes a request's last token samples the
next one. `chunked` makes vLLM's decisions (the same per-step, per-request token counts, preemptions and
prefix-cache hits, checked against vLLM 0.32 and 0.34 themselves by tests/vllm/test_scheduler_oracle.py).

When KV blocks run out, the newest running request not yet in this step is preempted and later
recomputed from scratch. Plain Python: no torch, so the simulator runs it at full speed.
"""

from __future__ import annotations

import zlib
from collections import deque

from . import policies
from .block_manager import BlockManager, cdiv
from .config import SchedulerConfig
from .limits import prompt_fits
from .outputs import ScheduledChunk, SchedulerOutput, StepResult
from .request import Request, RequestStatus
from .shape import StepCost


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, seed: int = 0, step_cost: StepCost | None = None
    ) -> None:
        self.config = config
        self.policy = policies.get(config.policy)
        self.step_cost = step_cost  # predicts a step's seconds; needed by step_time_target_ms
        self.block_manager = block_manager
        self.seed = seed
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._step_cached_tokens = 0  # prompt tokens found in the prefix cache by this step's admissions
        # vLLM 0.33+'s prefill cadence (engine/policies/chunked.py): steps that scheduled tokens, the
        # last of them that carried prefill (a full interval back: the first step is never held), and whether
        # the last step that admitted freely left requests waiting (then nothing is held).
        self.num_executed_steps = 0
        self.last_prefill_step = -config.prefill_schedule_interval
        self.prefill_capacity_bound = False
        # Running requests whose last chunk stopped one token short of their end without sampling (a preempted
        # request's recompute): is_decoding says decoding, vLLM's is_prefill_chunk says still prefilling.
        self.short_of_last: set[Request] = set()

    # ---- requests in and out ----

    def rejection_reason(self, request: Request) -> str | None:
        """Why a request can never be served, or None."""
        max_len = self.config.max_model_len
        if request.num_prompt_tokens == 0:
            return "prompt is empty"
        too_long = prompt_fits(request.num_prompt_tokens, max_len)  # the engine needs no room for output
        if too_long:
            return too_long
        # The last sampled token is never computed, so its KV needs no slot.
        longest = min(request.num_prompt_tokens + request.sampling.max_tokens - 1, max_len)
        blocks = cdiv(longest, self.block_manager.block_size)
        if blocks > self.block_manager.num_blocks:
            return f"needs {blocks} KV blocks for {longest} tokens, the cache has {self.block_manager.num_blocks}"
        return None

    def add(self, request: Request) -> None:
        if request.sampling.seed is not None:
            request.sample_seed = request.sampling.seed
        else:  # stable per request, whatever else is in its batch
            request.sample_seed = zlib.crc32(f"{self.seed}/{request.request_id}".encode())
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED_ABORTED
        self._finish(request)
        return request

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def decode_only_batch(self) -> list[Request] | None:
        """The running requests (in step order) when, under every policy, the next step is one decode token
        for each of them and nothing else: all are decoding, all fit the budget, and no waiting request can
        be admitted (no free seat, or static's batch still runs). Else None. Whether their blocks fit is
        the caller's check. The simulator fast-forwards through such steps (chunkbench/sim/fastforward.py):
        a policy that treats decodes differently must refuse here, or tests/sim/test_fast_forward.py fails."""
        running, config = self.running, self.config
        if not running or len(running) > config.max_num_batched_tokens:
            return None
        if (config.prefill_schedule_interval > 1 or config.cache_aware_admission_window) and not self._skippable():
            return None
        if self.waiting and len(running) < config.max_active and self.policy.admits_while_running:
            return None
        if not running[-1].is_decoding:  # the newest admission, the likeliest to be mid-prefill: a quick no
            return None
        return running if all(r.is_decoding for r in running) else None

    def _skippable(self) -> bool:
        """Whether decode-only steps may run without schedule() as far as vLLM 0.33+'s rules go: the prefill
        cadence counts every step until it expires (once expired it stays so until a step prefills), and
        cache-aware admission may reorder the queue on every step, even one that admits nothing."""
        config = self.config
        interval = config.prefill_schedule_interval
        if interval > 1 and (self.short_of_last or self.num_executed_steps + 1 - self.last_prefill_step < interval):
            return False
        return not (config.cache_aware_admission_window and self.block_manager.enable_caching and len(self.waiting) > 1)

    def mid_prefill(self, request: Request) -> bool:
        """Whether a running request is still prefilling as vLLM sees it (its last chunk did not sample)."""
        return not request.is_decoding or request in self.short_of_last

    # ---- one step ----

    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        scheduled: dict[Request, int] = {}  # request -> tokens to compute this step (in step order)
        preempted: list[Request] = []
        self._step_cached_tokens = 0
        self.policy.schedule(self, scheduled, preempted)
        return self._make_output(scheduled, preempted, now)

    # ---- helpers (the policies' too) ----

    def _lookup_prefix(self, request: Request) -> list[int]:
        """Cached blocks a waiting request's tokens start with; tentatively counts them as computed (a
        waiting request holds no blocks, so it has nothing else computed)."""
        hits = self.block_manager.cached_prefix(request)
        request.num_computed_tokens = len(hits) * self.block_manager.block_size
        return hits

    def _admit(
        self,
        request: Request,
        n: int,
        scheduled: dict[Request, int] | None,
        hits: list[int],
        full: bool = False,
        reserve: int = 0,
    ) -> bool:
        """Move the head of the queue to running with blocks for `n` tokens (scheduled unless None). With
        `full`, only if blocks for all its tokens are free (vLLM's scheduler_reserve_full_isl); `reserve`
        blocks must stay free (vLLM's watermark)."""
        if not self.block_manager.can_allocate(request, request.num_tokens_to_compute if full else n, hits, reserve):
            request.num_computed_tokens = 0  # undo the tentative prefix hit: it stays waiting
            return False
        self.waiting.popleft()
        self.block_manager.allocate(request, n, hits)
        if request.num_preemptions == 0:
            request.num_cached_tokens = request.num_computed_tokens
        self._step_cached_tokens += request.num_computed_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        if scheduled is not None:
            scheduled[request] = n
        return True

    def _reserve(self, request: Request, n: int, scheduled: dict[Request, int], preempted: list[Request]) -> bool:
        """Blocks for `n` more tokens of a running request, preempting the newest unscheduled ones."""
        bm = self.block_manager
        if bm.blocks_needed(request, n) == 0:  # most decodes: their last block has room
            if bm.enable_caching:  # the blocks this step fills are cached now (vLLM 0.32's allocate_slots)
                bm.cache_blocks(request, request.num_computed_tokens + n)
            scheduled[request] = n
            return True
        while not self.block_manager.can_allocate(request, n):
            victim = next(r for r in reversed(self.running) if r not in scheduled)
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        self.block_manager.append(request, n)
        scheduled[request] = n
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.short_of_last.discard(request)
        self.block_manager.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_chunks = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _make_output(self, scheduled: dict[Request, int], preempted: list[Request], now: float) -> SchedulerOutput:
        chunks = []
        tables = self.block_manager.block_tables
        for request, n in scheduled.items():
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            start, outputs = request.num_computed_tokens, request.output_token_ids
            prompt, made = len(request.prompt_token_ids), len(outputs)
            # ScheduledChunk's fields in order (positional: a chunk per request per step, the simulator's hottest
            # loop after its fast path): request id, tokens, start, the live block table (read during this step
            # only), sample, is_decode, sampling, sample index, sample seed. Request's token_ids_between,
            # num_tokens and is_decoding inlined for a chunk of outputs (a decode's).
            chunks.append(
                ScheduledChunk(
                    request.request_id,
                    outputs[start - prompt : start + n - prompt]
                    if start >= prompt
                    else request.token_ids_between(start, start + n),
                    start,
                    tables[request.request_id],  # every scheduled request holds a table
                    start + n == prompt + made,
                    made > 0 and start == prompt + made - 1,
                    request.sampling,
                    made,
                    request.sample_seed,
                )
            )
        # Decided here, before update() moves computed counts on: is_decoding is still this step's view. Every
        # scheduled request runs, so when as many run as were scheduled none was left out (most steps).
        running = self.running
        paused = (
            [r.request_id for r in running if r not in scheduled and r.is_decoding]
            if len(running) > len(scheduled)
            else []
        )
        return SchedulerOutput(
            chunks=chunks,
            preempted=[r.request_id for r in preempted],
            num_cached_tokens=self._step_cached_tokens,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_used_blocks=self.block_manager.num_used_blocks,
            paused_decodes=paused,
        )

    def update(self, output: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        """Advance computed counts, append sampled tokens; return the requests that got a token."""
        updated = []
        requests, sampled, advance = self.requests, result.sampled, self.advance
        running, waiting = RequestStatus.RUNNING, RequestStatus.WAITING
        for chunk in output.chunks:
            request = requests[chunk.request_id]
            if request.status is not running and request.status is not waiting:  # is_finished: aborted meanwhile
                continue
            token = sampled[chunk.request_id] if chunk.sample else None
            if advance(request, len(chunk.token_ids), chunk.is_decode, token, now):
                updated.append(request)
        return updated

    def advance(self, request: Request, num_tokens: int, is_decode: bool, token: int | None, now: float) -> bool:
        """A chunk of `num_tokens` was computed: count them, cache the blocks they filled, append the sampled
        `token` (None: the chunk ended mid-prompt) and finish the request if it is done. True when it got a
        token. The simulator's fast path calls it too, for the steps where a decode fills a block or ends."""
        request.num_computed_tokens += num_tokens
        bm = self.block_manager
        if bm.enable_caching:  # blocks these tokens filled (mostly cached at allocation; a fast-path decode's here)
            bm.cache_blocks(request, request.num_computed_tokens)
        if not is_decode:
            request.num_chunks += 1
        if token is None:
            if request.output_token_ids and request.num_computed_tokens == request.num_tokens - 1:
                self.short_of_last.add(request)
            elif self.short_of_last:
                self.short_of_last.discard(request)
            return False
        if self.short_of_last:
            self.short_of_last.discard(request)
        finished = request.append_output(token, now)
        if not finished and len(request.prompt_token_ids) + len(request.output_token_ids) >= self.config.max_model_len:
            request.status, finished = RequestStatus.FINISHED_LENGTH, True
        if finished:
            self.running.remove(request)
            self._finish(request)
        return True

    def _finish(self, request: Request) -> None:
        self.short_of_last.discard(request)
        self.block_manager.free(request)
        del self.requests[request.request_id]
