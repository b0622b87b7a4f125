"""Which release a --launch template starts: its server kind (chunkbench/servers/) and, for vLLM, the version its
own CLI reports (`vllm --version`), so the search and the emitted configs target what will run."""

from __future__ import annotations

import re
import shlex
import subprocess

from chunkbench import servers
from chunkbench.errors import UserError
from chunkbench.servers.kind import ServerKind

VERSION_TIMEOUT_S = 120.0  # `vllm --version` imports vLLM: seconds on a GPU node, tens on a loaded CPU


def vllm_program(template: str) -> str | None:
    """The `vllm` executable a template runs `serve` with (any path), None where it starts vLLM otherwise."""
    try:
        words = shlex.split(template)
    except ValueError:
        return None
    for word, after in zip(words, words[1:]):
        if re.fullmatch(r"(.*/)?vllm", word) and after == "serve":
            return word
    return None


def cli_version(program: str) -> str | None:
    """What `<program> --version` prints as a release (e.g. 0.34.0), None when it cannot tell."""
    try:
        done = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.findall(r"\b\d+\.\d+\.\d+", done.stdout) if done.returncode == 0 else []
    return found[-1] if found else None


def launched_target(template: str, asked: str | None) -> tuple[ServerKind | None, str, str]:
    """(kind, the release to target, how it was chosen) for a --launch template; `asked`: --vllm-version."""
    kind = servers.recognise(template)
    if kind is None:
        return None, "", "not a server kind chunkbench knows: every knob is searched"
    if kind.name != "vllm":
        return kind, kind.newest, "its newest"
    if asked:
        return kind, kind.target(asked), "as --vllm-version asks"
    program = vllm_program(template)
    found = cli_version(program) if program else None
    if found is None:
        return kind, kind.newest, "its newest (the launched vLLM's version could not be read)"
    try:
        return kind, kind.target(found), f"`{program} --version` says {found}"
    except UserError:
        return kind, kind.newest, f"`{program} --version` says {found}, a release chunkbench does not know: its newest"
