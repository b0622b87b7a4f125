"""Batching policies by name (base.py: the interface and registry). The four built in are registered on
import, in this order (the order `--help` and errors list them); a new one is a module with a Policy subclass
and a `register` call."""

# isort: off
from . import static, continuous, orca, chunked  # noqa: F401  (each registers itself)

# isort: on
from .base import REGISTRY, Policy, chunks_prompts, get, names, register, unregister

__all__ = ["REGISTRY", "Policy", "chunks_prompts", "get", "names", "register", "unregister"]
