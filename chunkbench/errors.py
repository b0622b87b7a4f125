"""Errors a user can cause. The CLI prints them as one line on stderr and exits with code 2."""

import math
import sys
import tomllib
import typing
from pathlib import Path


class ConfigError(ValueError):
    """A configuration a user asked for is invalid. The message names the flag."""


class UserError(ConfigError):
    """Bad input that is not an engine config: a file, a workload, an SLA string."""


class StudyFailed(Exception):
    """A tuning run that cannot go on (its launched servers never come up): one line on stderr, exit code 1;
    its finished trials stay in the study, so it resumes once the cause is fixed."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (`signum`): the command stops, and what it started is stopped on the way out."""

    def __init__(self, signum: int = 2) -> None:
        super().__init__(signum)
        self.signum = signum


def read_toml(path: Path, flag: str) -> dict:
    """A TOML file the user named with `flag`; an unreadable or invalid one is a UserError."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag}: {path} is not text (UTF-8 TOML)") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{flag}: {path} is not valid TOML: {exc}") from None
    except ValueError:  # a name no file system accepts, e.g. with a NUL byte
        raise UserError(f"{flag}: {str(path)!r} is not a file name") from None


def check_number(
    flag: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
):
    """`value` if it is a finite number in range (an integer where `integer`), else a UserError naming the
    flag. NaN fails every comparison, so `value <= 0` alone lets it through: this is the one check to use."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{flag} must be a finite number, got {value!r}")
    if integer and value != int(value):
        raise UserError(f"{flag} must be a whole number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise UserError(f"{flag} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
    if high is not None and value > high:
        raise UserError(f"{flag} must be <= {high:g}, got {value!r}")
    return value


_warned: set[str] = set()


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: typing.TextIO | None = None,
    line: str | None = None,
) -> None:
    """warnings.showwarning for the CLI (and its worker processes): one line in the tool's voice, each message
    once per process (Python's default names the module's file and repeats its source line, which means
    nothing to a user)."""
    text = " ".join(str(message).split())
    if text in _warned:
        return
    _warned.add(text)
    print("chunkbench: warning: " + text, file=file or sys.stderr)
