#!/usr/bin/env bash
# Issue 31's acceptance, measured once: `tune --presearch sim` against launching every trial, on the real vLLM
# 0.32 CPU build of .venv-vllm (the tiny Llama, fp32, eager), the same space, workload and SLA. Each prints its
# wall time (WALL ... s); the winners' measured goodput is in OUT/verified.json (presearch: OUT/presearch.json).
#   flock /tmp/chunkbench-cpu.lock bash scripts/presearch_vs_launch_vllm.sh PORT OUT [tune flags...]
#   e.g. ... 18811 /tmp/pre --presearch sim --verify-top 2 --n-trials 30
#        ... 18812 /tmp/all --n-trials 30 --verify-top 2
# The two tunes verify their winners minutes apart, on a host whose speed moves more than the winners differ;
# then measure the two winners side by side (the flags after the model in each OUT/vllm_flags.txt):
#   SERVER=vllm bash scripts/head_to_head.sh 7 /tmp/h2h "$(cut -d' ' -f4- /tmp/pre/vllm_flags.txt)" \
#     "$(cut -d' ' -f4- /tmp/all/vllm_flags.txt)"
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=$1; OUT=$2; shift 2
MODEL="$PWD/.venv-vllm/tiny-llama"
# vLLM's environment as the tier serves it (tests/vllm/env.py says why: the model in the engine core's process,
# TCMalloc preloaded when installed); assigned first, so that a failure stops the script (set -e)
VLLM_ENV=$(.venv/bin/python -m tests.vllm.env)
eval "$VLLM_ENV"
unset TRITON_INTERPRET
LAUNCH="$PWD/.venv-vllm/bin/vllm serve {model} {vllm_flags} --port $PORT --host 127.0.0.1 --enforce-eager --dtype float32"
/usr/bin/time -f "WALL %e s" .venv/bin/python -m chunkbench.cli tune --model "$MODEL" --backend launch \
  --launch "$LAUNCH" --endpoint "http://127.0.0.1:$PORT/v1" --workload chat --num-requests 12 --rate 6 \
  --sla-ttft 5s --objective goodput --verify-repeats 1 --no-progress --out "$OUT" "$@"
