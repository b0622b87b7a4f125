#!/usr/bin/env bash
# The vLLM 0.34 scheduler oracle's world, idempotent: vLLM 0.34.0's wheel (a CUDA build) installed without its
# dependencies into its own venv (.venv-vllm034, never .venv or .venv-vllm) beside the local torch 2.13.0+cpu
# and only the pure-Python packages that `vllm.v1.core.sched.scheduler` imports. No engine, worker or GPU
# runs there: tests/vllm/vllm_scheduler_oracle.py drives the Scheduler class in-process (vllm._C is missing
# and only warned about). Prints the venv's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM034_VENV:-.venv-vllm034}
PY=$VENV/bin/python
STAMP=$VENV/.installed-0.34.0
PYTHON=${PYTHON:-python3}
# pip's output goes to a log shown only if it fails: its resolver reports every CUDA dependency of the wheel
# left out (flashinfer, torch 2.14, ...) as a conflict, which here is the point.
pip_install() {
  "$PY" -m pip install --quiet "$@" >"$VENV/pip.log" 2>&1 || { cat "$VENV/pip.log" >&2; exit 1; }
}
if [ ! -f "$STAMP" ]; then
  test -x "$PY" || "$PYTHON" -m venv "$VENV"
  # torch first, the build on this disk: with --no-deps below nothing can pull vLLM's CUDA torch 2.14.
  pip_install torch==2.13.0
  pip_install --no-deps vllm==0.34.0
  # What the scheduler's import path imports, within the wheel's pins (its METADATA): the config classes
  # (pydantic, transformers for the model's config), the request and output structs (msgspec, pyzmq),
  # structured output's grammar backends (imported though unused), and the helpers they import.
  pip_install \
    'transformers>=5.16.1,<5.23.0' 'tokenizers>=0.23.3' 'huggingface_hub>=2.0.0' 'safetensors>=0.6.2' \
    'pydantic>=2.12.0' msgspec 'pyzmq>=25.0.0' 'llguidance>=1.7.0,<1.8.0' 'xgrammar==0.2.8' einops \
    cachetools psutil regex numpy 'requests>=2.33.0' tqdm py-cpuinfo pyyaml cloudpickle cbor2 pybase64 \
    sentencepiece tiktoken 'pillow>=13.0.0' 'prometheus_client>=0.18.0' 'aiohttp>=3.14.4' uvloop
  touch "$STAMP"
fi
echo "$PY"
