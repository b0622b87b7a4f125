"""The tuner's objectives, one class each behind one interface (base.Objective) and registered once by name
(registry.OBJECTIVES): `goodput` (request goodput, SLAs as constraints), `capacity` (the highest request rate
meeting the SLAs with a bounded median scheduling delay, by bisection in one backend session), `pareto` (p99
TTFT, p99 TBT, output throughput). A trial is run and scored in trial.py."""

# isort: off
from chunkbench.tune.objectives import goodput, capacity, pareto  # importing registers: keep this order

# isort: on
from chunkbench.tune.objectives.base import METRIC_ATTRS, Objective, Run
from chunkbench.tune.objectives.registry import (
    AUTO,
    OBJECTIVES,
    get,
    help_text,
    one_winner_names,
    register,
    resolve,
    unregister,
)
from chunkbench.tune.objectives.trial import evaluate, evaluate_runs, median_outcome, warm_up_server

BUILT_IN = (goodput, capacity, pareto)  # registered in this order: --help's and the errors' order

__all__ = [
    "AUTO",
    "METRIC_ATTRS",
    "OBJECTIVES",
    "Objective",
    "Run",
    "evaluate",
    "evaluate_runs",
    "get",
    "help_text",
    "median_outcome",
    "one_winner_names",
    "register",
    "resolve",
    "unregister",
    "warm_up_server",
]
