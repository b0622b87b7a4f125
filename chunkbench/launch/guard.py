"""The watchdog between a tune and a server it launched: `python guard.py FD -- COMMAND...` (standard
library only: it runs beside every launched server).

It starts COMMAND in a process group of its own and reads FD, a pipe whose only writer is the tune. When the
pipe closes, whether the tune stopped the server, exited, or was killed (SIGKILL included: the kernel closes
its end), the guard stops the whole group: SIGTERM, then SIGKILL after GRACE_S, so that the server's own
children (vLLM's engine-core process) go too. When the server exits by itself, the guard exits with its code,
so the tune sees a launch that died as a process that exited.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 5.0  # SIGTERM to SIGKILL: vLLM and chunkbench serve shut down in well under this


def stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the server's group, SIGKILL to whatever of it is left after GRACE_S."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):  # the leader may be gone and its children not
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def main(argv: list[str]) -> int:
    fd, command = int(argv[0]), argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tune decides when its servers stop
    try:
        server = subprocess.Popen(command, start_new_session=True)
    except OSError as exc:  # no such program, not executable: said in the launch log
        print(f"chunkbench: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop and server.poll() is None:
        readable, _, _ = select.select([fd], [], [], 0.2)
        if readable and not os.read(fd, 64):  # EOF: the tune closed its end or is gone
            break
    if server.poll() is None:
        stop_group(server)
        return 0
    with contextlib.suppress(ProcessLookupError):  # children the server left behind
        os.killpg(server.pid, signal.SIGKILL)
    return server.returncode if server.returncode >= 0 else 128 - server.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
