"""What the policies that never split a prompt share (static, continuous, orca): admitting whole prompts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from ..request import Request
    from ..scheduler import Scheduler


def admit_whole_prompts(s: Scheduler, budget: int, scheduled: dict[Request, int]) -> int:
    """Admit waiting requests in order while their whole prompts fit the budget and the cache; the budget left."""
    while s.waiting and len(s.running) < s.config.max_active:
        request = s.waiting[0]
        hits = s._lookup_prefix(request)
        n = request.num_tokens_to_compute
        if n > budget or not s._admit(request, n, scheduled, hits):
            request.num_computed_tokens = 0  # it stays waiting, holding no blocks
            break
        budget -= n
    return budget


def prefill_first(s: Scheduler, scheduled: dict[Request, int], preempted: list[Request], *, batch: bool) -> None:
    """A step computes whole prompts only, or decodes only. `batch` (static): a new batch is admitted only
    when nothing runs, before the prompts; else (continuous) waiting prompts join after the running ones."""
    budget = s.config.max_num_batched_tokens
    if batch and not s.running:
        while s.waiting and len(s.running) < s.config.max_active:
            request = s.waiting[0]
            if not s._admit(request, 0, None, s._lookup_prefix(request)):  # its prefill comes below
                break
    for request in [r for r in s.running if not r.is_decoding]:
        n = request.num_tokens_to_compute
        if n > budget:
            break
        if request in s.running and s._reserve(request, n, scheduled, preempted):
            budget -= n
    if not batch and not preempted:
        budget = admit_whole_prompts(s, budget, scheduled)
    if scheduled:  # a prompt step; one whose prompts only preempted (themselves) decodes instead
        return
    for request in [r for r in s.running if r.is_decoding][:budget]:
        if request in s.running:
            s._reserve(request, 1, scheduled, preempted)
