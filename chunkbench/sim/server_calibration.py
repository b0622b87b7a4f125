"""A cost model fitted to one user's server (`chunkbench tune --presearch sim`, tune/presearch/server.py): what the
fit found and how to simulate with it. No torch, no scipy: this runs inside every simulated trial.

The constants are those of a cost-model family (sim/families.py: `roofline`, `linear`, `linear-cpu`), which
says how they price a step; a file without `family` is a roofline one (written before there were others). They
are relative to a reference device: a GPU of sim/gpus.py (the roofline's scales then read as "this deployment
reaches x of the datasheet") or `cpu`, a nominal host (1 TFLOP/s, 100 GB/s, one-row token tile, no kernel
floors: a CPU does not pad GEMMs to tensor-core tiles and its per-op dispatch cost lands in the step overhead);
`cpu` is not in `--gpu`'s list because its peaks mean nothing until a fit scales them. Memory (KV blocks,
activation peaks) is the reference roofline's in every family.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.sim import families
from chunkbench.sim.cost_model import CostModel
from chunkbench.sim.gpus import GPUS, GPUSpec
from chunkbench.sim.kernel_constants import Calibration, calibration_for
from chunkbench.sim.kernel_times import KernelConstants

if TYPE_CHECKING:
    from chunkbench.sim.cost_family import CostFamily
    from chunkbench.sim.roofline import RooflineCostModel

FORMAT = "chunkbench-server-calibration/1"
CPU_REFERENCE = GPUSpec("cpu", 1e12, 100e9, 64e9, 10e9, 10e-6, "host memory")
CPU_CONSTANTS = KernelConstants(
    gemm_efficiency=1.0,
    memory_efficiency=1.0,
    smoothness=2.0,
    token_tile=1,
    gemm_floor_s=0.0,
    elementwise_efficiency=1.0,
    elementwise_floor_s=0.0,
)
# A fit whose RMS relative error over the fitted TTFT and ITL percentiles exceeds this does not describe the
# server well enough to search on: the tuner then launches every trial instead. 15% is the agreement the
# verified figures are held to.
FIT_TOLERANCE_PCT = 15.0


def reference(device: str) -> tuple[GPUSpec, Calibration]:
    """The reference peaks and kernel constants a server calibration scales."""
    if device == "cpu":
        return CPU_REFERENCE, Calibration(CPU_CONSTANTS, False, "cpu reference")
    if device not in GPUS:
        raise UserError(f"server calibration: unknown device '{device}'; use cpu or one of {', '.join(GPUS)}")
    return GPUS[device], calibration_for(device)


@dataclass
class ServerCalibration:
    device: str  # the reference: "cpu" or a GPU of sim/gpus.py
    flops_scale: float = 1.0  # roofline only, as bandwidth_scale
    bandwidth_scale: float = 1.0
    step_overhead_s: float = 0.0  # a linear family's step_s (also kept here for reports)
    seq_overhead_s: float = 0.0  # a linear family's seq_s
    model: str = ""
    server: str = ""  # the --launch template it was fitted on, for the record
    num_blocks: int | None = None  # the server's KV blocks, when known (--num-blocks)
    fit_error_pct: float | None = None  # RMS relative error of the fitted TTFT/ITL percentiles, every run
    max_error_pct: float | None = None
    runs: list[dict] = field(default_factory=list)  # per calibration run: design, measured and fitted figures
    workload_error_pct: float | None = None  # the same RMS on the run of the tune's own workload alone
    family: str = "roofline"  # a registered family (sim/families.py), resolved with the device (cost_family)
    coefficients: dict | None = None  # a linear family's: term -> seconds per unit (its settings as numbers)

    def __post_init__(self) -> None:
        self.cost_family.check(self)

    @property
    def cost_family(self) -> CostFamily:
        """The family that prices these constants: `family` as stored, on this reference (families.resolve)."""
        return families.resolve(self.family, self.device)

    @property
    def judged_error_pct(self) -> float | None:
        """What decides whether the simulator may stand in for the server: its error on the tune's own workload
        (the load every trial runs at), when that run was made; else over every run. The bursts identify the
        constants; the workload run is the load the recommendation is for."""
        return self.workload_error_pct if self.workload_error_pct is not None else self.fit_error_pct

    @property
    def fits(self) -> bool:
        """Within FIT_TOLERANCE_PCT on the judged error, and, when that is the workload run's, within twice it
        over every run: a fit that matches the trials' load by constants no server has is not trusted either
        (docs/guides/simulator.md, "Server calibration families")."""
        if self.judged_error_pct is None or self.judged_error_pct > FIT_TOLERANCE_PCT:
            return False
        return self.workload_error_pct is None or (self.fit_error_pct or 0.0) <= 2 * FIT_TOLERANCE_PCT

    def spec(self) -> GPUSpec:
        base, _ = reference(self.device)
        return dataclasses.replace(
            base,
            name=f"{self.device} (fitted)",
            bf16_flops=base.bf16_flops * self.flops_scale,
            mem_bandwidth=base.mem_bandwidth * self.bandwidth_scale,
        )

    def label(self) -> str:
        error = f", fit error {self.fit_error_pct:.1f}%" if self.fit_error_pct is not None else ""
        if self.workload_error_pct is not None:
            error += f" ({self.workload_error_pct:.1f}% on the tune's workload)"
        return self.cost_family.describe(self) + error

    def roofline(self, config: EngineConfig) -> RooflineCostModel:
        """The reference roofline, scaled (spec) and with this step overhead: the roofline family's steps, and
        every family's memory."""
        from chunkbench.sim.roofline import RooflineCostModel

        _, base = reference(self.device)
        return RooflineCostModel(
            config.model,
            self.spec(),
            tensor_parallel_size=config.tensor_parallel_size,
            kv_dtype_bytes=config.cache.kv_dtype_bytes(2),
            step_overhead_s=self.step_overhead_s,
            engine="fitted",
            calibration=Calibration(base.constants, True, self.label()),
        )

    def cost_model(self, config: EngineConfig) -> CostModel:
        return self.cost_family.cost_model(self, config)

    def save(self, path: Path) -> None:
        from chunkbench.files import write_json

        write_json({"format": FORMAT, **dataclasses.asdict(self)}, Path(path))

    @classmethod
    def load(cls, path: Path) -> ServerCalibration:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"--calibration: cannot read {path}: {exc}") from None
        if data.pop("format", None) != FORMAT:
            raise UserError(
                f"--calibration: {path} is not a server calibration ({FORMAT}); it is written by "
                "`chunkbench tune --presearch sim`"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except UserError as exc:
            raise UserError(f"--calibration: {path}: {exc}") from None
        except TypeError as exc:  # a required field missing
            raise UserError(f"--calibration: {path} is incomplete: {exc}") from None


def delayed(serve, calibration: ServerCalibration | None):
    """`serve` with the calibration's client latency and jitter (CostFamily.client_delay) added to every token
    time of its results, streamed as the client receives them (`streamed`); `serve` itself when there are none.
    SimBackend.session wraps its runs in it."""
    latency, jitter = calibration.cost_family.client_delay(calibration) if calibration is not None else (0.0, 0.0)
    if not latency and not jitter:
        return serve

    def run(*args, **kwargs):
        result = serve(*args, **kwargs)
        for seed, record in enumerate(result.requests):
            times = np.asarray(record.token_times, dtype=float) + latency
            streamed(record, jittered(times, jitter, jitter_draws(len(times), seed)) if jitter else times)
        ends = [r.token_times[-1] for r in result.requests if r.ok]
        first = min((r.arrival_time for r in result.requests), default=0.0)
        result.duration = max(ends, default=first) - first
        return result

    return run


def jitter_draws(tokens: int, seed: int) -> np.ndarray:
    """The unit exponential draws of a stream's `tokens` tokens, the stream's `seed`-th in its run: a simulated
    run stays repeatable."""
    return np.random.default_rng(seed).exponential(size=tokens)


def jittered(times, jitter_s: float, draws: np.ndarray) -> np.ndarray:
    """A stream's token times (s, in order) as its client sees them with a mean output jitter of `jitter_s`
    (sim/cpu_linear_cost.py): each delayed by jitter_s times its draw (jitter_draws), none before the one ahead."""
    times = np.asarray(times, dtype=float)
    return np.maximum.accumulate(times + jitter_s * draws) if jitter_s and len(times) else times


def streamed(record, times: np.ndarray) -> None:
    """Set `record`'s token times to `times` (in order), tokens of the same time in one output event: the
    jitter held one back and it reached the client with the one behind it. vLLM's API server merges the outputs
    a request's stream has not sent yet into one chunk, and vLLM's client (and chunkbench's) counts an ITL per
    chunk: the gap before the chunk, no gap of 0 inside it. The token count stays (num_output_tokens); a paused
    gap moves to its token's chunk."""
    first = np.concatenate(([True], np.diff(times) > 0)) if len(times) else np.zeros(0, dtype=bool)
    if first.all():
        record.token_times = times.tolist()
        return
    chunk = np.cumsum(first) - 1
    record.num_output_tokens = len(times) if record.num_output_tokens is None else record.num_output_tokens
    record.paused_gaps = tuple(sorted({int(chunk[i]) for i in record.paused_gaps if i < len(chunk) and chunk[i]}))
    record.token_times = times[first].tolist()
