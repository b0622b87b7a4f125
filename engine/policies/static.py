"""static: admit a batch when nothing runs, prefill it whole, decode it to completion."""

from __future__ import annotations

from .base import Policy, register
from .whole_prompt import prefill_first


@register
class Static(Policy):
    name = "static"
    help = "admit a batch when nothing runs; prefill it whole, decode it to completion"
    admits_while_running = False
    in_vllm = False

    def schedule(self, scheduler, scheduled, preempted) -> None:
        prefill_first(scheduler, scheduled, preempted, batch=True)
