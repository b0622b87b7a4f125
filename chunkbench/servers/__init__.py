"""The server kinds chunkbench launches and writes configs for, by name: vllm, sglang, chunkbench
(chunkbench/servers/kind.py says what a kind owns). `register` adds one: a module with a ServerKind."""

from __future__ import annotations

from chunkbench.errors import UserError
from chunkbench.servers.chunkbench import CHUNKBENCH
from chunkbench.servers.kind import ServerKind
from chunkbench.servers.sglang import SGLANG
from chunkbench.servers.vllm import VLLM

_KINDS: dict[str, ServerKind] = {}


def register(kind: ServerKind) -> ServerKind:
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)


def kinds() -> list[ServerKind]:
    return list(_KINDS.values())


def get(name: str) -> ServerKind:
    if name not in _KINDS:
        raise UserError(f"unknown server kind '{name}'; use {', '.join(_KINDS)}")
    return _KINDS[name]


def recognise(template: str) -> ServerKind | None:
    """The kind a --launch template starts, by its command or its flags placeholder; None: not one of ours
    (a server chunkbench only measures)."""
    return next((k for k in _KINDS.values() if k.recognises(template)), None)


for _kind in (VLLM, SGLANG, CHUNKBENCH):
    register(_kind)
