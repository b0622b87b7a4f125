"""What varies between the tuner's objectives, behind one interface (Objective), and a configuration on a serving
session for one to measure (Run). The rest of the tuner asks a registered objective (registry.get) and never
compares its name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chunkbench.bench.backend import Backend
from chunkbench.bench.runs import BenchRun, measure
from chunkbench.bench.slo import goodput_slos, violations
from chunkbench.engine.config import EngineConfig
from chunkbench.tune.spec import TrialOutcome, TuneSpec
from chunkbench.workloads.spec import WorkloadRequest

METRIC_ATTRS = (
    "request_goodput",
    "request_throughput",
    "output_throughput",
    "p99_ttft_ms",
    "median_ttft_ms",
    "p99_itl_ms",
    "p99_tpot_ms",
    "median_tpot_ms",
    "p99_e2el_ms",
    "median_scheduling_delay_ms",
    "sla_attainment_pct",
    "num_preemptions",
    "num_paused_decodes",
    "longest_stall_ms",
    "completed",
    "server_requests",
    "scheduling_delay_source",
    "steady_requests",
    "run_requests",
    "server_metrics",
    "client_rules_since",
)  # over HTTP: whose /metrics were read (vllm, sglang), and which vLLM release's client rules timed the run


@dataclass
class Run:
    """A configuration served in an open backend session (one launched server, or a simulator) with what an
    objective needs to score it: the trial's knobs and workload, and a capacity found for another
    configuration (`capacity_hint`: where a capacity search starts)."""

    spec: TuneSpec
    knobs: dict
    workload: list[WorkloadRequest]
    serve: Callable
    config: EngineConfig
    backend: Backend
    progress: bool = False
    capacity_hint: float | None = None

    def measure(self, workload: list[WorkloadRequest] | None = None, progress: bool = False, stop=None) -> BenchRun:
        """One run of `workload` (default: the trial's) judged on the SLAs' goodput and percentiles."""
        spec = self.spec
        return measure(
            self.serve,
            self.config,
            self.workload if workload is None else workload,
            progress=progress,
            stop=stop,
            goodput_ms=goodput_slos(spec.slos),
            seed=spec.seed,
            percentiles=[s.percentile for s in spec.slos],
            backend=str(self.backend),
        )


class Objective:
    """One `--objective`: how a trial is scored and what the study, the report and the plots say about it.
    A single value is maximised; several (a front) are ranked by `headline`, also maximised."""

    name: str = ""  # --objective NAME; a study stores it and a resumed one is looked up by it
    help: str = ""  # its --help entry: "NAME (what it finds)"
    directions: tuple[str, ...] = ("maximize",)  # Optuna's, one per trial value
    value_labels: tuple[str, ...] = ()  # each value's axis label (search.png; a front's x, y and colour)
    headline: int = 0  # the value that ranks feasible trials and is named as a gain
    headline_name: str = ""  # what that value is called in sentences ("capacity", "output throughput")
    column: tuple[str, str] = ("goodput req/s", "request_goodput")  # the results table's: (title, metric key)
    rows: tuple[tuple[str, str], ...] = ()  # knobs.png's first rows, before the SLAs': (metric key, label)
    extra_rows: tuple[tuple[str, str], ...] = ()  # and after them: other bounds the objective checks
    needs_slos: bool = False  # refused without an --sla-* target
    auto_with_slas: bool | None = None  # --objective auto picks it when SLAs are (True) or are not (False) given

    @property
    def multi(self) -> bool:
        """Several values: the study keeps a front, not one best."""
        return len(self.directions) > 1

    @property
    def one_winner(self) -> bool:
        """A single best configuration to pick, re-measure and name a margin for (a front has none)."""
        return not self.multi

    def sampler(self, spec: TuneSpec, seed: int):
        """The Optuna sampler: TPE, its random start a fifth of the trials (3 to 10)."""
        import optuna

        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=min(10, max(3, spec.n_trials // 5))
        )

    def values(self, summary: dict) -> list[float]:
        """A run summary's trial values, one per direction."""
        raise NotImplementedError

    def score(self, run: Run) -> TrialOutcome:
        """One run of the trial's workload, scored."""
        return self.outcome(run.spec, run.knobs, run.measure(progress=run.progress).summary)

    def outcome(self, spec: TuneSpec, knobs: dict, summary: dict) -> TrialOutcome:
        """One run's summary as a trial outcome: its objective values, SLA margins and the metrics kept."""
        # Over HTTP some keys do not exist (paused decodes need the scheduler's decisions): those are left out.
        metrics = {k: summary[k] for k in METRIC_ATTRS if k in summary} | {
            s.summary_key: summary[s.summary_key] for s in spec.slos
        }
        return TrialOutcome(
            self.values(summary), dict(zip((s.name for s in spec.slos), violations(summary, spec.slos))), metrics, knobs
        )

    def tie_reason(self, winner, runner) -> str:
        """Why two feasible trials with different metrics score the same (report_text.margin)."""
        return f"both scored the same {self.headline_name}"

    def notes(self, spec: TuneSpec) -> list[str]:
        """What the report's figures do not establish because of how this objective measures."""
        return []
