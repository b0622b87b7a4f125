"""`chunkbench gate`: run a suite of benchmark cases and fail on a performance regression against a baseline.

Simulated cases are deterministic: a value beyond its tolerance is a regression. Real-engine cases are
noisy: each guards a machine-independent ratio (the case's metric over the same metric of a reference
policy run alternately in the same process), repeated; the verdict uses a bootstrap 95% interval of the
median ratio, and only a whole interval beyond the tolerance counts. Strict on real regressions (a worse
config moves the ratio far), quiet on a noisy runner.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chunkbench import sweeps
from chunkbench.backends.engine import EngineBackend
from chunkbench.backends.sim import SimBackend
from chunkbench.bench.backend import Backend
from chunkbench.bench.metrics import summarize
from chunkbench.bench.runs import config_for_policy, environment, run_benchmark
from chunkbench.bench.slo import parse_goodput
from chunkbench.engine import policies
from chunkbench.errors import UserError, check_number, read_toml
from chunkbench.files import write_json
from chunkbench.workloads.spec import WorkloadSpec, build_workload


def known_metrics() -> set[str]:
    return set(summarize([], [], 1.0, {"ttft": 1.0, "tpot": 1.0, "e2el": 1.0}, num_kv_blocks=1))


@dataclass(frozen=True)
class Guard:
    metric: str
    direction: str  # "lower" or "higher" is better
    tolerance: float  # relative, e.g. 0.05


@dataclass
class Case:
    name: str
    policy: str
    model: str = "llama-3-8b"
    backend: str = "sim"
    gpu: str = "h100-sxm"
    knobs: dict = field(default_factory=dict)
    reference: str | None = None
    repeats: int = 1
    workload: str = "rag-mix"
    rate: float = 4.0
    num_requests: int = 200
    seed: int = 0
    goodput: str | None = None
    num_blocks: int | None = None
    max_model_len: int | None = None
    clock: str = "wall"  # engine cases: "cpu" times steps in CPU time, which other processes cannot stretch
    guard: list[Guard] = field(default_factory=list)

    def workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec(name=self.workload, rate=self.rate, num_requests=self.num_requests, seed=self.seed)

    def base(self) -> dict:
        return {"model": self.model, "num_blocks": self.num_blocks, "max_model_len": self.max_model_len, **self.knobs}


def _check_types(where: str, entry: dict) -> None:
    """Each key of a case has the type its Case field declares (a float field takes an integer too)."""
    hints = typing.get_type_hints(Case)
    for key, value in entry.items():
        union = typing.get_origin(hints[key]) in (typing.Union, types.UnionType)
        kinds = [
            typing.get_origin(k) or k
            for k in (typing.get_args(hints[key]) if union else (hints[key],))
            if k is not type(None)
        ]
        kinds += [int] if float in kinds else []
        if isinstance(value, bool) or not isinstance(value, tuple(kinds)):
            raise UserError(f"{where}: {key} must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")


def load_suite(path: str | Path) -> list[Case]:
    path = sweeps.resolve(path)
    data = read_toml(path, "--suite")
    defaults = data.get("defaults", {})
    metrics = known_metrics()
    cases = []
    for raw in data.get("case", []):
        entry = {**defaults, **raw}
        where = f"--suite {path}: case '{entry.get('name', '?')}'"
        unknown = set(entry) - {f.name for f in dataclasses.fields(Case)}
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if "name" not in entry or "policy" not in entry:
            raise UserError(f"{where}: needs a name and a policy")
        _check_types(where, entry)
        for policy in filter(None, (entry["policy"].split(":")[0], (entry.get("reference") or "").split(":")[0])):
            if policy not in policies.REGISTRY:
                raise UserError(f"{where}: unknown policy '{policy}'; use {', '.join(policies.names())}")
        if entry.get("backend", "sim") not in ("sim", "engine"):
            raise UserError(f"{where}: backend must be sim or engine")
        if entry.get("clock", "wall") not in ("wall", "cpu"):
            raise UserError(f"{where}: clock must be wall or cpu")
        guards = []
        for g in entry.pop("guard", []):
            if not isinstance(g, dict):
                raise UserError(f"{where}: guard must be a list of {{ metric = ..., direction = ... }} tables")
            if g.get("metric") not in metrics:
                raise UserError(
                    f"{where}: unknown metric '{g.get('metric')}'; e.g. p99_itl_ms, median_ttft_ms, "
                    "output_throughput, request_goodput"
                )
            if g.get("direction") not in ("lower", "higher"):
                raise UserError(f"{where}: metric {g['metric']}: direction must be 'lower' or 'higher' (is better)")
            tolerance = check_number(f"{where}: metric {g['metric']}: tolerance", g.get("tolerance", 0.05), low=0)
            guards.append(Guard(g["metric"], g["direction"], float(tolerance)))
        if not guards:
            raise UserError(f"{where}: guards no metric; add guard = [{{ metric = ..., direction = ... }}]")
        case = Case(**entry, guard=guards)
        check_number(f"{where}: repeats", case.repeats, low=1, integer=True)
        case.workload_spec().validate()  # everything else a case runs is checked before any case runs
        parse_goodput(case.goodput)
        for policy in filter(None, (case.policy, case.reference)):
            config_for_policy(case.base(), policy)
        cases.append(case)
    if not cases:
        raise UserError(f"--suite {path}: no [[case]] tables")
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise UserError(f"--suite {path}: case names must be unique")
    return cases


def _run(case: Case, policy: str, workload, backend: Backend) -> dict:
    config = config_for_policy(case.base(), policy)
    return run_benchmark(
        config,
        workload,
        backend=backend,
        goodput_ms=parse_goodput(case.goodput),
        seed=case.seed,
        progress=False,
        warmup_steps=3,
    ).summary


def measure(case: Case) -> dict[str, list[float]]:
    """Samples of each guarded value: one per repeat (a ratio against the reference when there is one)."""
    workload = build_workload(case.workload_spec())
    backend = SimBackend(case.gpu) if case.backend == "sim" else EngineBackend(cpu_time=case.clock == "cpu")
    samples: dict[str, list[float]] = {g.metric: [] for g in case.guard}
    for _ in range(case.repeats):
        summary = _run(case, case.policy, workload, backend)
        reference = _run(case, case.reference, workload, backend) if case.reference else None
        for g in case.guard:
            value = summary[g.metric]
            samples[g.metric].append(value / max(reference[g.metric], 1e-12) if reference else value)
    return samples


def bootstrap_median_interval(samples: list[float], seed: int = 0, rounds: int = 4000) -> tuple[float, float]:
    """95% bootstrap interval of the median."""
    data = np.asarray(samples, dtype=float)
    if data.size == 1:
        return float(data[0]), float(data[0])
    draws = np.random.default_rng(seed).choice(data, size=(rounds, data.size), replace=True)
    medians = np.median(draws, axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


@dataclass
class Verdict:
    case: str
    metric: str
    baseline: float
    now: float
    interval: tuple[float, float]
    tolerance: float
    direction: str
    verdict: str  # ok, improved, REGRESSED

    @property
    def change(self) -> float:
        return (self.now - self.baseline) / self.baseline if self.baseline else 0.0


def judge(guard: Guard, case: str, baseline: float, samples: list[float]) -> Verdict:
    now = statistics.median(samples)
    lo, hi = bootstrap_median_interval(samples)
    worse_bound = baseline * (1 + guard.tolerance) if guard.direction == "lower" else baseline * (1 - guard.tolerance)
    better_bound = baseline * (1 - guard.tolerance) if guard.direction == "lower" else baseline * (1 + guard.tolerance)
    if guard.direction == "lower":
        verdict = "REGRESSED" if lo > worse_bound else "improved" if hi < better_bound else "ok"
    else:
        verdict = "REGRESSED" if hi < worse_bound else "improved" if lo > better_bound else "ok"
    return Verdict(case, guard.metric, baseline, now, (lo, hi), guard.tolerance, guard.direction, verdict)


def run_gate(cases: list[Case], baseline_path: Path, update: bool) -> list[Verdict]:
    if not update and not baseline_path.exists():
        raise UserError(
            f"--baseline: no baseline at {baseline_path}; record one on a known-good commit with "
            f"`chunkbench gate --suite SUITE --baseline {baseline_path} --update` and commit it"
        )
    baseline = {} if update else _read_baseline(baseline_path)
    if not update:
        missing = [c.name for c in cases if c.name not in baseline]
        if missing:
            raise UserError(
                f"--baseline {baseline_path} has no case(s) {', '.join(missing)}; re-record it with --update"
            )
    measured = {case.name: measure(case) for case in cases}
    if update:
        write_json(
            {
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": environment(),
                "cases": {
                    name: {metric: {"value": statistics.median(s), "samples": s} for metric, s in m.items()}
                    for name, m in measured.items()
                },
            },
            baseline_path,
        )
        baseline = _read_baseline(baseline_path)
    verdicts = []
    for case in cases:
        for g in case.guard:
            if g.metric not in baseline[case.name]:
                raise UserError(
                    f"--baseline {baseline_path}: case {case.name} has no {g.metric}; re-record it with --update"
                )
            verdicts.append(judge(g, case.name, baseline[case.name][g.metric]["value"], measured[case.name][g.metric]))
    return verdicts


def _read_baseline(path: Path) -> dict:
    """{case: {metric: {"value": number, ...}}} from a baseline file; anything else is one clear error."""
    try:
        cases = json.loads(path.read_text())["cases"]
        for metrics in cases.values():
            for entry in metrics.values():
                check_number("value", entry["value"])
        return cases
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, UserError) as exc:
        raise UserError(
            f"--baseline {path} is not a chunkbench gate baseline ({type(exc).__name__}: {exc}); "
            "re-record it with --update"
        ) from None


def junit_xml(verdicts: list[Verdict]) -> str:
    from xml.sax.saxutils import escape, quoteattr

    failures = sum(v.verdict == "REGRESSED" for v in verdicts)
    cases = []
    for v in verdicts:
        body = ""
        if v.verdict == "REGRESSED":
            body = (
                f"<failure message={quoteattr(f'{v.metric} regressed {v.change:+.1%}')}>{escape(describe(v))}</failure>"
            )
        cases.append(
            f"  <testcase classname={quoteattr('chunkbench.gate.' + v.case)} name={quoteattr(v.metric)}>"
            f"{body}</testcase>"
        )
    return (
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="chunkbench gate" tests="{len(verdicts)}" '
        f'failures="{failures}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )


def describe(v: Verdict) -> str:
    better = "lower" if v.direction == "lower" else "higher"
    return (
        f"{v.case} {v.metric}: baseline {v.baseline:.4g}, now {v.now:.4g} ({v.change:+.1%}; 95% interval "
        f"{v.interval[0]:.4g}..{v.interval[1]:.4g}; tolerance {v.tolerance:.0%}, {better} is better)"
    )


def markdown(verdicts: list[Verdict]) -> str:
    regressions = [v for v in verdicts if v.verdict == "REGRESSED"]
    headline = f"❌ {len(regressions)} regression(s)" if regressions else "✅ clean"
    lines = [
        f"### chunkbench gate: {headline}",
        "",
        "| case | metric | baseline | now | change | 95% interval | tolerance | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {v.case} | {v.metric} | {v.baseline:.4g} | {v.now:.4g} | {v.change:+.1%} | "
        f"{v.interval[0]:.4g}..{v.interval[1]:.4g} | {v.tolerance:.0%} | {v.verdict} |"
        for v in verdicts
    ]
    return "\n".join(lines) + "\n"
