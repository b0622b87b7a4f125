"""Dynamic chunking in simulation: a step-time target (--step-time-target) against the best fixed token
budget found by an exhaustive sweep, and the two seed claims. Prints Markdown tables.

    .venv/bin/python scripts/dynamic_vs_fixed.py capacity      # capacity at p99 TBT <= 50 / 100 ms
    .venv/bin/python scripts/dynamic_vs_fixed.py throughput    # claim: dynamic sizing +40% throughput under an SLA
    .venv/bin/python scripts/dynamic_vs_fixed.py num-chunks    # claim: 4-8 chunks usually best on long-doc

Capacity is Sarathi-Serve's (chunkbench/tune/objectives/capacity.py): the highest arrival rate whose run
meets p99 TBT with a median scheduling delay <= 2 s, bisected to about 2%. Each arm is the best over its own
sweep: fixed token budgets (no time target) against time targets (budget 8192 as the hard cap).
"""

from __future__ import annotations

import argparse
import time

from chunkbench.backends.sim import SimBackend
from chunkbench.bench.slo import parse_slas
from chunkbench.tune.objectives import evaluate
from chunkbench.tune.space import SearchSpace
from chunkbench.tune.spec import TuneSpec
from chunkbench.workloads.spec import WorkloadSpec, build_workload

BUDGETS = (256, 512, 768, 1024, 1536, 2048, 3072)
TARGET_FRACTIONS = (0.8, 0.9, 1.0)  # of the TBT SLA
CASES = [  # (model, tensor parallel size, a starting rate near its capacity: fewer runs to bracket it)
    ("llama-3-8b", 1, 32.0),
    ("llama-3.1-70b", 4, 16.0),
]
WORKLOADS = ("rag-mix", "azure-conv")


def spec_for(model: str, tp: int, workload: WorkloadSpec, sla_ms: float, objective: str) -> TuneSpec:
    overrides = {"tensor_parallel_size": tp, "max_model_len": 8192}
    return TuneSpec(
        model,
        parse_slas({"tbt": f"{sla_ms}ms"}),
        SearchSpace({"policy": ["chunked"]}),
        workload,
        SimBackend("h100-sxm"),
        objective=objective,
        engine_overrides=overrides,
    )


def trial(spec: TuneSpec, requests, **knobs) -> dict:
    outcome = evaluate(spec, {"policy": "chunked", **knobs}, requests)
    return outcome.metrics | {"value": outcome.values[0], "feasible": outcome.feasible}


def best(rows: list[tuple[str, dict]], key: str) -> tuple[str, dict]:
    return max(rows, key=lambda r: (r[1]["feasible"], r[1][key]))


def sweep(spec: TuneSpec, requests, sla_ms: float, key: str) -> tuple[tuple[str, dict], tuple[str, dict]]:
    fixed = [(f"budget {b}", trial(spec, requests, max_num_batched_tokens=b)) for b in BUDGETS]
    timed = [
        (
            f"target {f * sla_ms:g} ms",
            trial(spec, requests, max_num_batched_tokens=8192, step_time_target_ms=f * sla_ms),
        )
        for f in TARGET_FRACTIONS
    ]
    return best(fixed, key), best(timed, key)


def capacity_table(num_requests: int, only: str | None) -> None:
    print(
        "| model | workload | SLA p99 TBT | best fixed budget | capacity req/s | best time target | capacity req/s "
        "| gain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model, tp, rate in CASES:
        if only and model != only:
            continue
        for name in WORKLOADS:
            # Traces: timestamps scaled so the run starts at `rate` too (the trace's own rate is about 1.4/s).
            workload = WorkloadSpec(name=name, num_requests=num_requests, rate=rate, time_scale=1.4 / rate)
            requests = build_workload(workload, 8192)
            for sla in (50.0, 100.0):
                spec = spec_for(model, tp, workload, sla, "capacity")
                (fl, f), (tl, t) = sweep(spec, requests, sla, "value")
                gain = t["value"] / f["value"] if f["value"] else float("inf")
                print(
                    f"| {model} TP{tp} | {name} | {sla:g} ms | {fl} | {f['value']:.2f} | {tl} | {t['value']:.2f} "
                    f"| {gain:.2f}x |",
                    flush=True,
                )
                print(
                    f"<!-- {model} {name} {sla}: fixed p99 TBT {f.get('p99_itl_ms', 0):.1f} ms, sched delay "
                    f"{f.get('median_scheduling_delay_ms', 0):.0f} ms; target p99 TBT {t.get('p99_itl_ms', 0):.1f}"
                    f" ms, sched delay {t.get('median_scheduling_delay_ms', 0):.0f} ms -->",
                    flush=True,
                )


def throughput_table(num_requests: int, rate_factor: float) -> None:
    """Overloaded (Poisson arrivals at `rate_factor` x the case's rate near capacity, so a queue always waits
    and throughput is what the steps can take): the best output throughput meeting p99 TBT, per arm."""
    print(
        "| model | workload | rate req/s | SLA p99 TBT | best fixed budget | output tok/s | p99 TBT ms "
        "| best time target | output tok/s | p99 TBT ms | gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, tp, near_capacity in CASES:
        for name in WORKLOADS:
            rate = near_capacity * rate_factor
            workload = WorkloadSpec(name=name, num_requests=num_requests, rate=rate, arrival="poisson")
            requests = build_workload(workload, 8192)
            for sla in (50.0, 100.0):
                spec = spec_for(model, tp, workload, sla, "goodput")
                rows = {}
                for label, knobs in [(f"budget {b}", dict(max_num_batched_tokens=b)) for b in BUDGETS] + [
                    (f"target {f * sla:g} ms", dict(max_num_batched_tokens=8192, step_time_target_ms=f * sla))
                    for f in TARGET_FRACTIONS
                ]:
                    rows[label] = trial(spec, requests, **knobs)

                def feasible(label, rows=rows, sla=sla):
                    return rows[label]["p99_itl_ms"] <= sla

                def pick(prefix, rows=rows):
                    """The arm of this kind that meets the SLA with the most output throughput."""
                    return max(
                        (label for label in rows if label.startswith(prefix)),
                        key=lambda label: (feasible(label), rows[label]["output_throughput"]),
                    )

                fl, tl = pick("budget"), pick("target")
                f, t = rows[fl], rows[tl]
                gain = t["output_throughput"] / f["output_throughput"] if feasible(fl) else float("nan")
                print(
                    f"| {model} TP{tp} | {name} | {rate:g} | {sla:g} ms | {fl}{'' if feasible(fl) else ' (misses)'} | "
                    f"{f['output_throughput']:,.0f} | {f['p99_itl_ms']:.1f} | {tl}{'' if feasible(tl) else ' (misses)'}"
                    f" | {t['output_throughput']:,.0f} | {t['p99_itl_ms']:.1f} | {gain:.2f}x |",
                    flush=True,
                )


def num_chunks_table(num_requests: int) -> None:
    """long-doc (8k-32k-token prompts) on llama-3.1-8b at two arrival rates: N chunks per prompt against
    fixed per-request caps, budget 8192 (a capacity search on so few long requests would measure a burst)."""
    print("| rate req/s | rule | median TTFT ms | p99 TTFT ms | p99 TBT ms | output tok/s |")
    print("|---|---|---|---|---|---|")
    model, sla = "llama-3.1-8b", 100.0
    arms = (
        [(f"num_chunks {n}", dict(num_chunks=n)) for n in (1, 2, 4, 8, 16)]
        + [(f"chunk_size {c}", dict(chunk_size=c)) for c in (512, 1024, 2048, 4096)]
        + [("budget only", {})]
    )
    for rate in (0.5, 1.0):
        workload = WorkloadSpec(name="long-doc", num_requests=num_requests, rate=rate)
        requests = build_workload(workload, 33024)
        spec = spec_for(model, 1, workload, sla, "goodput")
        spec.engine_overrides["max_model_len"] = 33024
        for label, knobs in arms:
            m = trial(spec, requests, max_num_batched_tokens=8192, **knobs)
            print(
                f"| {rate:g} | {label} | {m['median_ttft_ms']:,.0f} | {m['p99_ttft_ms']:,.0f} | "
                f"{m['p99_itl_ms']:.1f} | {m['output_throughput']:,.0f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=("capacity", "throughput", "num-chunks"))
    parser.add_argument("--num-requests", type=int, default=500)
    parser.add_argument("--model", help="capacity: only this model's rows")
    parser.add_argument(
        "--rate-factor",
        type=float,
        default=2.0,
        help="throughput: Poisson arrivals at this many times each case's rate near capacity (an overload)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    if args.table == "capacity":
        capacity_table(args.num_requests, args.model)
    elif args.table == "throughput":
        throughput_table(args.num_requests, args.rate_factor)
    else:
        num_chunks_table(args.num_requests)
    print(f"\n{args.table}: {time.perf_counter() - start:.0f} s of wall time")


if __name__ == "__main__":
    main()
