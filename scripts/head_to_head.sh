#!/usr/bin/env bash
# Two configurations of `chunkbench serve --model small` measured side by side on a noisy host (issue 18): both
# servers up at once (an idle one takes no CPU), each on one torch thread as in scripts/presearch_vs_launch.sh,
# benchmark runs alternating A B, B A, A B, ... so that a host that changes speed meets both alike. The workload
# is scripts/presearch_space.toml's (24 requests at 0.75 req/s); goodput counts requests with TTFT <= $TTFT_MS
# milliseconds (default 4000, the README's tunes' --sla-ttft).
# Prints every run and each configuration's medians.
#   bash scripts/head_to_head.sh ROUNDS OUT "SERVE FLAGS A" "SERVE FLAGS B"
#   e.g. ... 5 /tmp/h2h "--max-num-batched-tokens 8192 --chunk-size 512" "--max-num-batched-tokens 2048"
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=$1; OUT=$2; FLAGS=("$3" "$4"); PORTS=(18831 18832); PIDS=()
mkdir -p "$OUT"
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for i in 0 1; do
  # shellcheck disable=SC2086  # the flags are a word list
  OMP_NUM_THREADS=1 .venv/bin/chunkbench serve --model small --num-blocks 1024 --port "${PORTS[$i]}" ${FLAGS[$i]} \
    > "$OUT/serve$i.log" 2>&1 &
  PIDS+=($!)
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.2; done
done
for round in $(seq "$ROUNDS"); do
  order=(0 1); [ $((round % 2)) -eq 0 ] && order=(1 0)
  for i in "${order[@]}"; do
    .venv/bin/chunkbench bench --endpoint "http://127.0.0.1:${PORTS[$i]}/v1" --workload synthetic \
      --prompt-len lognormal:192:0.8:16:768 --output-len lognormal:32:0.5:4:96 --rate 0.75 --num-requests 24 \
      --goodput "ttft:${TTFT_MS:-4000}" --json "$OUT/run-$round-${i}.json" --out "$OUT/run-$round-$i" > /dev/null
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
