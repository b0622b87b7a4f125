#!/usr/bin/env bash
# Two configurations of one server measured side by side on a noisy host (issues 18 and 31): both servers up at
# once (an idle one takes no CPU), benchmark runs alternating A B, B A, A B, ... so that a host that changes speed
# meets both alike. Goodput counts requests with TTFT <= $TTFT_MS milliseconds.
# - SERVER=chunkbench (the default): `chunkbench serve --model small`, each on one torch thread as in
#   scripts/presearch_vs_launch.sh; the workload is scripts/presearch_space.toml's (24 requests at 0.75 req/s);
#   TTFT_MS defaults to 4000 (the README's tunes' --sla-ttft).
# - SERVER=vllm: the vLLM 0.32 CPU build of .venv-vllm serving the tiny Llama as
#   scripts/presearch_vs_launch_vllm.sh launches it (the flags are its vllm_flags.txt's, after the model); the
#   workload is that script's tunes' (chat at 6 req/s, chunkbench's Poisson arrivals, seed 0; REQUESTS of them,
#   12 unless set); TTFT_MS defaults to 150; each server serves the workload once, untimed, first (a fresh vLLM
#   CPU server's first large steps are slow: tune/presearch/runs.py, warmup_requests).
# Prints every run and each configuration's medians.
#   bash scripts/head_to_head.sh ROUNDS OUT "SERVE FLAGS A" "SERVE FLAGS B"
#   e.g. ... 5 /tmp/h2h "--max-num-batched-tokens 8192 --chunk-size 512" "--max-num-batched-tokens 2048"
#        SERVER=vllm ... 7 /tmp/h2h "--max-num-batched-tokens 1024 --max-num-seqs 128 --max-model-len 2048" \
#          "--max-num-batched-tokens 8192 --max-num-seqs 64 --max-model-len 2048"
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=$1; OUT=$2; FLAGS=("$3" "$4"); PORTS=(18831 18832); PIDS=()
SERVER=${SERVER:-chunkbench}
mkdir -p "$OUT"
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
if [ "$SERVER" = vllm ]; then
  # vLLM's environment as the tier serves it (tests/vllm/env.py); assigned first, so that a failure stops here
  VLLM_ENV=$(.venv/bin/python -m tests.vllm.env)
  eval "$VLLM_ENV"
  unset TRITON_INTERPRET
  SERVE=(.venv-vllm/bin/vllm serve "$PWD/.venv-vllm/tiny-llama" --host 127.0.0.1 --enforce-eager --dtype float32)
  WORKLOAD=(--workload chat --num-requests "${REQUESTS:-12}" --rate 6 --arrival poisson --seed 0)
  TTFT_MS=${TTFT_MS:-150}
  FIRST_ROUND=0  # round 0: the untimed pass, not counted below
else
  SERVE=(env OMP_NUM_THREADS=1 .venv/bin/chunkbench serve --model small --num-blocks 1024)
  WORKLOAD=(--workload synthetic --prompt-len lognormal:192:0.8:16:768 --output-len lognormal:32:0.5:4:96
            --rate 0.75 --num-requests 24)
  TTFT_MS=${TTFT_MS:-4000}
  FIRST_ROUND=1
fi
for i in 0 1; do
  # shellcheck disable=SC2086  # the flags are a word list
  "${SERVE[@]}" ${FLAGS[$i]} --port "${PORTS[$i]}" > "$OUT/serve$i.log" 2>&1 &
  PIDS+=($!)
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.2; done
done
for round in $(seq "$FIRST_ROUND" "$ROUNDS"); do
  order=(0 1); [ $((round % 2)) -eq 0 ] && order=(1 0)
  for i in "${order[@]}"; do
    .venv/bin/chunkbench bench --endpoint "http://127.0.0.1:${PORTS[$i]}/v1" "${WORKLOAD[@]}" \
      --goodput "ttft:$TTFT_MS" --json "$OUT/run-$round-${i}.json" --out "$OUT/run-$round-$i" > /dev/null
  done
done
.venv/bin/python - "$OUT" "$ROUNDS" "${FLAGS[@]}" <<'EOF'
import json, statistics, sys
out, rounds, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = ("request_goodput", "p99_ttft_ms", "p99_itl_ms", "median_ttft_ms")
runs = {i: [json.load(open(f"{out}/run-{r}-{i}.json")) for r in range(1, rounds + 1)] for i in (0, 1)}
for i, name in enumerate("AB"):
    print(f"{name}: {flags[i]}")
    for r, s in enumerate(runs[i], 1):
        print(f"  round {r}: " + "  ".join(f"{k} {s[k]:,.3f}" for k in keys))
    print("  median:  " + "  ".join(f"{k} {statistics.median(s[k] for s in runs[i]):,.3f}" for k in keys))
a, b = (statistics.median(s["request_goodput"] for s in runs[i]) for i in (0, 1))
paired = statistics.median(x["request_goodput"] / y["request_goodput"] for x, y in zip(runs[0], runs[1]))
print(f"goodput A / B: medians {a:.3f} / {b:.3f} = {a / b:.3f}; the median of the rounds' ratios {paired:.3f}")
EOF
