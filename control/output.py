"""Output conventions shared by every command.

With ``--json`` a command prints exactly one JSON document on stdout; tables, progress bars
and logs always go to stderr so that the JSON stays machine-readable.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console

from atoll.solvers.errors import InputError

# Human output never touches stdout: stdout is reserved for the JSON document.
console = Console(stderr=True)


class UserError(InputError):
    """An error caused by the user's input; the CLI prints its message without a traceback."""


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def emit_json(document: dict[str, Any]) -> None:
    """Print one JSON document on stdout (NaN/inf become null, numpy scalars plain numbers)."""
    sys.stdout.write(json.dumps(_clean(document), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
