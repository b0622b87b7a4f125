#!/usr/bin/env bash
# On any CUDA machine, in under 5 minutes: the GPU tests (compiled kernels, bf16 included), then the kernel
# benchmark. Run from the repository root after `make install` (or with chunkbench installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CB=${CB:-.venv/bin/chunkbench}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
"$PY" -m pytest -q tests/engine/test_kernels.py tests/engine/test_equivalence.py -x -k "not float64"
"$CB" kernels check
"$CB" kernels bench --json "${OUT:-results}/kernels_bench.json"
