"""The processes of launched servers: each started under the watchdog (chunkbench/launch/guard.py), kept in
one registry so that SIGINT/SIGTERM stop them all at once, and checked to be the process that answers on
its port before its figures count."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunkbench.errors import Interrupted
from chunkbench.launch.ports import descendants, describe, holder_text, port_holders

GUARD = str(Path(__file__).with_name("guard.py"))
ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # a command's leading NAME=value words set the environment


def split_environment(command: str) -> tuple[dict[str, str], list[str]]:
    """A filled template as (environment, argv): leading NAME=value words set variables, as in a shell."""
    words = shlex.split(command)
    env = {}
    while words and ENV_WORD.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


class LaunchError(RuntimeError):
    """A launched server that never became healthy, died, or cannot be shown to be the one measured (a failed
    trial); the message quotes its last lines or names the port's holder."""


@dataclass
class Launched:
    """A running server: the watchdog process and the tune's end of its pipe (closing it stops the server)."""

    guard: subprocess.Popen
    pipe: int | None  # None once closed: a closed descriptor's number may already name another file
    port: int | None

    def alive(self) -> bool:
        return self.guard.poll() is None

    def close_pipe(self) -> None:
        """Close the tune's end once (the guard then stops the server), whoever asks first."""
        with _LIVE_LOCK:
            pipe, self.pipe = self.pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.close(pipe)

    def stop(self, wait_s: float = 30.0) -> None:
        self.close_pipe()
        try:
            self.guard.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.guard.kill()  # the guard itself hung: its server group still goes when the pipe is closed
            self.guard.wait()
        with _LIVE_LOCK:
            _LIVE.pop(self.guard.pid, None)


_LIVE: dict[int, Launched] = {}  # every server this process runs now, by guard pid
_LIVE_LOCK = threading.RLock()  # re-entrant: the signal handler may run while this thread holds it
STOPPING = threading.Event()  # set by SIGINT/SIGTERM: no server starts, no run's figures count
_SIGNAL = [2]  # the signal that set STOPPING
_LAUNCHED = threading.Event()  # this process has launched a server


def stop_everything(signum: int) -> bool:
    """SIGINT, SIGTERM: from now on nothing launches, and every server this process runs is stopped. Whether
    this process launches servers: then the work in flight fails with its servers and check_not_stopping
    raises where it is safe (an exception raised in a signal handler can land in a finaliser, which Python
    ignores)."""
    _SIGNAL[0] = signum
    STOPPING.set()
    stop_all_servers()
    return _LAUNCHED.is_set()


def stopped_by() -> int:
    """The signal that stopped this process (SIGINT when none did: a KeyboardInterrupt of another cause)."""
    return _SIGNAL[0] if STOPPING.is_set() else 2


def check_not_stopping() -> None:
    if STOPPING.is_set():
        raise Interrupted(_SIGNAL[0])


@contextlib.contextmanager
def stopping_wins():
    """Within: a failure once SIGINT/SIGTERM has stopped this process's servers is the interrupt (Interrupted),
    not what it caused (a launch that "exited before it was healthy", a calibration that failed): the command
    then exits 128 + the signal, never 1 or 2 with a message about a server the signal stopped."""
    try:
        yield
    except Exception:
        check_not_stopping()
        raise


def whole_runs(serve: Callable[..., Any]) -> Callable[..., Any]:
    """A session's `serve` whose run either finished or raises Interrupted: the harness keeps what an interrupt
    cut short (for `run`, which writes it as partial), and a probe, trial or calibration run must never count
    those figures as a whole run's."""

    def run(*args, **kwargs):
        result = serve(*args, **kwargs)
        if getattr(result, "interrupted", False):
            raise Interrupted(stopped_by())
        check_not_stopping()
        return result

    return run


class WholeRunsBackend:
    """A backend whose sessions' runs are whole_runs, all else the backend's (compare: a capacity probe or a
    policy's run that an interrupt cut short raises, so no verdict is drawn from it)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def __str__(self) -> str:
        return str(self.backend)

    @contextlib.contextmanager
    def session(self, config, log: Path | None = None):
        with self.backend.session(config, log=log) as serve:
            yield whole_runs(serve)

    def run(self, config, workload, **options):
        with self.session(config) as serve:
            return serve(workload, **options)


def stop_all_servers() -> None:
    """Stop every server this process launched: all pipes closed at once, then waited for."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for server in live:
        server.close_pipe()
    for server in live:
        server.stop(wait_s=15)


def start_server(command: str, log: Path, env: dict[str, str], port: int | None) -> Launched:
    """Start `command` under the watchdog, its output in `log`."""
    check_not_stopping()
    _LAUNCHED.set()
    extra, argv = split_environment(command)
    if not argv:
        raise LaunchError(f"the launch command `{command}` has no program")
    read_end, write_end = os.pipe()
    try:
        with open(log, "w") as out:
            out.write(f"$ {command}\n")
            out.flush()
            # The guard by its path, not `-m chunkbench.launch.guard`: the package's import (torch) is no part
            # of a watchdog that sits beside every server.
            guard = subprocess.Popen(
                [sys.executable, GUARD, str(read_end), "--", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(read_end,),
                start_new_session=True,
                env=os.environ | env | extra,
            )
    except OSError as exc:
        os.close(write_end)
        raise LaunchError(f"cannot start `{command}`: {exc.strerror}") from None
    finally:
        os.close(read_end)
    server = Launched(guard, write_end, port)
    with _LIVE_LOCK:
        _LIVE[guard.pid] = server
    return server


def check_owner(server: Launched, port: int | None) -> str:
    """How the server answering on `port` is known to be this launch's; LaunchError if it is not."""
    if not server.alive():
        raise LaunchError(
            f"the server exited with code {server.guard.returncode}, yet its port answers: "
            f"another process is serving on port {port}{holder_text(port) if port else ''}"
        )
    holders = port_holders(port) if port else None
    if holders:
        ours = descendants(server.guard.pid)
        if not holders & ours:
            raise LaunchError(
                f"port {port} is served by {', '.join(describe(p) for p in sorted(holders))}, "
                "not by the server this trial started"
            )
        return f"port {port} held by {describe(min(holders & ours))}"
    return f"port {port} was free before the launch; its server alive throughout"


def stop_server(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to a process group started with start_new_session, SIGKILL after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
