"""How well a server calibration predicts launched runs, over many configurations: simulate every trial of a
`tune --backend launch` study (each trial is one run on a launch of its own) with a calibration
(`tune --presearch sim` writes calibration.json), and compare figure by figure. A presearch verifies only its
few best configurations; the launch-all study of the same space and workload has them all.

    .venv/bin/python scripts/sim_vs_launched.py STUDY_DIR CALIBRATION_JSON [--space scripts/presearch_space.toml]

STUDY_DIR holds the launch-all tune's study.db (its SLAs are read from it), the space file is the one it was run
with (its [workload] is simulated), and the engine flags it fixed are given again (--num-blocks). Prints, per
figure, the trials compared, the median and mean of (simulated - measured) / measured, and how many are within
15%; --csv FILE writes every trial's pair.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics

import optuna

from chunkbench.backends import SimBackend
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.slo import SLO
from chunkbench.tune.objectives import evaluate
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workload import WorkloadSpec, build_workload

FIGURES = ("request_goodput", "median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "p99_e2el_ms")
WITHIN = 0.15  # issue 18's agreement


def slos_of(study: optuna.Study) -> list[SLO]:
    """The study's SLAs, as the tune recorded them ('p99 TTFT <= 4000 ms')."""
    found = [re.fullmatch(r"p([\d.]+) (\w+) <= ([\d.]+) ms", text) for text in study.user_attrs.get("slos", [])]
    return [SLO(m[2].lower(), float(m[1]), float(m[3])) for m in found if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study_dir", help="the launch-all tune's --out folder (its study.db)")
    parser.add_argument("calibration", help="a server calibration (calibration.json of a --presearch sim tune)")
    parser.add_argument("--space", default="scripts/presearch_space.toml", help="the space file the study ran")
    parser.add_argument("--num-blocks", type=int, default=1024, help="the tune's --num-blocks (KV blocks)")
    parser.add_argument("--csv", help="write every trial's simulated and measured figures here")
    args = parser.parse_args()

    storage = f"sqlite:///{args.study_dir}/study.db"
    study = optuna.load_study(study_name=optuna.study.get_all_study_names(storage)[0], storage=storage)
    space = SearchSpace.load(args.space)
    spec = TuneSpec(model=study.user_attrs.get("model", "small"), slos=slos_of(study), space=space,
                    workload=WorkloadSpec(**space.workload), backend=None,
                    engine_overrides={"num_blocks": args.num_blocks})
    workload = build_workload(spec.workload, spec.base_config().scheduler.max_model_len)
    backend = SimBackend(server_calibration=ServerCalibration.load(args.calibration))
    rows = []
    for trial in study.trials:
        measured = trial.user_attrs.get("metrics")
        if trial.state != optuna.trial.TrialState.COMPLETE or not measured:
            continue
        simulated = evaluate(spec, trial.user_attrs["knobs"], workload, backend=backend).metrics
        rows.append({"trial": trial.number} | {f"{k} {side}": figures.get(k) for k in FIGURES
                                               for side, figures in (("sim", simulated), ("measured", measured))})
    slas = ", ".join(map(str, spec.slos))
    print(f"{len(rows)} launched trials of {args.study_dir} against {args.calibration} ({slas})")
    print("| figure | trials | median error | mean error | within 15% |\n|---|---|---|---|---|")
    for key in FIGURES:
        errors = [(r[f"{key} sim"] - r[f"{key} measured"]) / r[f"{key} measured"] for r in rows
                  if r[f"{key} sim"] is not None and r[f"{key} measured"]]
        if errors:
            print(f"| {key} | {len(errors)} | {100 * statistics.median(errors):+.1f}% | "
                  f"{100 * statistics.mean(errors):+.1f}% | {sum(abs(e) <= WITHIN for e in errors)} |")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["trial"])
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
