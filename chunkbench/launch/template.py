"""A --launch template and its --endpoint, checked for every slot before anything is launched or written: braces
that pair, placeholders that exist, a command line that parses, an http(s) URL with a port. Each refusal is one
line naming the option and the fix."""

from __future__ import annotations

import shlex
import string
from urllib.parse import urlsplit

from chunkbench.engine.config import EngineConfig
from chunkbench.errors import UserError
from chunkbench.launch.node import Slot, fill_endpoint

SLOT_PLACEHOLDERS = tuple(Slot().values())  # what an endpoint may hold: {port}, {slot}, {gpus}, {cpus}


def placeholders(flag: str, text: str) -> list[str]:
    """The names of `text`'s {placeholders}; a brace without its pair, a {} or a {name!r:>5} is refused."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:
        what = "a '{' without its '}'" if "'{'" in str(exc) or "end of string" in str(exc) else "a '}' without its '{'"
        raise UserError(f"{flag}: '{text}' has {what}; write a literal brace twice ({{{{ or }}}})") from None
    names = []
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            shown = "{" + name + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise UserError(f"{flag}: '{shown}' is not a placeholder; placeholders are names, e.g. {{port}}")
        names.append(name)
    return names


def check_endpoint(endpoint: str, node: list[Slot]) -> None:
    """The endpoint holds only slot placeholders and fills, for every slot, to an http(s) URL with a host and a
    port that exists, written out (a launched server is on a port the tune or its template chose), and the slot's
    own port where it holds {port} (else every slot would measure one server, or none)."""
    unknown = [n for n in placeholders("--endpoint", endpoint) if n not in SLOT_PLACEHOLDERS]
    if unknown:
        raise UserError(
            f"--endpoint: unknown placeholder {{{unknown[0]}}}; an endpoint may hold "
            + ", ".join("{" + n + "}" for n in SLOT_PLACEHOLDERS)
        )
    for slot in node:
        url = fill_endpoint(endpoint, slot)
        parts = urlsplit(url)
        try:
            port = parts.port  # None where none is written
        except ValueError:  # past 65535, or not a number
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--endpoint: '{url}' is not an http(s) URL; e.g. http://127.0.0.1:{{port}}/v1")
        if not port:  # none written, out of range, or 0
            raise UserError(f"--endpoint: '{url}' has no valid port (1-65535); e.g. http://127.0.0.1:{{port}}/v1")
        if "{port}" in endpoint and port != slot.port:
            raise UserError(
                f"--endpoint: '{url}' is not on slot {slot.index}'s port {slot.port}: put {{port}} where the port "
                "goes, e.g. http://127.0.0.1:{port}/v1"
            )


def check_launch(template: str, config: EngineConfig, node: list[Slot], values: dict) -> None:
    """The template's placeholders all exist (`values`: the config's and a slot's) and, filled for every slot,
    it parses as a command line."""
    unknown = [n for n in placeholders("--launch", template) if n not in values]
    if unknown:
        raise UserError(
            f"--launch: unknown placeholder {{{unknown[0]}}}; use {', '.join('{' + k + '}' for k in sorted(values))}"
        )
    for slot in node:
        command = template.format(**(values | slot.values()))
        try:
            words = shlex.split(command)
        except ValueError as exc:  # shlex says "No closing quotation" or "No escaped character"
            raise UserError(
                f"--launch: '{command}' is not a command line ({str(exc).lower()}); check its quotes"
            ) from None
        if not words:
            raise UserError("--launch: the command is empty; e.g. vllm serve {model} {vllm_flags} --port {port}")
