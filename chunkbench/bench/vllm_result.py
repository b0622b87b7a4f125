"""`chunkbench bench --save-result`: the run as the JSON file `vllm bench serve --save-result` writes, with its
key names and layout, so that tools that read vLLM's results read chunkbench's.

The layout: the setup (date, endpoint_type, backend, label, model_id, tokenizer_id, num_prompts), the traffic
(request_rate, burstiness, max_concurrency), the totals and throughputs, the per-request latencies and client
queue times, the peaks, then mean/median/std and each --metric-percentiles percentile of each
--percentile-metrics metric (ttft,tpot,itl by default); the client queue time's (and the E2EL including it)
when --max-concurrency is set. With --save-detailed, the per-request lists, and (0.33's client) the server's
own queue times and TTFTs when it sent them (server_queue_times, server_ttfts). Times are ms in the statistics
and s in the lists, as vLLM's.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from chunkbench.bench.metrics import RequestRecord
from chunkbench.errors import UserError
from chunkbench.files import write_json

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DETAILED_KEYS = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
    "server_queue_times",
    "server_ttfts",
)


def parse_percentiles(metrics: str, percentiles: str) -> tuple[list[str], list[float]]:
    """--percentile-metrics and --metric-percentiles, checked as vLLM's flags."""
    names = [m.strip() for m in metrics.split(",") if m.strip()]
    unknown = [m for m in names if m not in PERCENTILE_METRICS]
    if unknown or not names:
        raise UserError(
            f"--percentile-metrics takes a comma-separated list of {', '.join(PERCENTILE_METRICS)}, got '{metrics}'"
        )
    try:
        values = [float(p) for p in percentiles.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 <= p <= 100 for p in values):
        raise UserError(f"--metric-percentiles takes comma-separated numbers from 0 to 100, got '{percentiles}'")
    return names, values


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict:
    """vLLM's process_one_metric: mean/median/std and p<P> in ms; an empty list counts as [0]."""
    ms = np.asarray(values_s or [0.0], dtype=float) * 1000.0
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in percentiles:
        out[f"p{int(p) if int(p) == p else p}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def vllm_result(
    summary: dict,
    records: list[RequestRecord],
    *,
    api: str,
    model_id: str | None,
    tokenizer_id: str | None,
    label: str | None,
    request_rate: float | str,
    burstiness: float,
    max_concurrency: int | None,
    goodput: bool,
    metrics: list[str],
    percentiles: list[float],
    detailed: bool = False,
    metadata: dict[str, str] | None = None,
) -> dict:
    """The result dict; `summary` is chunkbench's (the same totals), `records` the run's requests."""
    backend = "openai-chat" if api == "chat" else "openai"
    result: dict = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": label,
        "model_id": model_id,
        "tokenizer_id": tokenizer_id,
        "num_prompts": len(records),
        **(metadata or {}),
        "request_rate": request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
    }
    done = [r for r in records if r.ok]
    result |= {
        key: summary[key]
        for key in (
            "duration",
            "completed",
            "failed",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
        )
    }
    result["request_goodput"] = summary["request_goodput"] if goodput else None
    result |= {key: summary[key] for key in ("output_throughput", "total_token_throughput")}
    result |= {
        "input_lens": [r.prompt_len for r in records],
        "output_lens": [r.output_tokens if r.ok else 0 for r in records],
        "ttfts": [r.ttft if r.ok else 0.0 for r in records],
        "itls": [r.itls if r.ok else [] for r in records],
        "latencies": [r.e2el if r.ok else 0.0 for r in records],
        "start_times": [r.send_time for r in records],
        "queue_times": [r.client_queue_time for r in records],
        "generated_texts": ["" for _ in records],  # chunkbench keeps token times, not text
        "errors": [r.error or "" for r in records],
        "max_output_tokens_per_s": float(summary["max_output_tokens_per_s"]),
        "max_concurrent_requests": summary["max_concurrent_requests"],
        "rtfx": 0.0,
    }
    if any(r.server_queue_time is not None or r.server_ttft is not None for r in records):
        # 0.33's client: the server's per-request metrics (s; null where a request had none), when any came
        result |= {
            "server_queue_times": [r.server_queue_time for r in records],
            "server_ttfts": [r.server_ttft for r in records],
        }
    values = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.tpot is not None],
        "itl": [g for r in done for g in r.itls],
        "e2el": [r.e2el for r in done],
    }
    for name in metrics:
        result |= _stats(name, values[name], percentiles)
    if max_concurrency is not None:
        queue = [r.client_queue_time for r in done]
        result |= _stats("client_queue_time", queue, percentiles)
        if request_rate != "inf":
            result |= _stats("e2el_including_client_queue", [r.e2el + q for r, q in zip(done, queue)], percentiles)
    result |= {k: v for k, v in summary.items() if k.startswith("probe_")}  # --probe-request-rate, as vLLM's
    if not detailed:
        result = {k: v for k, v in result.items() if k not in DETAILED_KEYS}
    return result


def result_path(result_dir: Path | None, result_filename: str | None, result: dict) -> Path:
    """vLLM's file name: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json unless --result-filename."""
    concurrency = f"-concurrency{result['max_concurrency']}" if result["max_concurrency"] is not None else ""
    model = str(result["model_id"] or "model").split("/")[-1]
    name = result_filename or (
        f"{result['label'] or result['backend']}-{result['request_rate']}qps{concurrency}-{model}-{result['date']}.json"
    )
    return (result_dir or Path(".")) / name


def save_vllm_result(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(result, path)
