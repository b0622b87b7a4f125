"""Errors a user can cause. The CLI prints them as one line on stderr and exits with code 2."""

import tomllib
from pathlib import Path

from chunkbench.engine.config import ConfigError


class UserError(ConfigError):
    """Bad input that is not an engine config: a file, a workload, an SLA string."""


def read_toml(path: Path, flag: str) -> dict:
    """A TOML file the user named with `flag`; an unreadable or invalid one is a UserError."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{flag}: {path} is not valid TOML: {exc}") from None
