"""chunked: running requests in order, a decode token or a prompt chunk each, then waiting prompts' chunks fill
the rest of the budget (Sarathi-Serve, vLLM v1); with `step_time_target_ms`, decodes first and chunks also
fill the rest of the step's predicted time (chunkbench/engine/step_time.py).

It makes vLLM 0.32's decisions (vllm/v1/core/sched/scheduler.py): `chunk_size` is its
long_prefill_token_threshold, not applied while a single request is running or waiting (there is nobody to
starve) and, with long_prefill_token_threshold_adaptive, raised to a fair share of the budget; with
scheduler_reserve_full_isl a waiting request is admitted only when blocks for its whole prompt are free;
max_num_active_seqs caps admissions; admissions leave the watermark free while others run. chunk_schedule,
num_chunks, tile, max_partial_prefills and step_time_target_ms are extensions vLLM lacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..step_time import StepTimer
from .base import Policy, register

if TYPE_CHECKING:  # annotations only
    from ..request import Request
    from ..scheduler import Scheduler


@register
class Chunked(Policy):
    name = "chunked"
    help = "a decode token or a prompt chunk per running request, then waiting prompts' chunks (vLLM v1)"
    chunks_prompts = True

    def schedule(self, scheduler: Scheduler, scheduled: dict[Request, int], preempted: list[Request]) -> None:
        s, config = scheduler, scheduler.config
        budget = config.max_num_batched_tokens
        target = config.step_time_target_ms
        timer = None
        if target:
            assert s.step_cost is not None, "step_time_target_ms needs the scheduler's step cost"
            timer = StepTimer(s.step_cost, target / 1000)
        threshold = long_prefill_token_threshold(s)
        if timer is None:  # vLLM: in running order
            running = list(s.running)
        else:  # decodes first: their time is fixed, the chunks fill what is left of the target
            running = [r for r in s.running if r.is_decoding] + [r for r in s.running if not r.is_decoding]
        for request in running:
            if budget == 0:
                break
            if preempted and request in preempted:  # preempted earlier in this step (a short list, mostly empty)
                continue
            n = chunk_len(s, request, budget, scheduled, timer, threshold)
            if n and s._reserve(request, n, scheduled, preempted):
                budget -= n
                timed(timer, request, n)
        if preempted:
            return  # vLLM v1: a step that preempts admits nothing
        admit(s, budget, scheduled, timer, threshold)


def admit(
    s: Scheduler, budget: int, scheduled: dict[Request, int], timer: StepTimer | None, threshold: int | None
) -> None:
    """Waiting prompts' first chunks fill what is left of the budget, in queue order."""
    config = s.config
    cap = config.max_partial_prefills
    full_isl = config.scheduler_reserve_full_isl
    watermark = int(config.watermark * (s.block_manager.num_blocks + 1))  # vLLM counts its null block
    while s.waiting and budget > 0 and len(s.running) < config.max_active:
        if cap is not None and cap <= sum(
            1
            for r in s.running  # prompts still mid-prefill after this step
            if not r.is_decoding and scheduled.get(r, 0) < r.num_tokens_to_compute
        ):
            break
        request = s.waiting[0]
        hits = s._lookup_prefix(request)
        n = chunk_len(s, request, budget, scheduled, timer, threshold)
        # vLLM's scheduler_reserve_full_isl: blocks for the whole prompt must be free, not just the chunk's
        if not n or not s._admit(request, n, scheduled, hits, full_isl, watermark if s.running else 0):
            break
        budget -= n
        timed(timer, request, n)


def long_prefill_token_threshold(s: Scheduler) -> int | None:
    """`chunk_size` as vLLM 0.32 applies its long_prefill_token_threshold this step: not at all while one
    request is running or waiting (it has nobody to starve), and with long_prefill_token_threshold_adaptive
    at least max_num_batched_tokens // (running + waiting)."""
    config = s.config
    size, eligible = config.chunk_size, len(s.running) + len(s.waiting)
    if size is None or eligible <= 1:
        return None
    if config.long_prefill_token_threshold_adaptive:
        size = max(size, config.max_num_batched_tokens // eligible)
    return size


def chunk_len(
    s: Scheduler,
    request: Request,
    budget: int,
    scheduled: dict[Request, int],
    timer: StepTimer | None = None,
    threshold: int | None = None,
) -> int:
    """Tokens of `request` to compute this step: the token budget, the per-request caps (`threshold`: this
    step's chunk_size) and, with a time target, the step's predicted time."""
    if request.is_decoding:
        return 1
    remaining = request.num_tokens_to_compute
    n = min(remaining, budget, s.config.chunk_cap(request.num_chunks, request.num_prompt_tokens, threshold))
    if timer is not None:
        n = timer.fit(n, request.num_computed_tokens, remaining)
    tile = s.config.tile
    if tile and n < remaining:  # trim a cut chunk so the step ends on a tile boundary
        excess = (sum(scheduled.values()) + n) % tile
        if excess < n:
            n -= excess
    return n


def timed(timer: StepTimer | None, request: Request, n: int) -> None:
    """Tell the step timer a chunk joined the step (before update() moves the computed count on)."""
    if timer is not None:
        timer.add(n, request.num_computed_tokens, request.is_decoding, n == request.num_tokens_to_compute)
