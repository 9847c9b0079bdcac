"""A dict whose missing-key error lists the valid keys (every registry in atoll is one)."""

from __future__ import annotations

from typing import TypeVar

from atoll.solvers.errors import UnknownNameError

__all__ = ["Registry", "UnknownNameError"]

V = TypeVar("V")


class Registry(dict[str, V]):
    """Name -> object; lookups are case-insensitive and unknown names list the valid keys."""

    def __init__(self, kind: str, items: dict[str, V] | None = None) -> None:
        super().__init__(items or {})
        self.kind = kind

    def __missing__(self, key: str) -> V:
        if isinstance(key, str):
            for name, value in self.items():
                if name.lower() == key.lower():
                    return value
        raise UnknownNameError(
            f"unknown {self.kind} {key!r}; valid {self.kind}s: {', '.join(sorted(self))}"
        )
