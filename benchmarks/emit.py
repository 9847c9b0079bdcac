"""How every benchmark hands in its figures: one JSON document on stdout and, when asked, the same
text in a results file (``--out``, e.g. ``benchmarks/results/<name>.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(doc: Any, out: Path | None = None, *, indent: int = 2, **dumps: Any) -> str:
    """Print ``doc`` as JSON (``json.dumps`` options in ``dumps``), write it to ``out`` too."""
    text = json.dumps(doc, indent=indent, **dumps)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return text
