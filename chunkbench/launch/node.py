"""A node split into launch slots (`tune --backend launch --slots/--gpus/--cpus`): each slot's port, GPUs
and cores, and the placeholders ({port}, {gpus}, {cpus}, {slot}) that put a launched server in its slot."""

from __future__ import annotations

from dataclasses import dataclass

from chunkbench.errors import UserError


@dataclass(frozen=True)
class Slot:
    """Where one launched server runs: its port and, on a GPU node, its GPUs (CUDA_VISIBLE_DEVICES), or on a
    CPU machine the cores it may bind ({cpus}, e.g. for VLLM_CPU_OMP_THREADS_BIND)."""

    index: int = 0
    port: int = 8000
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()

    def values(self) -> dict:
        return {
            "slot": self.index,
            "port": self.port,
            "gpus": ",".join(map(str, self.gpus)),
            "cpus": ",".join(map(str, self.cpus)),
        }

    def __str__(self) -> str:
        where = (
            [f"port {self.port}"]
            + ([f"GPUs {self.values()['gpus']}"] if self.gpus else [])
            + ([f"CPUs {self.values()['cpus']}"] if self.cpus else [])
        )
        return f"slot {self.index} ({', '.join(where)})"


def id_list(flag: str, text: str | None) -> tuple[int, ...]:
    """'0,1,2,3' or '0-3' (or a mix) as device or core numbers."""
    if not text:
        return ()
    ids: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise UserError(f"{flag}: '{part.strip()}' is not a number or a range like 0-3 (in '{text}')")
        ids += range(int(low), int(high or low) + 1)
    if len(set(ids)) != len(ids):
        raise UserError(f"{flag}: '{text}' names a device twice")
    return tuple(ids)


def plan_slots(
    slots: int | None,
    port_base: int,
    gpus: str | None = None,
    gpus_per_trial: int = 1,
    cpus: str | None = None,
    cpus_per_trial: int = 1,
) -> list[Slot]:
    """The slots of a node: `slots` of them, or as many as the --gpus (--cpus) list makes groups of
    --gpus-per-trial (--cpus-per-trial); slot i listens on port_base + i."""
    gpu_ids, cpu_ids = id_list("--gpus", gpus), id_list("--cpus", cpus)
    groups = []
    for flag, ids, per in (("--gpus", gpu_ids, gpus_per_trial), ("--cpus", cpu_ids, cpus_per_trial)):
        if per < 1:
            raise UserError(f"{flag}-per-trial must be at least 1, got {per}")
        count = len(ids) // per if ids else None
        if ids and count == 0:
            raise UserError(f"{flag} names {len(ids)} devices, fewer than {flag}-per-trial {per}")
        groups.append(count)
    possible = [g for g in groups if g is not None]
    count = slots if slots is not None else min(possible, default=1)
    if count < 1:
        raise UserError(f"--slots must be at least 1, got {count}")
    for flag, ids, per, found in zip(
        ("--gpus", "--cpus"), (gpu_ids, cpu_ids), (gpus_per_trial, cpus_per_trial), groups
    ):
        if found is not None and found < count:
            raise UserError(
                f"--slots {count} needs {count * per} of {flag} ({per} per slot: {flag}-per-trial), and {flag} "
                f"names {len(ids)}: name more, or give fewer --slots"
            )
    if not 1 <= port_base <= 65535 - count + 1:
        last = 65535 - count + 1
        raise UserError(
            f"--port-base must be a port from 1 to {last} (slot i listens on --port-base + i, ports end at 65535), "
            f"got {port_base}"
        )
    return [
        Slot(
            i,
            port_base + i,
            gpu_ids[i * gpus_per_trial : (i + 1) * gpus_per_trial] if gpu_ids else (),
            cpu_ids[i * cpus_per_trial : (i + 1) * cpus_per_trial] if cpu_ids else (),
        )
        for i in range(count)
    ]


def fill_endpoint(endpoint: str, slot: Slot) -> str:
    """The endpoint with the slot's {port}, {slot}, {gpus}, {cpus} (no other braces are read: it is a URL)."""
    for name, value in slot.values().items():
        endpoint = endpoint.replace("{" + name + "}", str(value))
    return endpoint


def varies_by_slot(text: str) -> bool:
    return "{port}" in text or "{slot}" in text
