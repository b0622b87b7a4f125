"""What a fresh vLLM server's steps cost, pass after pass: one launch as the vLLM tier serves it (tests/vllm/env.py
`vllm_env`), the calibration's budget-sized warm-up (presearch.runs.warmup_requests) and then one calibration
design's requests (tune/presearch/runs.py, the tier calibration test's tune), or the test's held-out workload
at its budget (--design held-out), served --passes times in a row, each pass with other prompts, with the engine
core's steps logged inside the server (scripts/vllm_step_log/sitecustomize.py, loaded through the server's
PYTHONPATH). Per pass: the TTFTs (ms), its page faults, resident memory, median TTFT and p99 ITL; then the
steps of --min-tokens or more: their time (ms), tokens, first-chunk tokens, decodes, minor page faults, system
CPU time (ms) and the engine core's resident memory after them (MB). A calibration run, and a launched trial, is
pass 0 here (sim/linear_cost.py, `fresh_pair_s`).
Run it alone:

    flock /tmp/chunkbench-cpu.lock .venv/bin/python scripts/vllm_step_log.py [--design workload] [--passes 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.vllm.conftest import VLLM_CLI, vllm_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--design",
        default="workload",
        choices=("prefill", "decode", "mixed", "workload", "held-out"),
        help="which calibration run's requests to serve, or the calibration test's held-out workload",
    )
    parser.add_argument("--passes", type=int, default=3, help="times the design's requests are served on the launch")
    parser.add_argument("--min-tokens", type=int, default=200, help="list the steps of at least this many tokens")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-step-log-"))
    os.environ.update(vllm_env(VLLM_STEP_LOG=str(log_dir), PYTHONPATH=str(REPO / "scripts" / "vllm_step_log")))
    os.environ.pop("TRITON_INTERPRET", None)

    import numpy as np

    from chunkbench.bench.metrics import summarize
    from chunkbench.tune.presearch.runs import design_requests, designs, warm_up
    from chunkbench.workloads.spec import build_workload
    from tests.vllm.test_server_calibration import HELD_OUT, HELD_OUT_BUDGET, tier_launch, tune_spec

    launch = tier_launch()
    spec = tune_spec(str(VLLM_CLI.parents[1] / "tiny-llama"), launch)
    if args.design == "held-out":
        config = spec.base_config(max_num_batched_tokens=HELD_OUT_BUDGET)
        requests = build_workload(HELD_OUT, config.scheduler.max_model_len)
    else:
        design = next(d for d in designs(spec) if d.name == args.design)
        config = spec.base_config(**design.knobs)
        requests = design_requests(
            asdict(design.workload), design.take, design.primer, config.scheduler.max_model_len, design.repeat
        )
    passes, figures = [], []  # each pass's (start, end) on perf_counter's clock, the engine core log's too
    with launch.session(config, log=log_dir / "server.log") as serve:
        warm_up(serve, config, seed=1)
        for k in range(args.passes):
            begun = time.perf_counter()
            result = serve(requests, seed=2 * k, warmup_steps=0, progress=False)
            passes.append((begun, time.perf_counter()))
            figures.append(summarize(result.requests, result.steps, result.duration, endpoint=True))
            print(f"pass {k}: TTFT {[round(1e3 * r.ttft, 1) for r in result.requests]} ms", flush=True)
    (steps_file,) = log_dir.glob("steps-*.tsv")
    steps = np.loadtxt(steps_file, ndmin=2)
    for k, ((begun, ended), summary) in enumerate(zip(passes, figures)):
        served = steps[(steps[:, 0] >= begun) & (steps[:, 0] <= ended)]
        if not len(served):
            print(f"pass {k}: no step logged")
            continue
        print(
            f"pass {k}: {len(served)} steps, {served[:, 4].sum():.0f} page faults, resident memory "
            f"{served[0, 7]:.0f} -> {served[-1, 7]:.0f} MB; median TTFT {summary['median_ttft_ms']:.2f} ms, "
            f"p99 ITL {summary['p99_itl_ms']:.2f} ms"
        )
    print(f"steps of {args.min_tokens} tokens or more (the server's log and all steps: {log_dir}):")
    print("  pass       ms  tokens  first-chunk tokens  decodes  page faults  system ms  resident MB")
    for start, end, tokens, _, faults, _, system_ms, rss, first, _, decodes in steps[steps[:, 2] >= args.min_tokens]:
        where = next((str(k) for k, (a, b) in enumerate(passes) if a <= start <= b), "warm-up")
        print(
            f"  {where:7s} {1e3 * (end - start):6.1f} {tokens:7.0f} {first:19.0f} {decodes:8.0f} {faults:12.0f} "
            f"{system_ms:10.1f} {rss:12.0f}"
        )


if __name__ == "__main__":
    main()
