"""The registry of a server calibration's cost-model families (the interface: sim/cost_family.py).

Built in:
- `roofline` (sim/roofline_family.py): the reference device's roofline with its peaks scaled and a per-step
  and per-sequence overhead; what a GPU server is fitted with.
- `linear` (sim/linear_cost.py): a step cost linear in what the scheduler put in the step.
- `linear-cpu` (sim/cpu_linear_cost.py): `linear` plus the terms of a CPU-served vLLM (page faults, oneDNN
  primitives, periodic stalls, output jitter). A calibration that names `linear` on a CPU server (the `cpu`
  reference) gets it: that is what every linear calibration written before the split holds.

Adding a family: a module with a CostFamily subclass, and one `register` call (below for the built-in ones).
"""

from __future__ import annotations

from chunkbench.registry import Registry
from chunkbench.sim.cost_family import CostFamily
from chunkbench.sim.cpu_linear_cost import CPU_LINEAR
from chunkbench.sim.linear_cost import LINEAR
from chunkbench.sim.roofline_family import ROOFLINE

CPU_DEVICES = ("cpu",)  # references that stand for a server running on a CPU
AUTO = "auto"  # fit_name: the device's default family
_FAMILIES: Registry[CostFamily] = Registry("family", "server calibration: unknown family '{name}'; use {known_or}")
_ON_CPU: dict[str, CostFamily] = {}  # a family's name -> the family a CPU server gets for it


def register(family: CostFamily) -> CostFamily:
    """Make `family` known by its name, once; returns it."""
    if not family.name:
        raise ValueError(f"{type(family).__name__}: a family needs a name")
    _FAMILIES.register(family.name, family)
    if family.cpu_variant_of:
        _ON_CPU[family.cpu_variant_of] = family
    return family


def unregister(name: str) -> None:
    family = _FAMILIES.unregister(name)
    if family is None:
        raise KeyError(name)
    if family.cpu_variant_of and _ON_CPU.get(family.cpu_variant_of) is family:
        del _ON_CPU[family.cpu_variant_of]


def names() -> tuple[str, ...]:
    return _FAMILIES.names()


def on_cpu(device: str) -> bool:
    return device in CPU_DEVICES


def get(name: str) -> CostFamily:
    return _FAMILIES.get(name)


def resolve(name: str, device: str) -> CostFamily:
    """The family that prices a calibration stored as `name` on reference `device`."""
    family = get(name)
    return _ON_CPU.get(name, family) if on_cpu(device) else family


def fit_name(name: str, device: str) -> str:
    """The family a fit on `device` stores: `name`, or for AUTO linear on a CPU server (resolved to its CPU
    variant) and the roofline on a GPU, whose kernel shapes come from measured operator profiles."""
    if name != AUTO:
        get(name)
        return name
    return LINEAR.name if on_cpu(device) else ROOFLINE.name


for _family in (ROOFLINE, LINEAR, CPU_LINEAR):
    register(_family)
