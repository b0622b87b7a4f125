"""The policy interface and its registry: a policy decides which tokens each step computes, over the
scheduler's queues (`waiting`, `running`) and block helpers (engine/scheduler.py). Adding one is a module
with a Policy subclass and one `register` call; the CLI, the config checks, the tuner's search space and the vLLM and
SGLang emitters read what it declares here."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from chunkbench.registry import Registry

if TYPE_CHECKING:  # annotations only
    from ..request import Request
    from ..scheduler import Scheduler


class Policy:
    name: ClassVar[str]
    help: ClassVar[str]
    # A step may compute part of a prompt: the chunk knobs (engine/knobs.py's chunked_only) apply, any token
    # budget >= 1 works, and vLLM and SGLang run it with chunked prefill on.
    chunks_prompts: ClassVar[bool] = False
    # New requests may join while others run (static's batch must drain first).
    admits_while_running: ClassVar[bool] = True
    # vLLM and SGLang have this policy (chunked prefill on or off); else the closest is chunked prefill off.
    in_vllm: ClassVar[bool] = True

    def schedule(self, scheduler: Scheduler, scheduled: dict[Request, int], preempted: list[Request]) -> None:
        """Fill `scheduled` (request -> tokens to compute this step, in step order) and `preempted`."""
        raise NotImplementedError

    def min_budget(self, max_model_len: int) -> int:
        """The smallest token budget it can run with: a policy that never splits a prompt needs a whole
        max-length prompt in one step (vLLM enforces the same without chunked prefill)."""
        return 1 if self.chunks_prompts else max_model_len


# By name (chunkbench/registry.py); an unknown name gets the message config.check_policy gives.
REGISTRY: Registry[Policy] = Registry("policy", "--policy must be one of {known}, got '{name}'")


def register(policy: type[Policy]) -> type[Policy]:
    """Make a policy known by its name, once (a class decorator, or a call)."""
    REGISTRY.register(policy.name, policy())
    return policy


def unregister(name: str) -> None:
    """Forget a policy (a test's toy)."""
    REGISTRY.unregister(name)


def get(name: str) -> Policy:
    return REGISTRY.get(name)


def names() -> tuple[str, ...]:
    return REGISTRY.names()


def chunks_prompts(name: str) -> bool:
    """Whether the policy of this name splits prompts (False for a name not registered: the config's check
    names it)."""
    return name in REGISTRY and REGISTRY.get(name).chunks_prompts
