"""orca: whole prompts ride in the same step as the decodes (iteration-level batching, no chunking)."""

from __future__ import annotations

from .base import Policy, register
from .whole_prompt import admit_whole_prompts


@register
class Orca(Policy):
    name = "orca"
    help = "whole prompts ride in the same step as the decodes"
    in_vllm = False

    def schedule(self, scheduler, scheduled, preempted) -> None:
        s = scheduler
        budget = s.config.max_num_batched_tokens
        for request in [r for r in s.running if r.is_decoding] + [r for r in s.running if not r.is_decoding]:
            n = request.num_tokens_to_compute
            if n > budget:
                continue
            if request in s.running and s._reserve(request, n, scheduled, preempted):
                budget -= n
        if not preempted:
            admit_whole_prompts(s, budget, scheduled)
