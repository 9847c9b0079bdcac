"""Ray tasks as they finish: the wait loop the template build and the contest share.

Ray is an optional extra (``atoll[ray]``); callers import and initialize it (each with its own
error for a missing extra or an unreachable cluster) before they hand their tasks here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def completed(pending: dict[Any, T]) -> Iterator[tuple[T, Any]]:
    """(what each task was submitted for, its result), in the order the tasks finish; ``pending``
    maps each task's object ref to its job and is emptied as they finish."""
    import ray  # the optional extra, imported by the caller already

    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            yield pending.pop(ref), ray.get(ref)
