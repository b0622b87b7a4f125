"""The CPU path's decode attention: cpu_decode.c, compiled once per machine and called through ctypes.

The torch path gathers each decode's keys out of the paged cache into a padded copy (`index_select`) and then
runs SDPA over the copy, so every layer moves the batch's K and V three times. The C kernel reads each key
and value once, in place, through the block table: whole slots per request as the unit of work, and 512-bit
vectors (-mprefer-vector-width=512; gcc keeps to 256 by default). Its speed against the torch path:
docs/measurements/engine-speed.md. Where there is no C compiler, or CHUNKBENCH_CPU_KERNEL=0, `library()` is
None and decodes take the torch path (kernels/reference.py), which stays the oracle in tests.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_decode.c")
# 512-bit vectors: docs/measurements/engine-speed.md (round five)
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC"]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line
    except OSError:
        pass
    return platform.processor()


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be (no compiler) or is switched off.

    It is plain C with OpenMP, no torch headers, so it compiles in under a second (cc with FLAGS) into
    $XDG_CACHE_HOME/chunkbench (default ~/.cache/chunkbench), keyed by the source, flags and CPU. The OpenMP
    runtime it links is torch's own (the same libgomp.so.1, already loaded), so it runs on torch's threads, as
    many as `torch.get_num_threads()`."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if os.environ.get("CHUNKBENCH_CPU_KERNEL", "1") == "0" or compiler is None:
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _cpu_name().encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chunkbench"
    path = cache / f"cpu_decode-{key}.so"
    if not path.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, moved in whole: no torn file
                built = Path(tmp) / path.name
                subprocess.run(
                    [compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(built, path)
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:  # e.g. a cache on a noexec mount
        return None
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.decode_attention.argtypes = (
        [p, i64, p, p, p, i64, p, p, i64, p] + [ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_int]
    )
    lib.decode_attention.restype = None
    return lib


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an engine on `device` in `dtype` attends its decodes with the kernel: fp32 on the CPU, built."""
    return device.type == "cpu" and dtype == torch.float32 and library() is not None


def usable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel's case (`applies`), with a contiguous cache and each query token's heads contiguous."""
    return (
        k_cache.dtype == q.dtype
        and k_cache.is_contiguous()
        and q.stride(2) == 1
        and q.stride(1) == q.shape[2]
        and applies(q.device, q.dtype)
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    rows: torch.Tensor,
    block_table: torch.Tensor,
    seqlens: torch.Tensor,
    softmax_scale: float,
) -> None:
    """Attention of single-query requests: `q[rows[i]]` over the first `seqlens[i]` keys of block table row
    i, written to `out[rows[i]]` (`rows` int64, `block_table` and `seqlens` int32, all contiguous)."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    assert v_cache.is_contiguous() and out.stride(2) == 1 and out.stride(1) == head_dim
    assert rows.dtype == torch.int64 and block_table.dtype == seqlens.dtype == torch.int32
    assert rows.is_contiguous() and block_table.is_contiguous() and seqlens.is_contiguous()
    library().decode_attention(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        rows.data_ptr(),
        block_table.data_ptr(),
        block_table.stride(0),
        seqlens.data_ptr(),
        rows.shape[0],
        block_size,
        q.shape[1],
        num_kv_heads,
        head_dim,
        softmax_scale,
        torch.get_num_threads(),
    )
