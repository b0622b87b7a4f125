"""--plot-timeline: each request as a bar from its send to its last token, one self-contained HTML file (inline
SVG, no script, nothing fetched). The wait for the first token is grey; each gap between tokens is coloured by
its length against two thresholds, as vllm bench serve's timeline: green below the first, orange up to the
second, red above. Hovering a bar shows the request's figures."""

from __future__ import annotations

import html
from pathlib import Path

from chunkbench.bench.metrics import RequestRecord
from chunkbench.errors import UserError, check_number
from chunkbench.files import write_text

ROW, LEFT, WIDTH, TOP = 14, 60, 1100, 40  # px: a request's row, the axis labels, the plot, the legend
COLOURS = {"wait": "#b0b0b0", "low": "#2ca02c", "mid": "#ff7f0e", "high": "#d62728", "failed": "#7f0000"}


def parse_thresholds(text: str) -> tuple[float, float]:
    """--timeline-itl-thresholds: two increasing milliseconds, 'LOW,HIGH'."""
    try:
        low, high = (float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--timeline-itl-thresholds must be two numbers in ms, 'LOW,HIGH', got '{text}'") from None
    for value in (low, high):
        check_number("--timeline-itl-thresholds", value, low=0)
    if low > high:
        raise UserError(f"--timeline-itl-thresholds needs 0 <= LOW <= HIGH, got '{text}'")
    return low, high


def _segments(record: RequestRecord, low_s: float, high_s: float) -> list[tuple[float, float, str]]:
    """(start, end, colour) on the run's clock; neighbouring gaps of one colour are merged."""
    times = record.token_times
    if not times:
        return [(record.latency_origin, record.end_time or record.latency_origin, "failed")]
    segments = [(record.latency_origin, times[0], "wait")]
    for before, after in zip(times, times[1:]):
        gap = after - before
        kind = "low" if gap < low_s else "mid" if gap <= high_s else "high"
        if segments[-1][2] == kind and segments[-1][1] == before:
            segments[-1] = (segments[-1][0], after, kind)
        else:
            segments.append((before, after, kind))
    return segments


def _tooltip(index: int, record: RequestRecord) -> str:
    if not record.token_times:
        return f"request {index}: failed: {record.error or 'no token'}"
    ttft = (record.token_times[0] - record.latency_origin) * 1e3
    e2el = (record.token_times[-1] - record.latency_origin) * 1e3
    kind = "probe" if record.probe else "request"
    return (
        f"{kind} {index}: {record.prompt_len} prompt tokens, {record.num_output_tokens or len(record.token_times)}"
        f" output tokens; TTFT {ttft:,.1f} ms, E2EL {e2el:,.1f} ms"
    )


def timeline_html(records: list[RequestRecord], itl_thresholds_ms: tuple[float, float], title: str) -> str:
    low_s, high_s = (t / 1e3 for t in itl_thresholds_ms)
    order = sorted(range(len(records)), key=lambda i: records[i].latency_origin)
    start = min((records[i].latency_origin for i in order), default=0.0)
    end = max([start + 1e-3] + [max(r.token_times[-1] if r.token_times else 0.0, r.end_time or 0.0) for r in records])
    scale = WIDTH / (end - start)
    height = TOP + ROW * len(order) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    for x, (name, label) in enumerate(
        [
            ("wait", "to first token"),
            ("low", f"ITL < {itl_thresholds_ms[0]:g} ms"),
            ("mid", f"ITL <= {itl_thresholds_ms[1]:g} ms"),
            ("high", f"ITL > {itl_thresholds_ms[1]:g} ms"),
            ("failed", "failed"),
        ]
    ):
        parts.append(
            f'<rect x="{LEFT + 170 * x}" y="8" width="12" height="12" fill="{COLOURS[name]}"/>'
            f'<text x="{LEFT + 170 * x + 16}" y="18">{html.escape(label)}</text>'
        )
    for row, i in enumerate(order):
        y = TOP + row * ROW
        parts.append(f"<g><title>{html.escape(_tooltip(i, records[i]))}</title>")
        for a, b, kind in _segments(records[i], low_s, high_s):
            parts.append(
                f'<rect x="{LEFT + (a - start) * scale:.2f}" y="{y}" width="{max((b - a) * scale, 0.5):.2f}"'
                f' height="{ROW - 3}" fill="{COLOURS[kind]}"/>'
            )
        parts.append("</g>")
    for k in range(6):  # the time axis, seconds from the first send
        x = LEFT + WIDTH * k / 5
        parts.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle">{(end - start) * k / 5:.2f} s</text>')
    parts.append("</svg>")
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
        f"<body><h3>{html.escape(title)}</h3>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def write_timeline(
    records: list[RequestRecord], path: Path, itl_thresholds_ms: tuple[float, float], title: str
) -> Path:
    write_text(timeline_html(records, itl_thresholds_ms, title), path)
    return path
