"""docs/concepts/metrics.md's table is metric_table.METRIC_TABLE, and the table names every key a summary can hold."""

import re

from chunkbench.engine.outputs import StepRecord

from chunkbench.bench.metric_table import METRIC_TABLE, metric_table_markdown
from chunkbench.bench.metrics import RequestRecord, summarize
from tests.conftest import REPO

README = REPO / "docs" / "concepts" / "metrics.md"


def readme_table() -> str:
    text = README.read_text()
    start = text.index("| metric | definition | unit |")
    return text[start : text.index("\n\n", start)]


def covered(key: str) -> bool:
    for name in (part for m in METRIC_TABLE for part in m.name.split(" / ")):
        suffix = name[3:] if name.startswith("...") else name.split("}", 1)[1] if name.startswith("{") else None
        if key == name or (suffix and key.endswith(suffix)):
            return True
    return bool(re.fullmatch(r"sla_attainment_\w+_pct", key))  # one per SLO given


def test_the_readme_table_is_the_metric_table():
    assert readme_table() == metric_table_markdown()


def test_every_summary_key_is_in_the_table():
    engine = RequestRecord(10, 3, 0.0, [0.5, 0.7, 1.0], first_scheduled_time=0.1, paused_gaps=(2,))
    endpoint = RequestRecord(
        10, 3, 0.0, [0.5, 0.7, 1.0], send_time=0.2, num_output_tokens=3, output_token_source="usage"
    )
    steps = [StepRecord(0.0, 0.05, 0, 1, 1, 0, 3, num_paused_decodes=1), StepRecord(0.1, 0.5, 30, 0, 2, 0, 4)]
    keys = set(summarize([engine], steps, 1.0, {"ttft": 300.0}, num_kv_blocks=8, extra_percentiles=[99.9]))
    keys |= set(summarize([endpoint], [], 1.0, {"tpot": 50.0}))
    assert {
        "num_paused_decodes",
        "num_slow_steps",
        "slow_step_threshold_ms",
        "stall_threshold_ms",
        "p99_client_queue_time_ms",
        "p99.9_ttft_ms",
    } <= keys
    assert [k for k in sorted(keys) if not covered(k)] == []
