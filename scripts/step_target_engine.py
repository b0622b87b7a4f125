"""The real engine holds a step-time target: p99 step time against the target on rag-mix, and median TTFT
against the fixed token budget whose steps reach the same p99.

    flock /tmp/chunkbench-cpu.lock .venv/bin/python scripts/step_target_engine.py --target-ms 300

Steps are timed in this thread's CPU time on one torch thread (as the CI gate does: engine.CpuClock, which
has the executor time its steps in CPU time), so other processes on a shared machine move neither the
measurement nor the online correction. The cost model is a quick calibration (device_defaults.quick_profile) in the same
CPU time, corrected online (engine/step_time.py: OnlineCorrection).
"""

from __future__ import annotations

import argparse
import time

import torch
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import CpuClock, LLMEngine
from chunkbench.engine.executor import ModelExecutor
from chunkbench.engine.step_time import OnlineCorrection

from chunkbench.backends.device_defaults import quick_profile
from chunkbench.bench.harness import run_workload
from chunkbench.bench.metrics import summarize
from chunkbench.workloads.spec import WorkloadSpec, build_workload


def run(config: EngineConfig, executor, requests, step_cost=None) -> dict:
    engine = LLMEngine(config, executor=executor, clock=CpuClock(), step_cost=step_cost)
    result = run_workload(engine, requests, progress=False)
    summary = summarize(result.requests, result.steps, result.duration, None, result.num_kv_blocks)
    prefill_ms = [s.seconds * 1000 for s in result.steps if s.prefill_tokens]
    summary["p99_prefill_step_ms"] = sorted(prefill_ms)[int(0.99 * (len(prefill_ms) - 1))] if prefill_ms else 0
    summary["ratio"] = getattr(step_cost, "ratio", None)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--budgets", default="64,128,192,256,384")
    args = parser.parse_args()
    start = time.perf_counter()
    torch.set_num_threads(1)
    base = EngineConfig.create(args.model, policy="chunked", max_num_batched_tokens=8192)
    executor = ModelExecutor(base)
    executor.timer = CpuClock.timer  # the quick calibration too; the runs' CpuClock sets the same (LLMEngine)
    cost = quick_profile(base, executor)
    requests = build_workload(WorkloadSpec(name="rag-mix", num_requests=args.num_requests, rate=args.rate), 8192)
    rows = [
        (
            "target",
            args.target_ms,
            run(
                EngineConfig.create(
                    args.model, policy="chunked", max_num_batched_tokens=8192, step_time_target_ms=args.target_ms
                ),
                executor,
                requests,
                OnlineCorrection(cost.predict),
            ),
        )
    ]
    for budget in map(int, args.budgets.split(",")):
        rows.append(
            (
                "budget",
                budget,
                run(
                    EngineConfig.create(args.model, policy="chunked", max_num_batched_tokens=budget), executor, requests
                ),
            )
        )
    print(f"{args.model}, rag-mix, {args.num_requests} requests at {args.rate} req/s; CPU time, one thread\n")
    print("| config | p99 step ms | p99 step / target | max step ms | median TTFT ms | p99 ITL ms | correction |")
    print("|---|---|---|---|---|---|---|")
    for kind, value, s in rows:
        label = f"target {value:g} ms" if kind == "target" else f"budget {value}"
        ratio = s["p99_step_ms"] / args.target_ms
        print(
            f"| {label} | {s['p99_step_ms']:,.0f} | {ratio:.2f} | {s['max_step_ms']:,.0f} | "
            f"{s['median_ttft_ms']:,.0f} | {s['p99_itl_ms']:,.0f} | "
            f"{'-' if s['ratio'] is None else round(s['ratio'], 2)} |"
        )
    target = rows[0][2]
    meets = [r for r in rows[1:] if r[2]["p99_step_ms"] <= target["p99_step_ms"]]
    if meets:
        kind, budget, fixed = max(meets, key=lambda r: r[1])
        print(
            f"\nthe largest fixed budget whose p99 step <= the target's ({target['p99_step_ms']:,.0f} ms): {budget}; "
            f"median TTFT target / fixed = {target['median_ttft_ms'] / fixed['median_ttft_ms']:.2f}"
        )
    print(f"\nwall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
