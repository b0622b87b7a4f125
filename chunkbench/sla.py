"""Service-level targets: `--sla-ttft 300ms`, `--sla-tbt p90:0.1s`, checked against a run's summary.

TBT (time between tokens) is the ITL metric. Each target is a percentile (default `--sla-percentile`) of
the metric that must not exceed a limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chunkbench.errors import UserError
from chunkbench.metrics import pct_key

SLA_METRICS = {"ttft": "ttft", "tbt": "itl", "tpot": "tpot", "e2el": "e2el"}  # flag name -> summary metric
_VALUE = re.compile(r"^(?:p(?P<pct>\d+(?:\.\d+)?):)?(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s)$")


@dataclass(frozen=True)
class SLO:
    name: str  # ttft, tbt, tpot, e2el
    percentile: float
    limit_ms: float

    @property
    def summary_key(self) -> str:
        return f"{pct_key(self.percentile)}_{SLA_METRICS[self.name]}_ms"

    def __str__(self) -> str:
        return f"p{self.percentile:g} {self.name.upper()} <= {self.limit_ms:g} ms"


def parse_slo(name: str, text: str, default_percentile: float) -> SLO:
    """'300ms', '0.3s', 'p90:300ms' -> SLO. Errors name the flag."""
    flag = f"--sla-{name}"
    match = _VALUE.match(text.strip().replace(" ", "")) if text else None
    if match is None:
        if text and text.strip().startswith("-"):
            raise UserError(f"{flag}: must be positive, got '{text}'")
        raise UserError(f"{flag}: '{text}' is not a duration; use e.g. 300ms, 0.3s or p90:300ms")
    value = float(match["num"]) * (1000.0 if match["unit"] == "s" else 1.0)
    percentile = float(match["pct"]) if match["pct"] else default_percentile
    if value <= 0:
        raise UserError(f"{flag}: must be positive, got '{text}'")
    if not 0 < percentile <= 100:
        raise UserError(f"{flag}: percentile must be in (0, 100], got p{match['pct']}")
    return SLO(name, percentile, value)


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
    return {slo.name: slo.limit_ms for slo in slos if slo.name in ("ttft", "tpot", "e2el")}
