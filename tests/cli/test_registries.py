"""Every registry is a chunkbench/registry.py Registry: a toy entry registered from here is found by name (and by
what reads the registry), is gone again once removed, and a built-in name cannot be registered twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from chunkbench.engine import policies
from chunkbench.engine.config import check_policy

from chunkbench import servers
from chunkbench.commands.vllm_flags import dataset_workload
from chunkbench.errors import UserError
from chunkbench.registry import Registry
from chunkbench.servers.kind import ServerKind
from chunkbench.servers.vllm import VLLM
from chunkbench.sim import families
from chunkbench.tune import objectives
from chunkbench.workloads import named, vllm_datasets
from chunkbench.workloads.dataset_files import Drawn
from chunkbench.workloads.spec import WorkloadSpec, build_workload
from tests.sim.test_families import ConstantFamily


@contextmanager
def registered(register: Callable, unregister: Callable, name: str, entry) -> Iterator:
    """`entry` registered as `name` for the block, removed after it even when the block fails."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(name)


def test_a_registry_takes_a_name_once_and_lists_the_known_ones_for_an_unknown_one():
    shapes: Registry[int] = Registry("shape")
    shapes.register("square", 4)

    @shapes.register("triangle")
    def triangle() -> int:
        return 3

    assert shapes.get("square") == 4 and shapes["triangle"] is triangle
    assert "square" in shapes and "circle" not in shapes and list(shapes) == ["square", "triangle"]
    assert shapes.names() == ("square", "triangle") and len(shapes) == 2
    with pytest.raises(ValueError, match="shape 'square' is taken"):
        shapes.register("square", 5)
    with pytest.raises(ValueError, match="needs a name"):
        shapes.register("", 5)
    with pytest.raises(UserError, match="^unknown shape 'circle'; use square, triangle$"):
        shapes.get("circle")
    assert shapes.unregister("square") == 4 and shapes.unregister("square") is None
    assert shapes.items() == [("triangle", triangle)]


def test_an_unknown_names_message_is_the_registrys_own_one_line():
    def sizes(*names: str) -> Registry[int]:
        registry: Registry[int] = Registry("size", "--size must be {known_or}, got '{name}'")
        for value, name in enumerate(names):
            registry.register(name, value)
        return registry

    with pytest.raises(UserError, match="^--size must be s, m or l, got 'xl'$"):
        sizes("s", "m", "l").get("xl")
    with pytest.raises(UserError, match="^--size must be s, got 'xl'$"):
        sizes("s").get("xl")


class Toy(policies.Policy):
    name = "toy-registry-policy"
    help = "a test's policy"

    def schedule(self, scheduler, scheduled, preempted):
        pass


def test_policies():
    with registered(policies.register, policies.unregister, Toy.name, Toy):
        assert isinstance(policies.get(Toy.name), Toy) and Toy.name in policies.names()
        check_policy(Toy.name)  # the config's check (every --policy) reads the registry
        assert not policies.chunks_prompts(Toy.name)
    assert Toy.name not in policies.names()
    with pytest.raises(UserError, match=f"--policy must be one of static, continuous, orca, chunked, got '{Toy.name}'"):
        policies.get(Toy.name)
    with pytest.raises(ValueError, match="'chunked' is taken"):
        policies.register(type("Chunked", (Toy,), {"name": "chunked"}))
    assert type(policies.get("chunked")).__name__ == "Chunked"  # the built-in one stays


class Output(objectives.Objective):
    name = "toy-registry-objective"
    help = "toy-registry-objective (output tokens/s)"

    def values(self, summary: dict) -> list[float]:
        return [summary["output_throughput"]]


def test_objectives():
    with registered(objectives.register, objectives.unregister, Output.name, Output()) as toy:
        assert objectives.get(toy.name) is toy and objectives.resolve(toy.name, with_slas=False) is toy
        assert toy.help in objectives.help_text()  # --objective's help
    assert Output.name not in objectives.OBJECTIVES
    with pytest.raises(UserError, match=f"--objective must be one of goodput, capacity, pareto, got '{Output.name}'"):
        objectives.get(Output.name)
    with pytest.raises(ValueError, match="taken"):
        objectives.register(type("Goodput", (Output,), {"name": "goodput"})())


def test_cost_families():
    with registered(families.register, families.unregister, ConstantFamily.name, ConstantFamily()) as toy:
        assert families.get(toy.name) is toy and families.resolve(toy.name, "cpu") is toy
        assert families.fit_name(toy.name, "cpu") == toy.name  # a fit's --family
    assert ConstantFamily.name not in families.names()
    with pytest.raises(UserError, match="unknown family 'toy-constant'; use roofline, linear or linear-cpu"):
        families.get(ConstantFamily.name)
    with pytest.raises(ValueError, match="'roofline' is taken"):
        families.register(type("Roofline", (ConstantFamily,), {"name": "roofline"})())


def test_named_workloads():
    def draw(spec, n, rng):
        return Drawn(np.full(n, 7), np.full(n, 3))

    source = named.Source("seven-token prompts (a test's)", draw)
    with registered(
        lambda s: named.SOURCES.register("toy-workload", s), named.SOURCES.unregister, "toy-workload", source
    ):
        assert named.find("toy-workload") is source and not named.has_timestamps("toy-workload")
        requests = build_workload(WorkloadSpec(name="toy-workload", num_requests=5))  # --workload's lookup
        assert [(r.prompt_len, r.output_len) for r in requests] == [(7, 3)] * 5
    with pytest.raises(UserError, match="unknown workload 'toy-workload'; use one of chat, "):
        named.find("toy-workload")
    with pytest.raises(ValueError, match="workload 'chat' is taken"):
        named.SOURCES.register("chat", source)


def test_vllm_datasets():
    def load(spec, path, n, rng):
        return Drawn(np.full(n, 11), np.full(n, 2))

    dataset = vllm_datasets.Dataset(load, False, "eleven-token prompts (a test's)")
    with registered(
        lambda d: vllm_datasets.DATASETS.register("toy_dataset", d),
        vllm_datasets.DATASETS.unregister,
        "toy_dataset",
        dataset,
    ):
        assert vllm_datasets.parse("toy_dataset") == ("toy_dataset", None)
        assert dataset_workload("toy_dataset", None) == "toy_dataset"  # bench's --dataset-name
        requests = build_workload(WorkloadSpec(name="toy_dataset", num_requests=4))
        assert [(r.prompt_len, r.output_len) for r in requests] == [(11, 2)] * 4
    assert vllm_datasets.parse("toy_dataset") is None
    with pytest.raises(UserError, match="--dataset-name: chunkbench reads random, "):
        dataset_workload("toy_dataset", None)
    with pytest.raises(ValueError, match="vLLM dataset 'random' is taken"):
        vllm_datasets.DATASETS.register("random", dataset)


def test_server_kinds():
    toy = ServerKind(name="toy-kind", title="Toy", pattern=r"toy-server", versions=("1.0",), overhead_s=1e-3)
    with registered(servers.register, servers.unregister, toy.name, toy):
        assert servers.get(toy.name) is toy and toy in servers.kinds()
        assert servers.recognise("toy-server --port {port}") is toy  # --launch's kind
    assert toy not in servers.kinds() and servers.recognise("toy-server --port {port}") is None
    with pytest.raises(UserError, match="^unknown server kind 'toy-kind'; use vllm, sglang, chunkbench$"):
        servers.get(toy.name)
    with pytest.raises(ValueError, match="server kind 'vllm' is taken"):
        servers.register(ServerKind(name="vllm", title="Toy", pattern="x", versions=("1.0",), overhead_s=0.0))
    assert servers.get("vllm") is VLLM
