"""Which vLLM release's `vllm bench serve` client `chunkbench bench` measures as: its rules for timing a stream
and sending probes, chosen once per run from the server's GET /version (or --vllm-version).

What changed between the releases chunkbench knows (engine/knobs.py's VLLM_VERSIONS), read in their clients
(vllm/benchmarks/lib/endpoint_request_func.py and vllm/benchmarks/serve.py), is one row of RULES each: how chat
chunks are timed, where probes are sent and whether the duration holds them, and whether the server's
per-request metrics are kept (ClientRules says how each differs).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from chunkbench import servers
from chunkbench.engine.knobs import VLLM_VERSION, VLLM_VERSIONS, release
from chunkbench.errors import UserError


@dataclass(frozen=True)
class ClientRules:
    """How one release's client measures; in effect from `since` until the next row of RULES.

    - Chat streams. 0.32 times every chunk that carries a choice: the opening chunk that only names the role is
      the TTFT, the first text then an ITL of ~0 ms, and an empty finish chunk an ITL that also ends the latency.
      0.33 times only the chunks whose delta carries output (text, reasoning, a tool call, or an empty text
      without a role: a token that decodes to nothing). Completions streams are timed alike in both.
    - Probes (--probe-request-rate). 0.32 sends them through the run's pool, capped at --max-concurrency, so a
      probe can wait behind the load, and stops them before the clock stops: the run's duration then holds the
      last probe and its pause. 0.33 gives them a connection of their own and stops them after the clock.
    - Server metrics. 0.33 keeps the `metrics` of the final usage chunk (a server started with
      --enable-per-request-metrics sends queue_time_ms and time_to_first_token_ms) as server_queue_times and
      server_ttfts (s) in --save-result --save-detailed."""

    since: str  # the first vLLM release with these rules
    chat_output_only: bool  # chat: only chunks whose delta carries output count (TTFT, ITL, latency, text)
    probes_own_connection: bool  # probes on a connection of their own, outside the --max-concurrency pool
    probe_tail_in_duration: bool  # probes stop before the clock: the duration holds the last one and its pause
    server_metrics: bool  # keep the final usage chunk's metrics: server queue time and TTFT per request


RULES = (
    ClientRules("0.32.0", chat_output_only=False, probes_own_connection=False, probe_tail_in_duration=True,
                server_metrics=False),
    ClientRules("0.33.0", chat_output_only=True, probes_own_connection=True, probe_tail_in_duration=False,
                server_metrics=True),
)  # fmt: skip
OLDEST, NEWEST = RULES[0], RULES[-1]


def rules_for(version: str) -> ClientRules:
    """The rules of the newest row no later than `version` (the oldest row for an older one)."""
    return next((r for r in reversed(RULES) if release(r.since) <= release(version)), OLDEST)


def known_version(given: str) -> str:
    """--vllm-version as the release chunkbench knows ('0.34', 'v0.34.0' and the patch release 0.34.1 name 0.34.0:
    chunkbench/servers/kind.py's ServerKind.target), else a UserError; bench and tune alike."""
    if re.search(r"\d", given):
        with contextlib.suppress(UserError):
            return servers.get("vllm").target(given)
    raise UserError(
        f"--vllm-version must be one of {', '.join(VLLM_VERSIONS)} (the releases chunkbench measures as), got '{given}'"
    )


def server_version(endpoint: str, timeout_s: float = 10.0) -> str | None:
    """The vLLM version a server reports at <root>/version (vLLM serves {"version": "0.34.0"} beside /v1, not
    under it); None when it reports none (not vLLM, or unreachable)."""
    import httpx

    from chunkbench import web

    url = endpoint.rstrip("/").removesuffix("/v1") + "/version"
    try:
        response = web.get(url, timeout=timeout_s)
        version = response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):  # unreachable, not JSON, not an object
        return None
    return version if isinstance(version, str) and version.strip() else None


@dataclass(frozen=True)
class Timing:
    """The rules a run measures by, the version they are for, and where that version came from."""

    version: str  # the server's (as it says it), --vllm-version's, or the newest chunkbench knows
    source: str  # e.g. "server /version"
    rules: ClientRules

    def line(self) -> str:
        return f"timing: vLLM {self.version}'s client rules ({self.source})"

    def record(self) -> dict:
        """What summary.json keeps of the choice."""
        return {
            "vllm_version": self.version,
            "vllm_version_source": self.source,
            "client_rules_since": self.rules.since,
        }


def choose_timing(endpoint: str, given: str | None) -> Timing:
    """--vllm-version when given (checked by known_version), else the server's /version; a server that has none
    (not vLLM) or names no release is measured by the newest rules, and one outside the releases chunkbench
    knows by the nearest, said so."""
    if given is not None:
        version = known_version(given)
        return Timing(version, "--vllm-version", rules_for(version))
    reported = server_version(endpoint)
    if reported is None:
        return Timing(VLLM_VERSION, "the newest: the server has no /version", NEWEST)
    if not re.search(r"\d", reported):  # a source build says "dev"
        return Timing(VLLM_VERSION, f"the newest: the server's /version '{reported}' names no release", NEWEST)
    if release(reported)[:2] > release(VLLM_VERSION)[:2]:  # a patch release keeps its minor's rules
        return Timing(VLLM_VERSION, f"the newest: the server's /version {reported} is newer", NEWEST)
    if release(reported)[:2] < release(OLDEST.since)[:2]:
        return Timing(OLDEST.since, f"the oldest: the server's /version {reported} is older", OLDEST)
    return Timing(reported, "server /version", rules_for(reported))
