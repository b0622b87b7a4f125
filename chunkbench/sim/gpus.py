"""Accelerator specs: dense bf16 tensor FLOP/s (no sparsity), memory bandwidth, memory size, and the GPU-to-GPU
link tensor parallelism uses (GPUSpec says where the link figures come from).

Figures are the vendors' datasheet peaks: NVIDIA A100 datasheet (SXM4 variants), H100 datasheet
(SXM5 / PCIe), H200 product brief, L40S / L4 datasheets, Ada architecture whitepaper (RTX 4090, FP32
accumulate), AMD Instinct MI300X datasheet. NVIDIA publishes no A10G datasheet: its figure is the A10's
scaled by the A10G's lower tensor throughput as reported by AWS, and is approximate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. `link_bandwidth` is one GPU's bandwidth in ONE direction (datasheets quote both
    directions added: NVLink 3 on A100 SXM 600 GB/s, NVLink 4 on H100/H200 SXM 900 GB/s, PCIe 4.0 x16 64 GB/s,
    PCIe 5.0 x16 128 GB/s; MI300X: 7 Infinity Fabric links of 128 GB/s, 896 GB/s peer to peer), which is what a
    ring all-reduce streams at. H100 PCIe counts its PCIe 5.0 link (its NVLink bridge joins only pairs); the RTX
    4090 has no peer-to-peer, so its traffic crosses the host over PCIe 4.0. `link_latency` is the per-message
    (per ring step) latency; datasheets do not give it: NCCL's tuning model uses about 1 us per hop on NVLink and
    2 us over PCIe for the low-latency protocols (nccl src/graph/tuning.cc, hwLat), which we take, and 2 us for
    Infinity Fabric (RCCL uses NCCL's model)."""

    name: str
    bf16_flops: float  # dense, FLOP/s
    mem_bandwidth: float  # bytes/s
    mem_bytes: float
    link_bandwidth: float  # bytes/s, one direction, per GPU
    link_latency: float  # s per message (ring step)
    link: str  # the interconnect, for messages

    def __str__(self) -> str:
        return (
            f"{self.name} ({self.bf16_flops / 1e12:.0f} TFLOP/s bf16, {self.mem_bandwidth / 1e12:.2f} TB/s, "
            f"{self.mem_bytes / 1e9:.0f} GB)"
        )


GB = 1e9
NVLINK3, NVLINK4, PCIE4, PCIE5 = 300 * GB, 450 * GB, 32 * GB, 64 * GB  # one direction
US = 1e-6
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("a100-40g", 312e12, 1555 * GB, 40 * GB, NVLINK3, 1 * US, "NVLink 3"),
        GPUSpec("a100-80g", 312e12, 2039 * GB, 80 * GB, NVLINK3, 1 * US, "NVLink 3"),
        GPUSpec("h100-sxm", 989e12, 3350 * GB, 80 * GB, NVLINK4, 1 * US, "NVLink 4"),
        GPUSpec("h100-pcie", 756e12, 2000 * GB, 80 * GB, PCIE5, 2 * US, "PCIe 5.0"),
        GPUSpec("h200", 989e12, 4800 * GB, 141 * GB, NVLINK4, 1 * US, "NVLink 4"),
        GPUSpec("l40s", 362e12, 864 * GB, 48 * GB, PCIE4, 2 * US, "PCIe 4.0"),
        GPUSpec("l4", 121e12, 300 * GB, 24 * GB, PCIE4, 2 * US, "PCIe 4.0"),
        GPUSpec("a10g", 70e12, 600 * GB, 24 * GB, PCIE4, 2 * US, "PCIe 4.0"),
        GPUSpec("rtx-4090", 165e12, 1008 * GB, 24 * GB, PCIE4, 2 * US, "PCIe 4.0 through the host"),
        GPUSpec("mi300x", 1307e12, 5300 * GB, 192 * GB, 448 * GB, 2 * US, "Infinity Fabric"),
    ]
}

_DEVICE_NAMES = [
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-40GB", "a100-40g"),
    ("A100", "a100-80g"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("A10G", "a10g"),
    ("4090", "rtx-4090"),
    ("MI300X", "mi300x"),
]


def spec_for_device(device_name: str) -> GPUSpec | None:
    """The spec of a device by its CUDA name (e.g. 'NVIDIA H200'), or None when unknown."""
    for fragment, key in _DEVICE_NAMES:
        if fragment in device_name:
            return GPUS[key]
    return None
