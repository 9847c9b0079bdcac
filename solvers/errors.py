"""The error classes every part of atoll raises for problems a user can fix.

``AtollError`` is the one base the CLI catches: it prints the message (no traceback, no repr
quotes) and exits 2. ``InputError`` is bad input (a value out of range, a malformed row, a missing
file) and is also a ``ValueError``; ``UnknownNameError`` is a name no registry knows and is also a
``KeyError``, so code that caught the built-in classes keeps working. Messages name the thing,
its value and the fix.
"""

from __future__ import annotations


class AtollError(Exception):
    """Base of every error the user can act on."""

    def __str__(self) -> str:
        # KeyError's __str__ would repr() the message; every subclass prints it as written.
        return str(self.args[0]) if self.args else self.__class__.__name__


class InputError(AtollError, ValueError):
    """Bad input: a value, a row, a file or an option the user gave."""


class UnknownNameError(AtollError, KeyError):
    """An unknown name (GPU, model, scenario, policy, ...); the message lists the valid ones."""


class MissingDataError(InputError, FileNotFoundError):
    """A data file or folder atoll needs is not where it was looked for."""
