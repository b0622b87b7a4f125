"""`pareto`: the front of p99 TTFT, p99 TBT (both minimised) and output throughput (maximised), by NSGA-II; no
one winner (nothing is re-measured), the front ranked by its throughput."""

from __future__ import annotations

from chunkbench.tune.objectives.base import Objective
from chunkbench.tune.objectives.registry import register
from chunkbench.tune.spec import TuneSpec


class Pareto(Objective):
    name = "pareto"
    help = "pareto (NSGA-II over p99 TTFT, p99 TBT and throughput)"
    directions = ("minimize", "minimize", "maximize")
    value_labels = ("p99 TTFT (ms)", "p99 TBT (ms)", "output throughput (tok/s)")
    headline = 2  # output throughput
    headline_name = "output throughput"
    rows = (("output_throughput", "output tok/s"),)

    def sampler(self, spec: TuneSpec, seed: int):
        """NSGA-II, a population of a quarter of the trials (8 to 50)."""
        import optuna

        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, spec.n_trials // 4)))

    def values(self, summary: dict) -> list[float]:
        return [summary["p99_ttft_ms"], summary["p99_itl_ms"], summary["output_throughput"]]


register(Pareto())
