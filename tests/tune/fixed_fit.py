"""`python fixed_fit.py ARGS...`: chunkbench's command line with the server calibration's fit replaced by a fixed
calibration that fits (a step of STEP_S and nothing else), so that a launched `tune --presearch sim` against
tests/tune/slow_server.py reaches its simulated search, its verification and its drift check in seconds: the
real fit takes about a minute of CPU on that server's runs, and does not fit them (the tune would launch every
trial instead). The calibration launches, their records and everything after the fit are the tune's own."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: chunkbench, as in the tests

from chunkbench.sim.server_calibration import ServerCalibration  # noqa: E402
from chunkbench.tune.presearch import server as cal  # noqa: E402

STEP_S = 0.002  # slow_server's default --token-ms: one token per request per step


def fixed_fit(runs: list[dict], spec, device: str = "cpu", server: str = "", num_blocks=None, **_) -> ServerCalibration:
    for run in runs:  # what the report plots: the measured figures as their own fit
        run["simulated"] = {k: run.get(k, []) for k in ("ttft_ms", "itl_ms", "e2el_ms")} | {"server": {}}
    return ServerCalibration(
        device,
        step_overhead_s=STEP_S,
        model=spec.model,
        server=server,
        num_blocks=num_blocks or 256,
        fit_error_pct=1.0,
        max_error_pct=2.0,
        workload_error_pct=1.0,
        runs=runs,
    )


if __name__ == "__main__":
    cal.fit = fixed_fit
    from chunkbench.cli import main

    main(sys.argv[1:])
