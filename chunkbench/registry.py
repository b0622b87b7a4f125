"""The one registry type: whatever comes in kinds (policies, objectives, cost-model families, workloads, vLLM's
datasets, server kinds) is kept by name in a Registry, in the order registered (the order --help and errors
list). A name is registered once; an unknown name is a UserError, one line listing the known names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from chunkbench.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str, unknown: str = "unknown {what} '{name}'; use {known}") -> None:
        """`what` names an entry in errors; `unknown` is the message for a name not registered, with the fields
        {what}, {name}, {known} ("a, b, c") and {known_or} ("a, b or c")."""
        self.what, self._unknown = what, unknown
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T) -> T: ...
    def register(self, name: str, entry: T | None = None) -> T | Callable[[T], T]:
        """Add `entry` as `name` and return it; without an entry, a decorator that adds what it decorates."""
        if entry is None:
            return lambda decorated: self.register(name, decorated)  # @registry.register("name")
        if not name:
            raise ValueError(f"a {self.what} needs a name")
        if name in self._entries:
            raise ValueError(f"{self.what} '{name}' is taken: a name is registered once")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T | None:
        """Remove `name` (a test's toy entry); returns what it held, None for a name not registered."""
        return self._entries.pop(name, None)

    def get(self, name: str) -> T:
        if name not in self._entries:
            known = self.names()
            known_or = ", ".join(known[:-1]) + " or " + known[-1] if len(known) > 1 else "".join(known)
            message = self._unknown.format(what=self.what, name=name, known=", ".join(known), known_or=known_or)
            raise UserError(message)
        return self._entries[name]

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def values(self) -> list[T]:
        return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())  # a copy: registering while iterating is safe

    def __len__(self) -> int:
        return len(self._entries)
