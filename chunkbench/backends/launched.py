"""Servers launched per configuration from a command template (`tune --backend launch --launch ...`): the
template's placeholders ({model}, every knob, each server kind's {vllm_flags}, {sglang_flags}, {chunkbench_flags},
and the slot's {port}, {gpus},
{cpus}, {slot}: chunkbench/launch/node.py), and the LaunchBackend that starts, checks, measures and stops one server
per session.

A launch is trusted only as far as it can be checked: its slot's port must be free before it starts, the
server must still be alive when it is healthy and after each run, and the process that listens on the port
must be the server (or one of its children) wherever /proc shows it. Every server runs under a watchdog
(chunkbench/launch/guard.py, chunkbench/launch/process.py) that stops it when the tune closes its pipe or
dies, SIGKILL included."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from chunkbench import servers
from chunkbench.backends.endpoint import EndpointBackend
from chunkbench.bench.backend import Backend, Serve
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS, release
from chunkbench.launch.gpu_monitor import GpuMonitor
from chunkbench.launch.node import Slot, fill_endpoint
from chunkbench.launch.ports import holder_text, port_busy
from chunkbench.launch.process import Launched, LaunchError, check_not_stopping, check_owner, start_server
from chunkbench.launch.template import check_launch
from chunkbench.servers.kind import first_chunk_cap

__all__ = ["LaunchBackend", "LaunchError", "launch_command", "launch_values", "log_tail"]


def launch_values(config: EngineConfig, versions: dict | None = None) -> dict:
    """The placeholders of a --launch command: {model}, every knob of engine/knobs.py by name and by its vLLM
    option (dashes as underscores), a knob the config leaves unset as 0 (vLLM's 'no cap'); and each server
    kind's whole flag list with unset knobs left out (chunkbench/servers/): {vllm_flags} (`vllm serve {model}
    {vllm_flags}`), {sglang_flags}, {chunkbench_flags} (`chunkbench serve --model small {chunkbench_flags}`),
    for the release `versions` names per kind (default: its newest)."""
    values = {"model": config.model.hf_dir or config.model.name}
    for knob in KNOBS.values():
        value = knob.read(config)
        value = ",".join(map(str, value)) if isinstance(value, tuple) else value
        values[knob.name] = 0 if value in (None, "") else value
    values["long_prefill_token_threshold"] = first_chunk_cap(config.scheduler) or 0
    values |= {k.vllm.replace("-", "_"): values[k.name] for k in KNOBS.values() if k.vllm}
    versions = versions or {}
    values |= {k.placeholder: k.option_flags(config, versions.get(k.name, "")) for k in servers.kinds()}
    return values


def launch_command(template: str, config: EngineConfig, slot: Slot | None = None, versions: dict | None = None) -> str:
    values = launch_values(config, versions) | (slot or Slot()).values()
    check_launch(template, config, [slot or Slot()], values)
    return template.format(**values)


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
    come up, dies, or cannot be shown to be the one answering raises LaunchError (a failed trial, not a failed
    study). `slot`: where it runs (for_slot gives one backend per slot)."""

    launch: str  # the command, with {knob} and slot placeholders (launch_values, Slot.values)
    endpoint: str  # its OpenAI base URL, e.g. http://127.0.0.1:{port}/v1
    timeout_s: float = 300.0  # to wait for /health
    client_options: dict = field(default_factory=dict)
    slot: Slot = field(default_factory=Slot)
    node: tuple[Slot, ...] = ()  # every slot of the tune (--slots); empty: this one
    figures: dict = field(default_factory=dict, repr=False)  # the last session's: its server's release, NVML figures
    versions: dict = field(default_factory=dict)  # server kind -> the release its flags target (servers/)
    warms_up = True
    relaunched = True

    @property
    def slots(self) -> list[LaunchBackend]:
        """One backend per slot of the node, each launching into its own slot."""
        return [replace(self, slot=slot, figures={}) for slot in self.node] or [self]

    @property
    def url(self) -> str:
        return fill_endpoint(self.endpoint, self.slot)

    @contextlib.contextmanager
    def session(self, config: EngineConfig, log: Path | None = None) -> Iterator[Serve]:
        from chunkbench.bench.client import wait_healthy

        with contextlib.ExitStack() as stack:
            where = f" (whole log: {log})" if log else ""
            if log is None:  # nobody keeps it: a temporary file, still quoted when the launch fails
                log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunkbench-launch-"))) / "launch.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            url = self.url
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            if port_busy(parts.hostname or "127.0.0.1", port):
                raise LaunchError(
                    f"port {port} (slot {self.slot.index}) is already in use{holder_text(port)}: a server "
                    "from before, or another program; stop it, or choose another --port-base"
                )
            env = {"CUDA_VISIBLE_DEVICES": self.slot.values()["gpus"]} if self.slot.gpus else {}
            server = start_server(launch_command(self.launch, config, self.slot, self.versions), log, env, port)
            stack.callback(server.stop)
            try:
                wait_healthy(url, self.timeout_s, server.guard)
                owner = check_owner(server, port)
            except RuntimeError as exc:
                raise LaunchError(f"{exc}; its output ended: {log_tail(log)}{where}") from None
            self.figures.clear()
            version = self._check_version(url, log)
            with log.open("a") as out:
                out.write(f"chunkbench: healthy at {url}: {owner}" + (f"; vLLM {version}" if version else "") + "\n")
            monitor = GpuMonitor.maybe(self.slot.gpus)
            if monitor is not None:
                stack.callback(lambda: self.figures.update(monitor.stop()))
            with EndpointBackend(url, client_options=self.client_options).session(config) as serve:
                yield self._checked(serve, server, parts.hostname or "127.0.0.1", port, log)

    def _check_version(self, url: str, log: Path) -> str | None:
        """The launched server's vLLM release (GET /version), kept in the trial's figures; a release other than
        the one the tune targets fails the trial: its configs would name options that server has not got."""
        from chunkbench.bench.client_rules import server_version

        version = server_version(url)
        if version is None:
            return None
        self.figures["server_version"] = version
        target = self.versions.get("vllm")
        if target and servers.recognise(self.launch) is servers.get("vllm"):
            if release(version)[:2] != release(target)[:2]:
                raise LaunchError(
                    f"the launched server is vLLM {version}, and the tune targets vLLM {target}: give "
                    f"--vllm-version {version}, or launch vLLM {target}; its output ended: {log_tail(log)}"
                )
        return version

    @staticmethod
    def _checked(serve: Serve, server: Launched, host: str, port: int, log: Path) -> Serve:
        """Each run's figures count only if the server that served them is still the one on the port: one
        that exited or stopped answering during the run fails the trial, naming what and how many requests."""

        def run(*args, **kwargs):
            result = serve(*args, **kwargs)
            check_not_stopping()  # its server was stopped under it
            failed = [r.error for r in result.requests if r.error]
            lost = f"{len(failed)} of {len(result.requests)} requests failed" + (f" ({failed[0]})" if failed else "")
            if not server.alive():
                raise LaunchError(
                    f"the launched server exited with code {server.guard.returncode} during a run: {lost}; its "
                    f"output ended: {log_tail(log)}"
                )
            if not port_busy(host, port):
                raise LaunchError(f"the launched server stopped answering on port {port} during a run: {lost}")
            check_owner(server, port)
            return result

        return run

    def __str__(self) -> str:
        return f"launched server at {self.url}"
