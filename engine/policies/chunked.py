"""chunked: running requests in order, a decode token or a prompt chunk each, then waiting prompts' chunks fill
the rest of the budget (Sarathi-Serve, vLLM v1); with `step_time_target_ms`, decodes first and chunks also
fill the rest of the step's predicted time (engine/step_time.py).

It makes vLLM's decisions (vllm/v1/core/sched/scheduler.py, 0.32 and 0.34; Chunked says which knob is which of
vLLM's). vLLM 0.33+'s prefill_schedule_interval holds prefill back between cadence steps (`prefill_held`) and
0.34's cache-aware admission puts waiting requests with a cached prefix first (`put_cached_first`); both are off
by default, and off they leave 0.32's decisions unchanged.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..step_time import StepTimer
from .base import Policy, register

if TYPE_CHECKING:  # annotations only
    from ..request import Request
    from ..scheduler import Scheduler


@register
class Chunked(Policy):
    """`chunk_size` is vLLM's long_prefill_token_threshold, not applied while a single request is running or
    waiting (there is nobody to starve) and, with long_prefill_token_threshold_adaptive, raised to a fair share
    of the budget; with scheduler_reserve_full_isl a waiting request is admitted only when blocks for its whole
    prompt are free; max_num_active_seqs caps admissions; admissions leave the watermark free while others run.
    chunk_schedule, num_chunks, tile, max_partial_prefills and step_time_target_ms are extensions vLLM lacks."""

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
        held = prefill_held(s)
        prefilled = False  # a prompt chunk ran this step: the cadence restarts from it
        if timer is None:  # vLLM: in running order
            running = list(s.running)
        else:  # decodes first: their time is fixed, the chunks fill what is left of the target
            running = [r for r in s.running if r.is_decoding] + [r for r in s.running if not r.is_decoding]
        for request in running:
            if budget == 0:
                break
            if preempted and request in preempted:  # preempted earlier in this step (a short list, mostly empty)
                continue
            decoding = request.is_decoding  # s.mid_prefill and chunk_len's first test, once: this loop is hot
            mid = not decoding or request in s.short_of_last
            if held and mid:  # a held step carries no prefill, not even an admitted prompt's next chunk
                continue
            n = 1 if decoding else chunk_len(s, request, budget, scheduled, timer, threshold)
            if n and s._reserve(request, n, scheduled, preempted):
                budget -= n
                prefilled = prefilled or mid
                if timer is not None:
                    timed(timer, request, n)
        if not preempted:  # vLLM v1: a step that preempts admits nothing
            prefilled = admit(s, budget, scheduled, timer, threshold, held) or prefilled
        if scheduled:  # the cadence counts the steps that ran
            s.num_executed_steps += 1
            if prefilled:
                s.last_prefill_step = s.num_executed_steps


def prefill_held(s: Scheduler) -> bool:
    """vLLM 0.33+'s prefill_schedule_interval N (applied on the engine itself, without data parallelism): while
    some running request decodes, prefill waits until N steps that ran have passed since the last step that
    carried prefill; the steps between decode alone. Not while the last step that admitted freely left
    requests waiting (vLLM's escape: a held queue would grow without bound), never on the first step."""
    interval = s.config.prefill_schedule_interval
    if interval <= 1 or s.prefill_capacity_bound or s.num_executed_steps + 1 - s.last_prefill_step >= interval:
        return False
    return any(not s.mid_prefill(r) for r in s.running)


def put_cached_first(s: Scheduler) -> None:
    """vLLM 0.34's cache-aware admission: once the KV cache is at least cache_aware_admission_threshold used,
    the requests among the first cache_aware_admission_window waiting ones whose prompt prefix is cached move
    ahead, the deepest cached prefix first, arrival order breaking ties. Only requests never run take part,
    in each other's places: a preempted one keeps its own (as in vLLM, the others may still move across it).
    Needs the prefix cache."""
    config, bm, waiting = s.config, s.block_manager, s.waiting
    if len(waiting) < 2 or not bm.enable_caching:
        return
    if 1.0 - bm.num_free / bm.num_blocks < config.cache_aware_admission_threshold:  # vLLM's usage, to the bit
        return
    head = list(itertools.islice(waiting, config.cache_aware_admission_window))
    slots = [i for i, r in enumerate(head) if r.num_preemptions == 0]
    if len(slots) < 2:
        return
    cached = {i: len(bm.cached_prefix(head[i])) for i in slots}  # blocks: the same order as tokens
    order = sorted(slots, key=lambda i: (-cached[i], i))
    if order == slots:
        return
    reordered = list(head)
    for slot, source in zip(slots, order):
        reordered[slot] = head[source]
    for _ in head:
        waiting.popleft()
    waiting.extendleft(reversed(reordered))


def admit(
    s: Scheduler,
    budget: int,
    scheduled: dict[Request, int],
    timer: StepTimer | None,
    threshold: int | None,
    held: bool = False,
) -> bool:
    """Waiting prompts' first chunks fill what is left of the budget, in queue order. On a held step only a
    request with one token left after its prefix-cache hit is admitted (it carries no prefill). True when an
    admitted request had more than that left (the step carried prefill)."""
    config = s.config
    cap = config.max_partial_prefills
    full_isl = config.scheduler_reserve_full_isl
    watermark = int(config.watermark * (s.block_manager.num_blocks + 1))  # vLLM counts its null block
    if config.cache_aware_admission_window and not held:
        put_cached_first(s)
    prefilled = False
    while s.waiting and budget > 0 and len(s.running) < config.max_active:
        if cap is not None and cap <= sum(
            1
            for r in s.running  # prompts still mid-prefill after this step
            if not r.is_decoding and scheduled.get(r, 0) < r.num_tokens_to_compute
        ):
            break
        request = s.waiting[0]
        hits = s._lookup_prefix(request)
        prefill = request.num_computed_tokens < request.num_tokens - 1
        n = 0 if held and prefill else chunk_len(s, request, budget, scheduled, timer, threshold)
        # vLLM's scheduler_reserve_full_isl: blocks for the whole prompt must be free, not just the chunk's
        if not n or not s._admit(request, n, scheduled, hits, full_isl, watermark if s.running else 0):
            request.num_computed_tokens = 0  # the tentative prefix hit undone: it stays waiting
            break
        budget -= n
        prefilled = prefilled or prefill
        timed(timer, request, n)
    if not held:  # vLLM's capacity escape from the cadence, judged on every step that admits freely
        s.prefill_capacity_bound = bool(s.waiting)
    return prefilled


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
