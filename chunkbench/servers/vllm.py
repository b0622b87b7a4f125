"""vLLM: `vllm serve` with options of the targeted release (0.32, 0.33 or 0.34; the newest by default).

Option names are vLLM's (`vllm serve --config`, EngineArgs / SchedulerConfig), as engine/knobs.py
declares them with the release that brought each one. A config sets only what was chosen and what the
deployment needs (chunkbench/servers/kind.py); a chosen knob the release has no option for is named in a
comment, never silently dropped. The YAML is written by PyYAML, so no value can inject a line.
"""

from __future__ import annotations

import yaml

from chunkbench.engine import policies
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.knobs import VLLM_VERSIONS, Knob, release
from chunkbench.servers.kind import ServerKind, comment, first_chunk_cap, is_set, model_id, server_knobs

# vLLM 0.33 pairs every --enable-X with --disable-X (the --no-X forms still parse); 0.32 has --no-X only.
PAIRED_FLAGS = (0, 33)


class VllmKind(ServerKind):
    def expresses(self, knob: Knob, version: str = "") -> bool:
        return knob.in_vllm(version or self.newest)

    def options(self, config: EngineConfig, version: str = "") -> tuple[dict, list[str]]:
        """vLLM options (dashed names, as `vllm serve --config` reads them) and notes on what has no form in
        this release."""
        version = version or self.newest
        s, notes = config.scheduler, []
        policy = policies.get(s.policy)
        options = {"enable-chunked-prefill": policy.chunks_prompts} if "policy" in config.chosen else {}
        options |= {
            k.vllm: value for k, value in server_knobs(config) if self.expresses(k, version) and k.name != "chunk_size"
        }
        if first_chunk_cap(s):
            options["long-prefill-token-threshold"] = first_chunk_cap(s)  # vLLM v1's per-step cap on a long prompt
        if s.chunk_schedule:
            notes.append(
                f"chunk_schedule {','.join(map(str, s.chunk_schedule))} is chunkbench-only (no vLLM "
                f"{version} option); long-prefill-token-threshold carries its first entry"
            )
        for k, value in server_knobs(config):
            if (
                self.expresses(k, version)
                or k.name in ("policy", "chunk_size", "chunk_schedule")
                or not is_set(k, value)
            ):
                continue
            if k.vllm:
                notes.append(f"{k.name} {value}: vLLM {version} has no {k.vllm} (it came in vLLM {k.vllm_since})")
            else:
                was = f"; earlier vLLM releases had {k.vllm_before}" if k.vllm_before else ""
                notes.append(f"{k.name} {value} is chunkbench-only (no vLLM {version} option){was}")
        if not policy.in_vllm:
            notes.append(f"policy '{s.policy}' has no vLLM equivalent; the closest is chunked prefill off")
        return options, notes

    def option_flags(self, config: EngineConfig, version: str = "") -> str:
        """e.g. '--enable-chunked-prefill --max-num-batched-tokens 512'."""
        paired = release(version or self.newest)[:2] >= PAIRED_FLAGS
        options, _ = self.options(config, version)

        def off(key: str) -> str:
            return f"--disable-{key.removeprefix('enable-')}" if paired and key.startswith("enable-") else f"--no-{key}"

        return " ".join(
            (f"--{key}" if value else off(key)) if isinstance(value, bool) else f"--{key} {value}"
            for key, value in options.items()
        )

    def command(self, config: EngineConfig, version: str = "") -> str:
        return f"vllm serve {model_id(config)} {self.option_flags(config, version)}".rstrip()

    def yaml(self, config: EngineConfig, header: list[str], version: str = "") -> str:
        version = version or self.newest
        options, notes = self.options(config, version)
        return comment(header + [f"for vLLM {version}: vllm serve --config vllm.yaml"] + notes) + yaml.safe_dump(
            {"model": model_id(config), **options}, sort_keys=False
        )

    def files(self, config: EngineConfig, header: list[str], version: str = "") -> dict[str, str]:
        return {"vllm.yaml": self.yaml(config, header, version), "vllm_flags.txt": self.command(config, version) + "\n"}


VLLM = VllmKind(
    name="vllm",
    title="vLLM",
    pattern=r"(^|[\s/])vllm\s+serve\b|vllm\.entrypoints",
    outputs=("vllm.yaml", "vllm_flags.txt"),
    versions=VLLM_VERSIONS,
    # vLLM's V1 blog puts Llama-8B's GPU time per step on an H100 at ~5 ms and names the CPU work around it
    # (scheduling, input preparation, detokenizing) as the remaining bottleneck; measured 1-request decode
    # steps leave 1.2-2.2 ms of overhead (docs/guides/simulator.md): the middle.
    overhead_s=1.5e-3,
)
