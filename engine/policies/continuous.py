"""continuous: whole prompts in prefill-only steps that pause the decodes (vLLM before chunked prefill)."""

from __future__ import annotations

from .base import Policy, register
from .whole_prompt import prefill_first


@register
class Continuous(Policy):
    name = "continuous"
    help = "whole prompts in prefill-only steps that pause decodes (vLLM before chunked prefill)"

    def schedule(self, scheduler, scheduled, preempted) -> None:
        prefill_first(scheduler, scheduled, preempted, batch=False)
