"""Servers launched per configuration from a command template (`tune --backend launch --launch ...`): the
template's placeholders ({model}, every knob, {vllm_flags}, {chunkbench_flags}), the LaunchBackend that starts,
measures and stops one server per session with its output in a log, and the error a server that never comes up
raises, quoting that log."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from chunkbench.backends import Backend, EndpointBackend, Serve
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS
from chunkbench.errors import UserError


def launches_vllm(template: str) -> bool:
    """Whether a --launch command starts vLLM: `vllm serve` (any path to the CLI), vLLM's API server module, or
    a template filled with {vllm_flags}."""
    return bool(re.search(r"(^|[\s/])vllm\s+serve\b|vllm\.entrypoints|\{vllm_flags\}", template))


def launch_values(config: EngineConfig) -> dict:
    """The placeholders of a --launch command: {model}, every knob of engine/knobs.py by name and by its vLLM
    option (dashes as underscores), a knob the config leaves unset as 0 (vLLM's 'no cap'); and whole flag
    lists with unset knobs left out: {vllm_flags} (vLLM's options, e.g. `vllm serve {model} {vllm_flags}`) and
    {chunkbench_flags} (`chunkbench serve --model small {chunkbench_flags}`)."""
    from chunkbench.tune.emit import chunkbench_flags, first_chunk_cap, vllm_option_flags

    values = {"model": config.model.hf_dir or config.model.name}
    for knob in KNOBS.values():
        value = knob.read(config)
        value = ",".join(map(str, value)) if isinstance(value, tuple) else value
        values[knob.name] = 0 if value in (None, "") else value
    values["long_prefill_token_threshold"] = first_chunk_cap(config.scheduler) or 0
    values |= {k.vllm.replace("-", "_"): values[k.name] for k in KNOBS.values() if k.vllm}
    values |= {"vllm_flags": vllm_option_flags(config), "chunkbench_flags": chunkbench_flags(config)}
    return values


def launch_command(template: str, config: EngineConfig) -> str:
    values = launch_values(config)
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(f"--launch: cannot fill '{template}': unknown placeholder {exc}; use "
                        f"{', '.join('{' + k + '}' for k in sorted(values))}") from None


class LaunchError(RuntimeError):
    """A launched server that never became healthy (a failed trial); the message quotes its last lines."""


def log_tail(path: Path, lines: int = 3, width: int = 300) -> str:
    """The last non-blank lines of a server's log in one line, e.g. vLLM's `vllm: error: unrecognized ...`."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    kept = [line.strip()[:width] for line in text if line.strip()][-lines:]
    return " | ".join(kept) or "(no output)"


@dataclass
class LaunchBackend(Backend):
    """A server started for each config from a command template, measured over HTTP, stopped after the
    session. Its output goes to `log` (tune keeps one per trial: trials/<n>/launch.log). A server that does not
    come up raises LaunchError quoting the log's last lines (a failed trial, not a failed study)."""

    launch: str  # the command, with {knob} placeholders (launch_values)
    endpoint: str  # its OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    timeout_s: float = 300.0  # to wait for /health
    client_options: dict = field(default_factory=dict)
    kind = "launch"
    warms_up = True

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        from chunkbench.client import wait_healthy

        with contextlib.ExitStack() as stack:
            where = f" (whole log: {log})" if log else ""
            if log is None:  # nobody keeps it: a temporary file, still quoted when the launch fails
                log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunkbench-launch-"))) / "launch.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            command = launch_command(self.launch, config)
            with open(log, "w") as out:
                out.write(f"$ {command}\n")
                out.flush()
                try:
                    process = subprocess.Popen(shlex.split(command), stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)
                except OSError as exc:  # no such program, not executable
                    raise LaunchError(f"cannot start `{command}`: {exc.strerror}") from None
            stack.callback(stop_server, process)
            try:
                wait_healthy(self.endpoint, self.timeout_s, process)
            except RuntimeError as exc:
                raise LaunchError(f"{exc}; its output ended: {log_tail(log)}{where}") from None
            with EndpointBackend(self.endpoint, client_options=self.client_options).session(config) as serve:
                yield serve

    def __str__(self) -> str:
        return f"launched server at {self.endpoint}"


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
