"""Built-in search spaces (default, latency, throughput, prefix, dynamic) and the CI gate suite (ci), as TOML data
shipped in the package (pyproject.toml maps this folder to chunkbench.sweeps)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BUILTIN = str(resources.files(__name__))  # where the built-in files lie: a space from there is not the user's


def resolve(name: str | Path) -> Path:
    """A TOML file the user named, or else the built-in one of that name (`default`, `ci`)."""
    path = Path(name)
    builtin = resources.files(__name__) / f"{path.name.removesuffix('.toml')}.toml"
    return path if path.exists() or not builtin.is_file() else Path(str(builtin))
