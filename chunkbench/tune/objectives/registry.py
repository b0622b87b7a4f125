"""The objectives `chunkbench tune --objective` knows, registered once by name: the CLI's choices, its help and
its `auto` read them here, and the tuner looks a spec's or a stored study's objective up by its name."""

from __future__ import annotations

from chunkbench.errors import UserError
from chunkbench.registry import Registry
from chunkbench.tune.objectives.base import Objective

# By name, in the order registered (the order --help and errors list).
OBJECTIVES: Registry[Objective] = Registry("objective", "--objective must be one of {known}, got '{name}'")
AUTO = "auto"  # --objective auto: by whether an SLA is given (Objective.auto_with_slas)


def register(objective: Objective) -> Objective:
    """Add an objective under its name; a name is registered once, and `auto` is reserved."""
    if not objective.name or objective.name == AUTO:
        raise ValueError(f"cannot register an objective named {objective.name!r}: empty or reserved")
    return OBJECTIVES.register(objective.name, objective)


def unregister(name: str) -> None:
    """Forget an objective (a test's toy)."""
    OBJECTIVES.unregister(name)


def get(name: str) -> Objective:
    """The objective registered as `name` (a spec's, a stored study's); UserError for any other."""
    return OBJECTIVES.get(name)


def auto(with_slas: bool) -> Objective:
    """What --objective auto means with SLAs given, or without."""
    return next(o for o in OBJECTIVES.values() if o.auto_with_slas is with_slas)


def resolve(name: str, with_slas: bool) -> Objective:
    """--objective as given: auto or a registered name, refused where it needs an SLA and none was given."""
    objective = auto(with_slas) if name == AUTO else get(name)
    if objective.needs_slos and not with_slas:
        raise UserError(f"--objective {objective.name} needs at least one --sla-* target")
    return objective


def help_text() -> str:
    """--objective's help: each objective's entry, auto's defaults first, then what auto means."""
    order = sorted(OBJECTIVES.values(), key=lambda o: {True: 0, False: 1}.get(o.auto_with_slas, 2))
    entries = [o.help for o in order]
    listed = ", ".join(entries[:-1]) + " or " + entries[-1] if len(entries) > 1 else entries[0]
    return f"{listed}. {AUTO}: {auto(True).name} when an --sla-* is given, else {auto(False).name}."


def one_winner_names() -> str:
    """The objectives with one winner to pick, as --objective choices in words ("goodput or capacity")."""
    return " or ".join(name for name, o in OBJECTIVES.items() if o.one_winner)
