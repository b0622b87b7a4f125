"""Which backend a command runs on: the user's `--backend auto|engine|sim|launch`, the model and this machine
(a CUDA device, a saved profile) decide, once, with a note for the user when the figures are simulated."""

from __future__ import annotations

import os
from dataclasses import dataclass

from chunkbench.backends.device_defaults import device_name, has_cuda
from chunkbench.backends.engine import EngineBackend, engine_limitation
from chunkbench.backends.launched import LaunchBackend
from chunkbench.backends.sim import DEFAULT_SIM_GPU, SimBackend
from chunkbench.bench.backend import Backend
from chunkbench.engine.config import EngineConfig, ModelConfig
from chunkbench.engine.model_config import MODEL_PRESETS
from chunkbench.errors import UserError

KINDS = ("auto", "engine", "sim", "launch")


def runs_here(model: str) -> bool:
    """Whether the real engine can run this model here in useful time: any model on CUDA, and models up to
    `small` on the CPU."""
    return has_cuda() or ModelConfig.from_name(model).num_params <= MODEL_PRESETS["small"].num_params


@dataclass(frozen=True)
class Resolved:
    backend: Backend
    note: str | None = None  # what the user should be told (simulated figures, calibration used)
    verify: bool = False  # search only: re-measure the best trials on the real engine


def resolve(
    kind: str,
    model: str,
    *,
    gpu: str | None = None,
    cost_model: str | None = None,
    search: bool = False,
    launch: str | None = None,
    endpoint: str | None = None,
    launch_timeout_s: float = 300.0,
    config: EngineConfig | None = None,
    engine_overhead: str | None = None,
) -> Resolved:
    """`auto` for a run: the real engine unless the model is too large for this machine, then the simulator
    on a stated GPU. `auto` for a search (`search=True`): the simulator, calibrated by this machine's profile
    of the model when there is one, with the best trials verified on the real engine when the model runs
    here. A `config` the real engine cannot run (tensor parallelism, an fp8 cache) makes `auto` simulate, on
    the roofline, and `engine` an error."""
    from chunkbench.sim.roofline import gpu_spec

    if kind not in KINDS or (kind == "launch" and not search):
        allowed = KINDS if search else KINDS[:3]
        raise UserError(f"--backend must be {', '.join(allowed[:-1])} or {allowed[-1]}, got '{kind}'")
    if gpu is not None:
        gpu_spec(gpu)  # validated before anything runs
    from chunkbench.sim.engine_overhead import engine_overhead as check_overhead

    check_overhead(engine_overhead)  # likewise
    if kind == "launch":
        if not launch or not endpoint:
            raise UserError("--backend launch needs --launch COMMAND and --endpoint URL")
        return Resolved(LaunchBackend(launch, endpoint, launch_timeout_s))
    limitation = engine_limitation(config)
    if kind == "engine":
        if limitation:
            raise UserError(limitation)
        return Resolved(EngineBackend())
    if limitation and kind == "auto":
        chosen = _simulated(gpu, cost_model, engine_overhead)
        return Resolved(
            chosen.backend,
            f"{limitation.split(' needs')[0]}: {chosen.note}" + ("" if gpu else "; pass --gpu to choose"),
        )
    if kind == "sim" or gpu or (cost_model and not search):
        return _simulated(gpu, cost_model, engine_overhead)
    local = runs_here(model)
    if not search:
        if local:
            return Resolved(EngineBackend())
        chosen = _simulated(None, None, engine_overhead)
        return Resolved(
            chosen.backend,
            f"no CUDA device here and {model} is larger than 'small': {chosen.note}; pass --gpu to choose",
        )
    from chunkbench.calibration.profile import profile_path

    profile = cost_model or profile_path(device_name(), ModelConfig.from_name(model).name)
    if cost_model or os.path.exists(profile):  # a missing --cost-model fails when it is loaded, by name
        return Resolved(
            SimBackend(cost_model=profile),
            f"searching in simulation calibrated by {profile}"
            + ("; the best trials are re-measured on the real engine" if local else ""),
            verify=local,
        )
    hint = f" (run `chunkbench profile --model {model}` to calibrate for this machine)" if local else ""
    backend = SimBackend(DEFAULT_SIM_GPU, engine_overhead=engine_overhead)
    return Resolved(backend, f"searching SIMULATED with the {backend.roofline_label()}{hint}; no real-engine check")


def _simulated(gpu: str | None, cost_model: str | None, engine_overhead: str | None = None) -> Resolved:
    backend = SimBackend(
        gpu=None if cost_model else gpu or DEFAULT_SIM_GPU, cost_model=cost_model, engine_overhead=engine_overhead
    )
    what = f"profile {cost_model}" if cost_model else f"the {backend.roofline_label()}"
    return Resolved(backend, f"the figures below are SIMULATED with {what}")
