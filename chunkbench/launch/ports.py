"""Who holds a TCP port, read from Linux's /proc: a launched server's figures count only when the port it is
measured on is held by that server (or one of its children), never by a stale server from before."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

LISTEN = "0A"  # the TCP state column of /proc/net/tcp


def port_busy(host: str, port: int) -> bool:
    """Whether something listens on host:port or holds it bound: a connection is accepted, or (for this
    machine) the port cannot be bound. SO_REUSEADDR: closed connections left in TIME_WAIT do not count."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno == 98:  # EADDRINUSE; other errors (no IPv6 here) say nothing about the port
                    return True
    return False


def _listening_inodes(port: int) -> set[str] | None:
    inodes, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if readable else None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []


def port_holders(port: int) -> set[int] | None:
    """The processes with a socket listening on `port` that this user may see; None where /proc is not there."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                        holders.add(pid)
                        break
    return holders


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for other in _pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{other}/stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
            children.setdefault(parent, []).append(other)
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        tree.add(current)
        todo += children.get(current, [])
    return tree


def describe(pid: int) -> str:
    """'pid 123 (vllm serve ...)' with the command line cut to 120 characters."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    return f"pid {pid}" + (f" ({command[:120]})" if command else "")


def holder_text(port: int) -> str:
    """', held by pid 123 (...)' when the holder can be seen, else ''."""
    holders = port_holders(port) or set()
    return f", held by {', '.join(describe(p) for p in sorted(holders))}" if holders else ""
