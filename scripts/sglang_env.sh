#!/usr/bin/env bash
# SGLang's own command-line parser for the vLLM test tier, idempotent: sglang 0.5.23 in its own venv
# (.venv-sglang, never .venv) on the local CPU torch, with only what `from sglang.srt.server_args import
# prepare_server_args` (what `python -m sglang.launch_server` parses its flags with) imports. It serves nothing:
# SGLang needs CUDA; tests/vllm/test_sglang_args.py parses chunkbench's SGLang flags with it. Prints the venv's
# python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
PY=$VENV/bin/python
STAMP=$VENV/.installed-0.5.23
PYTHON=${PYTHON:-python3}
if [ ! -f "$STAMP" ]; then
  test -x "$PY" || "$PYTHON" -m venv "$VENV"
  # torch first, the CPU build on this disk by its local version: nothing below may pull a CUDA torch (sglang
  # 0.5.23 asks for torch 2.14.1, flashinfer, CUDA kernels: hence --no-deps from here on).
  "$PY" -m pip install --quiet torch==2.13.0+cpu
  "$PY" -m pip install --quiet --no-deps sglang==0.5.23
  # What the parser's imports reach (sglang/__init__.py, srt/utils/common.py, the arg_groups, the OpenAI
  # protocol models), found by importing it until it imported; pinned as found. triton is the project's own.
  "$PY" -m pip install --quiet --no-deps \
    numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 packaging==26.4 pillow==13.0.0 tqdm==4.70.1 \
    requests==2.34.2 urllib3==2.8.0 idna==3.21 certifi==2026.10.19.post1 charset-normalizer==3.5.3 \
    msgspec==0.23.0 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.7.0 \
    starlette==1.10.0 anyio==4.16.0 pyzmq==27.3.0 ipython==9.19.1 traitlets==5.16.1 pygments==2.21.0 \
    aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 \
    propcache==0.5.4 yarl==1.25.1 triton==3.9.0
  "$PY" -c 'from sglang.srt.server_args import prepare_server_args' # fails the install, not a test
  touch "$STAMP"
fi
echo "$PY"
