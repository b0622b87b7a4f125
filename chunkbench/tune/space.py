"""Search spaces for the tuner, read from TOML (the built-in ones ship as package data from sweeps/): the
knobs and the values each may take. Which knobs may appear is declared in engine/knobs.py."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from chunkbench import sweeps
from chunkbench.engine import policies as engine_policies
from chunkbench.engine.config import MAX_BUDGET, MAX_SEQS, min_budget
from chunkbench.engine.knobs import CHUNKED_ONLY
from chunkbench.engine.knobs import KNOBS as ENGINE_KNOBS
from chunkbench.engine.knobs import SEARCHABLE as KNOBS
from chunkbench.errors import UserError, read_toml
from chunkbench.workloads.spec import WorkloadSpec

SCHEDULE_FAMILIES = ("fixed", "decreasing", "linear")
WORKLOAD_KEYS = tuple(f.name for f in dataclasses.fields(WorkloadSpec))
WORKLOAD_TEXT = ("name", "arrival", "prompt_len", "output_len", "tokenizer")  # the [workload] keys given as strings


def chunk_schedule(family: str, budget: int) -> tuple[int, ...]:
    """A progressive schedule derived from the budget B: fixed (), decreasing (B, B/2, B/4),
    linear (B, 3B/4, B/2, B/4); entries rounded down to multiples of 16, at least 16."""
    fractions = {"fixed": (), "decreasing": (1, 1 / 2, 1 / 4), "linear": (1, 3 / 4, 1 / 2, 1 / 4)}[family]
    return tuple(max(16, int(budget * f) // 16 * 16) for f in fractions)


@dataclass(frozen=True)
class SearchSpace:
    values: dict[str, list]
    workload: dict = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> SearchSpace:
        """A TOML file, or the name of a built-in space (default, latency, throughput)."""
        path = sweeps.resolve(path)
        data = read_toml(path, "--space")
        space = cls(values=data.get("space", {}), workload=data.get("workload", {}), source=str(path))
        space.validate()
        return space

    def validate(self) -> None:
        where = f"--space {self.source}" if self.source else "--space"
        if not self.values:
            raise UserError(f"{where}: the [space] table is empty; list values for {', '.join(KNOBS)}")
        unknown = set(self.values) - set(KNOBS)
        if unknown:
            raise UserError(f"{where}: unknown knob(s) {', '.join(sorted(unknown))}; use {', '.join(KNOBS)}")
        for key in set(self.workload) - set(WORKLOAD_KEYS):
            raise UserError(f"{where}: unknown [workload] key '{key}'; use {', '.join(WORKLOAD_KEYS)}")
        for key, value in self.workload.items():  # numbers are checked with the workload (WorkloadSpec.validate)
            if key in WORKLOAD_TEXT and not isinstance(value, str):
                raise UserError(f"{where}: [workload] '{key}' must be a string, got {value!r}")
            if key == "shuffle" and not isinstance(value, bool):
                raise UserError(f"{where}: [workload] 'shuffle' must be true or false, got {value!r}")
        for key, values in self.values.items():
            if not isinstance(values, list) or not values:
                raise UserError(f"{where}: '{key}' must be a non-empty list of values")
            if len(set(map(str, values))) != len(values):
                raise UserError(f"{where}: '{key}' lists a value twice")
        for policy in self.values.get("policy", ["chunked"]):
            if policy not in engine_policies.REGISTRY:
                raise UserError(f"{where}: unknown policy '{policy}'; use {', '.join(engine_policies.names())}")
        if any(not isinstance(v, bool) for v in self.values.get("enable_prefix_caching", [])):
            raise UserError(f"{where}: 'enable_prefix_caching' values must be true or false")
        for family in self.values.get("chunk_schedule", ["fixed"]):
            if family not in SCHEDULE_FAMILIES:
                raise UserError(
                    f"{where}: unknown chunk_schedule family '{family}'; use {', '.join(SCHEDULE_FAMILIES)}"
                )
        for key in (k for k in KNOBS if ENGINE_KNOBS[k].type is int):
            required = 0 if key in CHUNKED_ONLY and not ENGINE_KNOBS[key].default else 1  # the caps: 0 = no cap
            for v in self.values.get(key, []):
                if not isinstance(v, int) or isinstance(v, bool) or v < required:
                    raise UserError(
                        f"{where}: '{key}' values must be whole numbers "
                        f"{'>= 1' if required else '>= 0 (0 = off)'}, got {v!r}"
                    )
        for key in (k for k in KNOBS if ENGINE_KNOBS[k].type is float):  # 0 = off (a time target: tokens only)
            for v in self.values.get(key, []):
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
                    raise UserError(f"{where}: '{key}' values must be numbers >= 0 (0 = off), got {v!r}")
        for key, most in (("max_num_batched_tokens", MAX_BUDGET), ("max_num_seqs", MAX_SEQS)):
            for v in self.values.get(key, []):
                if v > most:
                    raise UserError(f"{where}: '{key}' values must be at most {most:,}, got {v:,}")
        budgets = self.values.get("max_num_batched_tokens", [2048])
        tiles = [t for t in self.values.get("tile", [0]) if t]
        if tiles and min(tiles) > max(budgets):
            raise UserError(f"{where}: contradictory: every tile ({min(tiles)}+) exceeds every budget ({max(budgets)})")

    def for_server(self, kind, version: str = "", launched: bool = True) -> tuple[SearchSpace, str | None]:
        """The space a server `kind` (chunkbench/servers/) at `version` can search, and a note on what was left
        out. Launched, it searches only the knobs and policies it has an option for (vLLM has none for
        progressive schedules, tile, partial prefills, a step-time target or a chunk count, nor the static and
        orca policies); simulated, the simulator runs every knob but those `version` has not got yet (a vLLM
        knob newer than the targeted release). A built-in space leaves them out, with the note; the user's own
        space file naming them is refused in one line, before any launch."""
        version = kind.target(version)

        def lacks(key: str) -> bool:
            knob, values = ENGINE_KNOBS[key], self.values[key]
            if key == "policy" or (len(values) == 1 and values[0] in ("fixed", 0, knob.default)):
                return False  # a single 'off' value changes nothing
            return not kind.expresses(knob, version) if launched else bool(knob.vllm and not knob.in_vllm(version))

        only = [k for k in self.values if lacks(k)]
        policies = [p for p in self.values.get("policy", []) if launched and not kind.runs_policy(p)]
        if not only and not policies:
            return self, None
        what = ", ".join(only + [f"policy {p}" for p in policies])
        if not self.source.startswith(sweeps.BUILTIN):
            raise UserError(
                f"--space {self.source}: {kind.label(version)} has no option for {what}; leave it out of the "
                f"space to tune {'a launched' if launched else 'for'} {kind.label(version)}"
            )
        values = {k: v for k, v in self.values.items() if k not in only}
        if policies:
            values["policy"] = [p for p in values["policy"] if p not in policies] or ["chunked"]
        return dataclasses.replace(
            self, values=values
        ), f"{kind.label(version)} has no option for {what}: left out of the search"

    def params(self, suggest) -> dict:
        """A point of the space: `suggest(name, choices)` picks each knob (an Optuna trial's
        suggest_categorical, or an enumerator). Chunk knobs are only asked for the chunked policy."""
        point = {"policy": suggest("policy", self.values.get("policy", ["chunked"]))}
        point["max_num_batched_tokens"] = suggest(
            "max_num_batched_tokens", self.values.get("max_num_batched_tokens", [2048])
        )
        point["max_num_seqs"] = suggest("max_num_seqs", self.values.get("max_num_seqs", [256]))
        if "enable_prefix_caching" in self.values:
            point["enable_prefix_caching"] = suggest("enable_prefix_caching", self.values["enable_prefix_caching"])
        if engine_policies.chunks_prompts(point["policy"]):
            for key in CHUNKED_ONLY:  # cache-aware admission reorders by prefix-cache hits: only with the cache on
                if key in self.values and (key != "cache_aware_admission_window" or point.get("enable_prefix_caching")):
                    point[key] = suggest(key, self.values[key])
        return point

    def points(self) -> list[dict]:
        """Every point of the space (for exhaustive search and tests)."""
        names = [k for k in KNOBS if k in self.values] or ["policy"]
        found = {}
        for combo in itertools.product(*(self.values.get(k, ["chunked"]) for k in names)):
            chosen = dict(zip(names, combo))
            point = self.params(lambda name, choices: chosen.get(name, choices[0]))
            found[tuple(sorted(point.items()))] = point
        return list(found.values())


def engine_kwargs(point: dict, max_model_len: int) -> dict:
    """Engine keyword arguments for a point. Policies that never split a prompt get a budget of at least
    max_model_len, as vLLM enforces without chunked prefill."""
    budget = point["max_num_batched_tokens"]
    kwargs = {"policy": point["policy"], "max_num_seqs": point["max_num_seqs"]}
    if "enable_prefix_caching" in point:
        kwargs["enable_prefix_caching"] = point["enable_prefix_caching"]
    if not engine_policies.chunks_prompts(point["policy"]):
        kwargs["max_num_batched_tokens"] = max(budget, min_budget(point["policy"], max_model_len))
        return kwargs
    tile = point.get("tile") or None
    kwargs.update(
        max_num_batched_tokens=budget,
        chunk_size=point.get("chunk_size") or None,
        chunk_schedule=chunk_schedule(point.get("chunk_schedule", "fixed"), budget),
        tile=tile if tile and tile <= budget else None,
        max_partial_prefills=point.get("max_partial_prefills") or None,
        step_time_target_ms=point.get("step_time_target_ms") or None,
        num_chunks=point.get("num_chunks") or None,
    )
    for key in ("prefill_schedule_interval", "cache_aware_admission_window"):  # vLLM's own: off is their default
        if key in point:
            kwargs[key] = point[key]
    return kwargs
