"""The kernel constants the roofline uses for each GPU: fitted ones from sim/calibration.json (written by
scripts/calibrate.py from measured operator profiles, calibration/gpu_kernels.py), or datasheet defaults, marked
uncalibrated, for a GPU no profile covers. No torch, no scipy: this runs inside every simulation."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from chunkbench.sim.kernel_times import KernelConstants

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
CALIBRATION_VERSION = 1  # bump when KernelConstants or the kernel formulas change meaning

# Uncalibrated GPUs: datasheet-era efficiencies (dense bf16 cuBLAS GEMMs reach ~70% of peak, streaming kernels
# ~80% of HBM bandwidth) and a 64-row token tile; the shape of the curve (smoothness, kernel floors, elementwise
# efficiency) is not on any datasheet, so it is the mean of the calibrated GPUs (calibration_for).
DATASHEET_GEMM_EFFICIENCY = 0.70
DATASHEET_MEMORY_EFFICIENCY = 0.80
DATASHEET_TOKEN_TILE = 64


@dataclass(frozen=True)
class Calibration:
    constants: KernelConstants
    calibrated: bool
    label: str  # said in every simulated output (the cost model's __str__)


@lru_cache(maxsize=1)
def load(path: Path = CALIBRATION_FILE) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("version") != CALIBRATION_VERSION:
        raise ValueError(f"{path}: calibration version {data.get('version')}, this code reads {CALIBRATION_VERSION}")
    return data


def _constants(entry: dict) -> KernelConstants:
    return KernelConstants(**{f.name: entry[f.name] for f in fields(KernelConstants)})


def calibration_for(gpu: str) -> Calibration:
    data = load()
    gpus = data["gpus"]
    if gpu in gpus:
        entry = gpus[gpu]
        return Calibration(
            _constants(entry["constants"]), True, f"calibrated v{data['version']} on {entry['model']} operator profiles"
        )
    fitted = [_constants(e["constants"]) for e in gpus.values()]
    mean = lambda name: sum(getattr(c, name) for c in fitted) / len(fitted)  # noqa: E731
    constants = KernelConstants(
        DATASHEET_GEMM_EFFICIENCY,
        DATASHEET_MEMORY_EFFICIENCY,
        mean("smoothness"),
        DATASHEET_TOKEN_TILE,
        mean("gemm_floor_s"),
        mean("elementwise_efficiency"),
        mean("elementwise_floor_s"),
    )
    return Calibration(constants, False, "uncalibrated: datasheet constants")
