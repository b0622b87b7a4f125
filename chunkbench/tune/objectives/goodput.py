"""`goodput`: request goodput (DistServe's: requests/s that met every per-request SLA) at the workload's own
rate, the SLAs also as constraints."""

from __future__ import annotations

from chunkbench.tune.objectives.base import Objective
from chunkbench.tune.objectives.registry import register


class Goodput(Objective):
    name = "goodput"
    help = "goodput (request goodput under the SLAs at the workload's rate)"
    value_labels = ("request goodput (req/s)",)
    headline_name = "goodput"
    column = ("goodput req/s", "request_goodput")
    rows = (("request_goodput", "goodput (req/s)"),)
    auto_with_slas = False

    def values(self, summary: dict) -> list[float]:
        return [summary["request_goodput"]]

    def tie_reason(self, winner, runner) -> str:
        met = [t.user_attrs["metrics"].get("sla_attainment_pct") for t in (winner, runner)]
        return (
            "every request met the SLAs in both: goodput is the offered rate, so the workload does not load "
            "the deployment (use --objective capacity, or a higher --rate)"
            if met == [100.0, 100.0]
            else "both served the same number of requests within the SLAs"
        )


register(Goodput())
