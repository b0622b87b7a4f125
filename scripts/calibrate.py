"""Fit the roofline's per-GPU kernel constants to Vidur's operator profiles and write
chunkbench/sim/calibration.json, with the fit's errors in-sample and held out.

    .venv/bin/python scripts/calibrate.py --data DIR [--out chunkbench/sim/calibration.json]

DIR holds Vidur's full mlp.csv profiles under the names in chunkbench/calibration/gpu_kernels.py PROFILES (see
tests/data/gpu-profiles/ORIGIN.md for where they come from).

Procedure: chunkbench/calibration/gpu_kernels.py (module docstring). Hold-outs, all on the per-layer linear time (the
four GEMMs summed), TP 1 unless said: in-sample (fit and score on the same GPU); other GPU/model (fit on one profile,
predict the other with the other GPU's datasheet peaks); TP (fit on TP 1-2 rows, predict TP 4-8). Data: Vidur
(microsoft/vidur, MIT License, Copyright (c) Microsoft Corporation); see the data's ORIGIN.md.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from chunkbench.calibration.gpu_kernels import (
    PROFILES,
    elementwise_errors,
    fit,
    gpu_of,
    linear_errors,
    load_rows,
    write_subset,
)
from chunkbench.files import write_json
from chunkbench.sim.kernel_constants import CALIBRATION_FILE, CALIBRATION_VERSION
from chunkbench.sim.kernel_times import KernelConstants

REPO = Path(__file__).resolve().parents[1]
RANGES = {"32-8192": (32, 8192), "64-1024": (64, 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of Vidur's full mlp.csv profiles")
    parser.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    parser.add_argument(
        "--subset",
        type=Path,
        default=REPO / "tests" / "data" / "gpu-profiles",
        help="where to write the rows the fit uses, median columns only, for the tests",
    )
    args = parser.parse_args()

    profiles = {name: (load_rows(args.data / name), gpu_of(args.data / name)) for name in PROFILES}
    gpus, holdout = {}, {}
    for name, (rows, gpu) in profiles.items():
        constants, info = fit(rows, gpu)
        tp12, _ = fit([r for r in rows if r.tp <= 2], gpu)
        gpus[gpu.name] = {
            "profile": name,
            "model": PROFILES[name][1],
            "constants": asdict(constants),
            "fit": info,
            "in_sample": {k: linear_errors(rows, constants, gpu, *v).as_dict() for k, v in RANGES.items()},
            "in_sample_elementwise": elementwise_errors(rows, constants, gpu, 32, 8192).as_dict(),
            "tp_holdout_fit_tp1-2_predict_tp4-8": {
                k: linear_errors(rows, tp12, gpu, *v, tp=(4, 8)).as_dict() for k, v in RANGES.items()
            },
        }
        print(f"{gpu.name}: {constants}")
    for name, (_, gpu) in profiles.items():
        for other, (other_rows, other_gpu) in profiles.items():
            if other != name:
                constants = gpus[gpu.name]["constants"]
                c = KernelConstants(**constants)
                holdout[f"fit {gpu.name} -> predict {other_gpu.name}"] = {
                    k: linear_errors(other_rows, c, other_gpu, *v).as_dict() for k, v in RANGES.items()
                }
    write_json(
        {
            "version": CALIBRATION_VERSION,
            "source": "Vidur operator profiles (microsoft/vidur data/profiling/compute, commit 7d47513; MIT License, "
            "Copyright (c) Microsoft Corporation)",
            "procedure": "chunkbench/calibration/gpu_kernels.py: scipy least_squares on relative error per GEMM, "
            "token tile by grid; scripts/calibrate.py",
            "gpus": gpus,
            "other_gpu_holdout": holdout,
        },
        args.out,
    )
    for key, entry in gpus.items():
        for k, e in entry["in_sample"].items():
            print(f"in-sample {key} {k}: mean {e['mean_abs_pct']:.1f}% worst {e['max_abs_pct']:.1f}%")
        for k, e in entry["tp_holdout_fit_tp1-2_predict_tp4-8"].items():
            print(f"TP hold-out {key} {k}: mean {e['mean_abs_pct']:.1f}% worst {e['max_abs_pct']:.1f}%")
    for key, entry in holdout.items():
        for k, e in entry.items():
            print(f"{key} {k}: mean {e['mean_abs_pct']:.1f}% worst {e['max_abs_pct']:.1f}%")
    for name in PROFILES:
        write_subset(args.data / name, args.subset / name)
    print(f"wrote {args.out} and the fitted rows to {args.subset}")


if __name__ == "__main__":
    main()
