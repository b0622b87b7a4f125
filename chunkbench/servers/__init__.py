"""The server kinds chunkbench launches and writes configs for, by name: vllm, sglang, chunkbench
(chunkbench/servers/kind.py says what a kind owns). `register` adds one: a module with a ServerKind."""

from __future__ import annotations

from chunkbench.registry import Registry
from chunkbench.servers.chunkbench import CHUNKBENCH
from chunkbench.servers.kind import ServerKind
from chunkbench.servers.sglang import SGLANG
from chunkbench.servers.vllm import VLLM

_KINDS: Registry[ServerKind] = Registry("server kind")


def register(kind: ServerKind) -> ServerKind:
    """Make `kind` known by its name, once; returns it."""
    return _KINDS.register(kind.name, kind)


def unregister(name: str) -> None:
    _KINDS.unregister(name)


def kinds() -> list[ServerKind]:
    return _KINDS.values()


def get(name: str) -> ServerKind:
    return _KINDS.get(name)


def recognise(template: str) -> ServerKind | None:
    """The kind a --launch template starts, by its command or its flags placeholder; None: not one of ours
    (a server chunkbench only measures)."""
    return next((k for k in kinds() if k.recognises(template)), None)


for _kind in (VLLM, SGLANG, CHUNKBENCH):
    register(_kind)
