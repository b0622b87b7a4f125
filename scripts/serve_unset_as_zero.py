"""Launch `chunkbench serve` from a `tune --backend launch` template that passes every knob of the search
space: launch_values() formats a knob the trial leaves unset as 0 (vLLM's "no cap"), which `chunkbench serve`
rejects for --chunk-size, --chunk-schedule, --tile and --max-partial-prefills. This drops those flags when
their value is 0 and runs `chunkbench serve` with the rest (used by the issue-18 measurements).

    python scripts/serve_unset_as_zero.py --model small --port 8011 --chunk-size {chunk_size} ...
"""

import os
import sys

UNSET_AS_ZERO = {"--chunk-size", "--chunk-schedule", "--tile", "--max-partial-prefills"}

args, given = [], sys.argv[1:]
i = 0
while i < len(given):
    if given[i] in UNSET_AS_ZERO and i + 1 < len(given) and given[i + 1] == "0":
        i += 2
        continue
    args.append(given[i])
    i += 1
os.execv(sys.executable, [sys.executable, "-m", "chunkbench.cli", "serve", *args])
