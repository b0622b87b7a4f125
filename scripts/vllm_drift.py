"""How much the tier's served vLLM changes speed: one launch (as the vLLM tier serves it: tests/vllm/env.py
`vllm_env`), the calibration's warm-up, then the calibration's workload run (tune/presearch/runs.py, the tier
calibration test's tune) served --passes times in a row; per pass, the ITL median, mean and p99 (ms), the
longest gap, and the E2EL sum of each repeat of the workload over the requests every repeat has (the same
requests at the same offsets, so equal sums mean an equally fast server: presearch.server.copy_sums). Then, with
--prompts, each prompt length's TTFT (ms) on the same launch: five sent alone 0.4 s apart, twice, then four
among six decodes. Run it a few times, minutes apart, and alone:

    flock /tmp/chunkbench-cpu.lock .venv/bin/python scripts/vllm_drift.py [--passes 4] [--prompts 100,727]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.vllm.conftest import VLLM_CLI, vllm_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=4, help="times the workload run is served on the launch")
    parser.add_argument("--log", default="vllm-drift.log", help="where the server's output goes")
    parser.add_argument("--prompts", default="", help="comma-separated prompt lengths (tokens) to time alone")
    args = parser.parse_args()
    os.environ.update(vllm_env())
    os.environ.pop("TRITON_INTERPRET", None)

    import numpy as np

    from chunkbench.tune.presearch.runs import design_requests, designs, run_figures, warm_up
    from chunkbench.tune.presearch.server import copy_sums
    from chunkbench.workloads.spec import WorkloadRequest
    from tests.vllm.test_server_calibration import tier_launch, tune_spec

    launch = tier_launch()
    spec = tune_spec(str(VLLM_CLI.parents[1] / "tiny-llama"), launch)
    design = next(d for d in designs(spec) if d.name == "workload")
    config = spec.base_config(**design.knobs)
    max_len = config.scheduler.max_model_len
    requests = design_requests(asdict(design.workload), design.take, design.primer, max_len, design.repeat)
    once = spec.workload.num_requests
    with launch.session(config, log=Path(args.log)) as serve:
        warm_up(serve, config, seed=1)
        for k in range(args.passes):
            figures = run_figures(serve(requests, seed=2 * k, warmup_steps=0, progress=False))
            sums = [round(s) for s in copy_sums(figures, once)]
            gaps = np.asarray(figures["itl_ms"])
            print(
                f"pass {k}: ITL median {np.median(gaps):.2f} mean {gaps.mean():.2f} p99 "
                f"{np.percentile(gaps, 99):.2f} ms, longest gap {gaps.max():.0f} ms; E2EL of each repeat's "
                f"shared requests {sums} ms",
                flush=True,
            )
        lengths = [int(n) for n in args.prompts.split(",") if n]
        for seed in range(2):
            for n in lengths:
                alone = serve([WorkloadRequest(n, 2, 0.4 * k) for k in range(5)], seed=100 + 10 * seed + n)
                print(f"prompt {n} alone: TTFT {[round(1e3 * r.ttft, 1) for r in alone.requests]} ms", flush=True)
        for n in lengths:
            decodes = [WorkloadRequest(32, 150, 0.0)] * 6
            mixed = serve(decodes + [WorkloadRequest(n, 2, 0.15 + 0.3 * k) for k in range(4)], seed=500 + n)
            gaps = 1e3 * np.concatenate([r.itls for r in mixed.requests[:6]])
            print(
                f"prompt {n} among 6 decodes: TTFT {[round(1e3 * r.ttft, 1) for r in mixed.requests[6:]]} ms, "
                f"the decodes' ITL median {np.median(gaps):.2f} ms, longest {gaps.max():.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
