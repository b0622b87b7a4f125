"""A server kind: what chunkbench knows of one server it launches and writes configs for.

A kind owns how a `--launch` template names it, the placeholder its whole flag list fills ({vllm_flags}), which
knobs it can express at each of its releases (a knob it cannot express is left out of a search that launches
it, said in the report), the files a recommendation writes for it, and its engine's per-step overhead in the
simulator (`--engine-overhead`). Adding a kind is one module with a ServerKind and one `register` call
(chunkbench/servers/__init__.py). Plain data over EngineConfig: no torch, no HTTP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chunkbench.engine import policies
from chunkbench.engine.config import EngineConfig, SchedulerConfig
from chunkbench.engine.knobs import KNOBS, Knob, release
from chunkbench.errors import UserError

HF_IDS = {  # presets -> the Hugging Face repositories whose shapes they copy
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
}
DEPLOYMENT = {  # what a server config always carries when it holds: the deployment, not a choice of the search
    "max_model_len": lambda v: True,
    "tensor_parallel_size": lambda v: v > 1,
    "kv_cache_dtype": lambda v: v != "auto",
}


def first_chunk_cap(s: SchedulerConfig) -> int | None:
    """The per-request prefill cap a server with a single chunk size should use: the chunk cap, else the
    first entry of the progressive schedule."""
    return s.chunk_size or (s.chunk_schedule[0] if s.chunk_schedule else None)


def model_id(config: EngineConfig) -> str:
    return HF_IDS.get(config.model.name, config.model.hf_dir or config.model.name)


def comment(lines: list[str]) -> str:
    """Lines as '# ' comments; a newline inside a line starts another comment line, never a setting."""
    return "".join(f"# {part}\n" for line in lines for part in str(line).splitlines() or [""])


def server_knobs(config: EngineConfig):
    """(knob, value) for what a server config sets: the chosen knobs and what the deployment needs."""
    for knob in KNOBS.values():
        value = knob.read(config)
        if knob.name in DEPLOYMENT:
            if DEPLOYMENT[knob.name](value):
                yield knob, value
        elif value is not None and knob.name in config.chosen and not (knob.default_is_off and value == knob.default):
            yield knob, value  # a rule chosen off is left at the server's own default: off


def is_set(knob: Knob, value) -> bool:
    """Whether a chosen value asks the server for anything: an empty schedule, a 0 cap or False does not."""
    return value not in (None, (), False, 0) and value != knob.default


@dataclass(frozen=True)
class ServerKind:
    name: str  # registry key, `--engine-overhead` name, and the placeholder {<name>_flags}
    title: str  # for people: "vLLM"
    pattern: str  # a regular expression that finds this server's command in a --launch template
    versions: tuple[str, ...]  # the releases its configs can target, oldest first; the last is the default
    overhead_s: float  # its engine's per-step overhead in the simulator (chunkbench/sim/engine_overhead.py)
    outputs: tuple[str, ...] = ()  # the file names `files` writes; default: <name>.txt

    @property
    def placeholder(self) -> str:
        return f"{self.name}_flags"

    @property
    def newest(self) -> str:
        return self.versions[-1]

    def recognises(self, template: str) -> bool:
        return bool(re.search(self.pattern, template)) or "{" + self.placeholder + "}" in template

    def target(self, version: str | None) -> str:
        """The release to target: `version` where this kind knows it (any patch level), else the newest."""
        if not version:
            return self.newest
        known = {release(v)[:2]: v for v in self.versions}
        if release(version)[:2] not in known:
            raise UserError(f"{self.title} {version}: chunkbench targets {self.title} {', '.join(self.versions)}")
        return known[release(version)[:2]]

    def label(self, version: str = "") -> str:
        return f"{self.title} {version or self.newest}"

    def expresses(self, knob: Knob, version: str = "") -> bool:
        """Whether this kind's `version` has an option for `knob`."""
        raise NotImplementedError

    def runs_policy(self, policy: str) -> bool:
        """Whether this kind can run `policy` (engine/policies/)."""
        return policies.get(policy).in_vllm

    def option_flags(self, config: EngineConfig, version: str = "") -> str:
        """The config as this server's command-line flags, unset knobs left out: what {<name>_flags} holds."""
        raise NotImplementedError

    def command(self, config: EngineConfig, version: str = "") -> str:
        """The whole command that serves the config, as a report prints it."""
        raise NotImplementedError

    def files(self, config: EngineConfig, header: list[str], version: str = "") -> dict[str, str]:
        """What a recommendation writes for this kind: file name -> text."""
        return {(self.outputs or (f"{self.name}.txt",))[0]: self.command(config, version) + "\n"}

    def not_expressed(self, config: EngineConfig, version: str = "") -> list[str]:
        """Chosen knobs this kind's `version` has no option for, as 'name value' texts."""
        return [
            f"{k.name} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
            for k, v in server_knobs(config)
            if k.name != "policy" and is_set(k, v) and not self.expresses(k, version)
        ]
