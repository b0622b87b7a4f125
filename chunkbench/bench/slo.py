"""Service-level objectives, parsed in one place: the tuner's `--sla-ttft 300ms` / `--sla-tbt p90:0.1s`
(a percentile of a metric must not exceed a limit, checked against a run's summary) and the per-request
limits of vLLM's `--goodput 'ttft:300 tpot:50'` (milliseconds; DistServe's goodput).

TBT (time between tokens) is the ITL metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chunkbench.bench.metrics import pct_key
from chunkbench.errors import UserError

# flag name -> summary metric; probe: a --probe-request-rate probe's E2EL (its keys are vLLM's, probe_p99_e2el_ms)
SLA_METRICS = {"ttft": "ttft", "tbt": "itl", "tpot": "tpot", "e2el": "e2el", "probe": "e2el"}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # metrics with a per-request value (ITL has one per token)
_VALUE = re.compile(r"^(?:p(?P<pct>\d+(?:\.\d+)?):)?(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s)?$")


@dataclass(frozen=True)
class SLO:
    name: str  # ttft, tbt, tpot, e2el
    percentile: float
    limit_ms: float

    @property
    def summary_key(self) -> str:
        key = f"{pct_key(self.percentile)}_{SLA_METRICS[self.name]}_ms"
        return "probe_" + key if self.name == "probe" else key

    def __str__(self) -> str:
        return f"p{self.percentile:g} {self.name.upper()} <= {self.limit_ms:g} ms"


def parse_slo(
    name: str, text: str, default_percentile: float, flag: str | None = None, default_unit: str | None = None
) -> SLO:
    """'300ms', '0.3s', 'p90:300ms' -> SLO; a bare number takes `default_unit` (--goodput: ms) or is an error.
    Errors name the flag. NaN, infinities and non-positive limits never parse."""
    flag = flag or f"--sla-{name}"
    match = _VALUE.match(text.strip().replace(" ", "")) if text else None
    if match is None or (match["unit"] or default_unit) is None:
        if text and text.strip().startswith("-"):
            raise UserError(f"{flag}: must be positive, got '{text}'")
        example = "300" if default_unit else "300ms, 0.3s or p90:300ms"
        raise UserError(f"{flag}: '{text}' is not a duration; use e.g. {example}")
    value = float(match["num"]) * (1000.0 if (match["unit"] or default_unit) == "s" else 1.0)
    percentile = float(match["pct"]) if match["pct"] else default_percentile
    if value <= 0:
        raise UserError(f"{flag}: must be positive, got '{text}'")
    if not 0 < percentile <= 100:
        raise UserError(f"{flag}: percentile must be in (0, 100], got p{match['pct']}")
    return SLO(name, percentile, value)


def parse_goodput(text: str | list[str] | None) -> dict[str, float]:
    """'ttft:300 tpot:50 e2el:2000' (milliseconds, as vLLM's --goodput) -> {'ttft': 300.0, ...}."""
    if not text:
        return {}
    parts = text.split() if isinstance(text, str) else [p for item in text for p in item.split()]
    slos = {}
    for part in parts:
        name, _, value = part.partition(":")
        if name not in GOODPUT_METRICS:
            raise UserError(f"--goodput: unknown metric '{name}' in '{part}'; use {', '.join(GOODPUT_METRICS)}")
        if value.startswith("p"):
            raise UserError(f"--goodput: '{part}' is a per-request limit in milliseconds, like {name}:300")
        slos[name] = parse_slo(name, value, 100.0, flag=f"--goodput {part}:", default_unit="ms").limit_ms
    return slos


def parse_slas(values: dict[str, str | None], default_percentile: float = 99.0) -> list[SLO]:
    if not 0 < default_percentile <= 100:
        raise UserError(f"--sla-percentile must be in (0, 100], got {default_percentile}")
    return [parse_slo(name, text, default_percentile) for name, text in values.items() if text is not None]


def metric_value(summary: dict, slo: SLO) -> float:
    """The SLO's percentile of its metric, from a run summary (percentiles not stored are recomputed)."""
    return summary[slo.summary_key]  # summarize(extra_percentiles=...) records any percentile an SLO names


def violations(summary: dict, slos: list[SLO]) -> list[float]:
    """Optuna constraint values: measured minus limit, in ms; <= 0 means the SLO is met."""
    return [metric_value(summary, slo) - slo.limit_ms for slo in slos]


def goodput_slos(slos: list[SLO]) -> dict[str, float]:
    """Per-request SLOs for DistServe goodput: TTFT, TPOT and E2EL limits (TBT has no per-request form)."""
    return {slo.name: slo.limit_ms for slo in slos if slo.name in GOODPUT_METRICS}
