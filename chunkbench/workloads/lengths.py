"""Length distributions for synthetic workloads: `--prompt-len lognormal:256:0.8`, drawn from a seeded
generator, checked before any draw."""

from __future__ import annotations

import numpy as np

from chunkbench.errors import UserError, check_number
from chunkbench.workloads.user_files import MAX_TOKENS


def _parse_numbers(spec: str, flag: str) -> tuple[str, list[float]]:
    kind, *params = spec.split(":")
    try:
        values = [float(p) for p in params]
    except ValueError:
        raise UserError(f"{flag}: '{spec}' has a non-numeric parameter") from None
    for v in values:
        check_number(f"{flag} {spec}:", v, low=0, high=MAX_TOKENS)
    return kind, values


LENGTH_KINDS = {  # kind -> (required parameter names, help)
    "fixed": (["N"], "every request N tokens"),
    "uniform": (["LO", "HI"], "uniform integers in [LO, HI]"),
    "normal": (["MEAN", "STD"], "normal, rounded"),
    "lognormal": (["MEDIAN", "SIGMA"], "log-normal with this median and log-space sigma"),
    "zipf": (["A", "MAX"], "Zipf with exponent A > 1, clamped to MAX"),
}
LENGTH_HELP = (
    "Length distribution: "
    + "; ".join(f"{k}:{':'.join(p)} ({h})" for k, (p, h) in LENGTH_KINDS.items())
    + "; normal, lognormal and zipf take an optional :MIN:MAX clamp (tokens)."
)


def sample_lengths(spec: str, n: int, rng: np.random.Generator, flag: str = "--prompt-len") -> np.ndarray:
    kind, params = _parse_numbers(spec, flag)
    if kind not in LENGTH_KINDS:
        raise UserError(f"{flag}: unknown distribution '{kind}'; use one of {', '.join(LENGTH_KINDS)}")
    need = len(LENGTH_KINDS[kind][0])
    if len(params) not in (need, need + 2) or (kind in ("fixed", "uniform") and len(params) != need):
        raise UserError(f"{flag}: '{spec}' needs {kind}:{':'.join(LENGTH_KINDS[kind][0])}")
    lo, hi = (params[need], params[need + 1]) if len(params) == need + 2 else (1, np.inf)
    if kind in ("fixed", "uniform") and min(params) < 1:
        raise UserError(f"{flag}: '{spec}' gives lengths below 1 token")
    if kind == "fixed":
        values = np.full(n, params[0])
    elif kind == "uniform":
        if params[0] > params[1]:
            raise UserError(f"{flag}: uniform:LO:HI needs LO <= HI, got '{spec}'")
        values = rng.integers(int(params[0]), int(params[1]) + 1, n)
    elif kind == "normal":
        values = rng.normal(params[0], params[1], n)
    elif kind == "lognormal":
        values = rng.lognormal(np.log(max(params[0], 1e-9)), params[1], n)
    else:
        if params[0] <= 1:
            raise UserError(f"{flag}: zipf needs an exponent A > 1, got '{spec}'")
        values, hi = rng.zipf(params[0], n), min(hi, params[1])
    values = np.clip(np.rint(values), max(lo, 1), hi).astype(np.int64)
    if values.min(initial=1) < 1:
        raise UserError(f"{flag}: '{spec}' gives lengths below 1")
    return values
