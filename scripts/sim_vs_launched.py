"""How well a server calibration predicts launched runs, over many configurations: simulate every trial of a
`tune --backend launch` study (each trial is one run on a launch of its own) with a calibration
(`tune --presearch sim` writes calibration.json), and compare figure by figure. A presearch verifies only its
few best configurations; the launch-all study of the same space and workload has them all.

    .venv/bin/python scripts/sim_vs_launched.py STUDY_DIR CALIBRATION_JSON [--space scripts/presearch_space.toml]

STUDY_DIR holds the launch-all tune's study.db (its SLAs are read from it), the space file is the one it was run
with (its [workload] is simulated), and the engine flags it fixed are given again (--num-blocks). Prints, per
figure, the trials compared, the median and mean of (simulated - measured) / measured, and how many are within
15%; --csv FILE writes every trial's pair.

When the study re-measured its best configurations (verified.json: `--verify-top K`, each run R times on a
launch of its own), it also compares, on those configurations and the three figures a presearch verifies, the
simulation and the configuration's best single run (the trial the tune picked it by) against the medians of
its re-measurement: how well a launched run predicts another launch, the floor under the simulator's agreement.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import optuna
import pandas as pd

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.slo import SLO
from chunkbench.files import write_text
from chunkbench.sim.server_calibration import ServerCalibration
from chunkbench.tune.objectives import evaluate
from chunkbench.tune.report_text import knobs_text
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadSpec, build_workload

FIGURES = ("request_goodput", "median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "p99_e2el_ms")
VERIFIED = ("request_goodput", "p99_ttft_ms", "p99_itl_ms")  # what a presearch's verification compares
WITHIN = 0.15  # the agreement a presearch's verified figures are held to


def slos_of(study: optuna.Study) -> list[SLO]:
    """The study's SLAs, as the tune recorded them ('p99 TTFT <= 4000 ms')."""
    slos = []
    for text in study.user_attrs.get("slos", []):
        match = re.fullmatch(r"p([\d.]+) (\w+) <= ([\d.e+]+) ms", text)
        if match is None:
            sys.exit(f"cannot read the study's SLA '{text}'")
        slos.append(SLO(match[2].lower(), float(match[1]), float(match[3])))
    return slos


def error(simulated: float | None, measured: float | None) -> float | None:
    return None if simulated is None or not measured else (simulated - measured) / measured


def summary(label: str, errors: list[float]) -> str:
    return (
        f"| {label} | {len(errors)} | {100 * statistics.median(errors):+.1f}% | "
        f"{100 * statistics.mean(errors):+.1f}% | {sum(abs(e) <= WITHIN for e in errors)} |"
    )


def verified_rows(study: optuna.Study, path: Path, simulated: dict[int, dict]) -> None:
    """The re-measured configurations: simulated (`simulated`: figures by trial number), and their best single
    run, against the re-measured medians."""
    verified = json.loads(path.read_text()).get("verified", {})
    print(f"\n{len(verified)} re-measured configurations ({path}): against the median of their re-measurement")
    print("| figure | compared | median error | mean error | within 15% |\n|---|---|---|---|---|")
    pairs = {"simulated": [], "its best single run": []}
    for key, record in verified.items():
        runs = [t for t in study.trials if t.user_attrs.get("knobs") and knobs_text(t) == key and t.values]
        if not runs:
            continue
        best = max(runs, key=lambda t: t.values[0])
        for figure in VERIFIED:
            measured = record["metrics"].get(figure)
            for side, figures in (
                ("simulated", simulated[best.number]),
                ("its best single run", best.user_attrs["metrics"]),
            ):
                if (e := error(figures.get(figure), measured)) is not None:
                    pairs[side].append(e)
    for side, errors in pairs.items():
        if errors:
            print(summary(side, errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study_dir", help="the launch-all tune's --out folder (its study.db)")
    parser.add_argument("calibration", help="a server calibration (calibration.json of a --presearch sim tune)")
    parser.add_argument("--space", default="scripts/presearch_space.toml", help="the space file the study ran")
    parser.add_argument("--num-blocks", type=int, default=1024, help="the tune's --num-blocks (KV blocks)")
    parser.add_argument("--csv", help="write every trial's simulated and measured figures here")
    args = parser.parse_args()

    folder = Path(args.study_dir)
    if not (folder / "study.db").is_file():
        sys.exit(f"{folder}: no study.db (give the --out folder of a `tune --backend launch`)")
    storage = f"sqlite:///{folder / 'study.db'}"
    study = optuna.load_study(study_name=optuna.study.get_all_study_names(storage)[0], storage=storage)
    space = SearchSpace.load(args.space)
    spec = TuneSpec(
        model=study.user_attrs.get("model", "small"),
        slos=slos_of(study),
        space=space,
        workload=WorkloadSpec(**space.workload),
        backend=None,
        objective=study.user_attrs.get("objective", "goodput"),
        engine_overrides={"num_blocks": args.num_blocks},
    )
    workload = build_workload(spec.workload, spec.base_config().scheduler.max_model_len)
    backend = SimBackend(server_calibration=ServerCalibration.load(args.calibration))
    rows, simulated = [], {}
    for trial in study.trials:
        measured = trial.user_attrs.get("metrics")
        if trial.state != optuna.trial.TrialState.COMPLETE or not measured:
            continue
        sim = simulated[trial.number] = evaluate(spec, trial.user_attrs["knobs"], workload, backend=backend).metrics
        rows.append(
            {"trial": trial.number}
            | {
                f"{k} {side}": figures.get(k)
                for k in FIGURES
                for side, figures in (("sim", sim), ("measured", measured))
            }
        )
    slas = ", ".join(map(str, spec.slos))
    print(f"{len(rows)} launched trials of {folder} against {args.calibration} ({slas})")
    print("| figure | trials | median error | mean error | within 15% |\n|---|---|---|---|---|")
    for key in FIGURES:
        errors = [e for r in rows if (e := error(r[f"{key} sim"], r[f"{key} measured"])) is not None]
        if errors:
            print(summary(key, errors))
    if (folder / "verified.json").is_file():
        verified_rows(study, folder / "verified.json", simulated)
    if args.csv:  # atomically, as every chunkbench output
        write_text(pd.DataFrame(rows).to_csv(index=False), Path(args.csv))


if __name__ == "__main__":
    main()
