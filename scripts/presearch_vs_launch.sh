#!/usr/bin/env bash
# Issue 18's measurement: `tune --presearch sim` against `--backend launch` on launched `chunkbench serve --model
# small` servers (CPU), the default space on a 24-request workload (scripts/presearch_space.toml). Each server
# runs torch on one thread (OMP_NUM_THREADS=1): on 2 cores, two threads that meet at every op's barrier stall
# whenever the benchmark client or the tuner takes a core (measured on one launch, 4 runs each: median ITL
# 173-341 ms with two threads, 175-198 ms with one), and a GPU server does not share its device with its client.
#   bash scripts/presearch_vs_launch.sh PORT OUT [tune flags...]
#   e.g. ... 18803 /tmp/pre --presearch sim --verify-top 3 --n-trials 60 --sla-ttft 4s --objective goodput
#        ... 18802 /tmp/base --n-trials 60 --sla-ttft 4s --objective goodput
# (the launch-all tune re-measures its best 3 before it picks; --verify-top 0 reports its best single run)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=$1; OUT=$2; shift 2
SERVE="$PWD/.venv/bin/chunkbench serve --model small --port $PORT --num-blocks 1024"
LAUNCH="env OMP_NUM_THREADS=1 $SERVE {chunkbench_flags}"
/usr/bin/time -f "WALL %e s" .venv/bin/python -m chunkbench.cli tune --model small --num-blocks 1024 \
  --space scripts/presearch_space.toml --backend launch --launch "$LAUNCH" --endpoint "http://127.0.0.1:$PORT/v1" \
  --launch-timeout 120 --no-progress --out "$OUT" "$@"
