"""The baselines chunked prefill is measured against: static, continuous and orca, whose steps compute whole
prompts (engine/scheduler.py's docstring says how each batches). A mixin of Scheduler: these methods use its
queues (`running`, `waiting`), `config` and its block helpers (`_admit`, `_reserve`, `_lookup_prefix`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from .request import Request


class WholePromptPolicies:
    def _schedule_orca(self, scheduled: dict[Request, int], preempted: list[Request]) -> None:
        budget = self.config.max_num_batched_tokens
        for request in [r for r in self.running if r.is_decoding] + [r for r in self.running
                                                                     if not r.is_decoding]:
            n = request.num_tokens_to_compute
            if n > budget:
                continue
            if request in self.running and self._reserve(request, n, scheduled, preempted):
                budget -= n
        if not preempted:
            self._admit_whole_prompts(budget, scheduled)

    def _schedule_prefill_first(self, scheduled: dict[Request, int], preempted: list[Request]) -> None:
        """static and continuous: a step computes whole prompts only, or decodes only."""
        budget = self.config.max_num_batched_tokens
        if self.config.policy == "static" and not self.running:
            while self.waiting and len(self.running) < self.config.max_active:
                request = self.waiting[0]
                if not self._admit(request, 0, None, self._lookup_prefix(request)):  # its prefill comes below
                    break
        for request in [r for r in self.running if not r.is_decoding]:
            n = request.num_tokens_to_compute
            if n > budget:
                break
            if request in self.running and self._reserve(request, n, scheduled, preempted):
                budget -= n
        if self.config.policy == "continuous" and not preempted:
            budget = self._admit_whole_prompts(budget, scheduled)
        if scheduled:  # a prompt step; one whose prompts only preempted (themselves) decodes instead
            return
        for request in [r for r in self.running if r.is_decoding][:budget]:
            if request in self.running:
                self._reserve(request, 1, scheduled, preempted)

    def _admit_whole_prompts(self, budget: int, scheduled: dict[Request, int]) -> int:
        while self.waiting and len(self.running) < self.config.max_active:
            request = self.waiting[0]
            hits = self._lookup_prefix(request)
            n = request.num_tokens_to_compute
            if n > budget or not self._admit(request, n, scheduled, hits):
                request.num_computed_tokens = 0  # it stays waiting, holding no blocks
                break
            budget -= n
        return budget
