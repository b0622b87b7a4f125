"""Errors a user can cause. The CLI prints them as one line on stderr and exits with code 2."""

from chunkbench.engine.config import ConfigError


class UserError(ConfigError):
    """Bad input that is not an engine config: a file, a workload, an SLA string."""
