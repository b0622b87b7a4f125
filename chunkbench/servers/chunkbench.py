"""chunkbench's own server: `chunkbench serve` with the recommendation's flags, and recommended.toml (the
config `chunkbench run --config` and `serve --config` read). It expresses every knob."""

from __future__ import annotations

import tomli_w

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import KNOBS, Knob
from chunkbench.servers.kind import ServerKind, comment
from chunkbench.version import __version__

TUNED = [
    k
    for k in KNOBS.values()  # what a recommendation sets: the searched knobs and the deployment
    if k.searchable or k.name in ("max_model_len", "tensor_parallel_size", "kv_cache_dtype")
]


class ChunkbenchKind(ServerKind):
    def expresses(self, knob: Knob, version: str = "") -> bool:
        return True

    def runs_policy(self, policy: str) -> bool:
        return True

    def option_flags(self, config: EngineConfig, version: str = "") -> str:
        """Only the knobs set and not at their default, so a knob left unset is left out (never a 0 the command
        would refuse)."""
        flags = []
        for knob in TUNED:
            value = knob.read(config)
            if value in (None, (), False) or value == knob.default:
                continue
            flag = knob.cli_flags[0].split("/")[0]
            text = ",".join(map(str, value)) if isinstance(value, tuple) else value
            flags.append(flag if value is True else f"{flag} {text}")
        return " ".join(flags)

    def command(self, config: EngineConfig, version: str = "") -> str:
        return f"chunkbench serve --model {config.model.name} {self.option_flags(config)}".rstrip()

    def files(self, config: EngineConfig, header: list[str], version: str = "") -> dict[str, str]:
        engine = {"model": config.model.name}
        for knob in TUNED:
            value = knob.read(config)
            if value not in (None, ()):
                engine[knob.name] = list(value) if isinstance(value, tuple) else value
        return {"recommended.toml": comment(header) + tomli_w.dumps({"engine": engine})}


CHUNKBENCH = ChunkbenchKind(
    name="chunkbench",
    title="chunkbench",
    pattern=r"(^|[\s/])chunkbench\s+serve\b|chunkbench\.cli\s+serve\b",
    outputs=("recommended.toml",),
    versions=(__version__,),
    overhead_s=3.0e-3,  # this repository's engine: a Python scheduler and eager PyTorch launches
)
