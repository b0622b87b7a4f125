"""The vLLM tier: tests against the real vLLM 0.32.0 CPU build (scripts/vllm_env.sh installs it into its own
venv, .venv-vllm, with a tiny random-weight Llama). Every test under tests/vllm/ carries the `vllm` marker
(tests/conftest.py) and is skipped with one line when that venv is absent. `make test-vllm` runs the tier.

Fixtures: `tiny_model` (the HF directory both vLLM and chunkbench load), `vllm_server` (one `vllm serve` of it
for the session, its OpenAI base URL), and `start_server` (a context manager for a server of one's own)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chunkbench.launch.process import stop_server
from tests.conftest import REPO, free_port
from tests.vllm.env import vllm_env

VLLM_VENV = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
VLLM_CLI = VLLM_VENV / "bin" / "vllm"
TINY_MODEL = VLLM_VENV / "tiny-llama"
VLLM_BLOCK = 32  # vLLM's CPU attention takes multiples of 32 only


# What every vLLM server of the tier is started with: eager (no Inductor warm-up: healthy in ~26 s, not ~50) and
# fp32 (vLLM CPU's bfloat16 worker dies with SIGILL on this machine's first request; fp32 is chunkbench's too).
VLLM_FIXED_FLAGS = ("--enforce-eager", "--dtype", "float32", "--max-model-len", "2048")


def vllm_serve_args(model: Path, port: int, *flags: str) -> list[str]:
    return [str(VLLM_CLI), "serve", str(model), "--port", str(port), "--host", "127.0.0.1", *VLLM_FIXED_FLAGS, *flags]


@contextlib.contextmanager
def start_server(args: list[str], log: Path, timeout_s: float = 240.0, env: dict | None = None):
    """Run `args` (a server command with --port: vLLM's, or `chunkbench serve`) with its output in `log`; yield
    its OpenAI base URL once /health answers 200; stop it after. The log's tail is in the failure message if it
    never becomes healthy. `env`: vllm_env() unless given."""
    port = args[args.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env or vllm_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "".join(log.read_text(errors="replace").splitlines(True)[-30:])
                pytest.fail(f"`{' '.join(args[:2])}` did not become healthy (exit {process.poll()}):\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(1.0)
        yield base + "/v1"
    finally:
        stop_server(process)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama (scripts/tiny_llama.py), written by scripts/vllm_env.sh; written here if missing."""
    if not (TINY_MODEL / "config.json").exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "tiny_llama.py"), str(TINY_MODEL)], check=True)
    return TINY_MODEL


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory) -> str:
    """One `vllm serve` of the tiny model for the whole session (block size 32, eager, no prefix caching): its
    OpenAI base URL. No caching, so both clients' runs cost the server the same: vllm bench serve's timed_trace
    prompts differ in every process, chunkbench's repeat with the seed, and with caching on its runs hit the
    cache for 32 of every 64-token prompt (prefill 8.1 ms against 10.6 on the server's own histogram) and
    measured a mean TTFT 3 ms shorter on what was a shorter TTFT, not a different clock."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    flags = ("--block-size", str(VLLM_BLOCK), "--no-enable-prefix-caching")
    with start_server(vllm_serve_args(tiny_model, free_port(), *flags), log) as url:
        yield url
