"""Output conventions shared by every command.

Human results (tables, summaries) go to stdout, as ``kubectl`` and ``gh`` do, so that
``atoll catalog > file`` writes the table; progress and logs go to stderr. With ``--json`` a
command prints exactly one JSON document on stdout and its human results move to stderr. When
stderr is not a terminal (a log file, CI), long commands write a progress line every 10% or 30 s
instead of a progress bar.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from atoll.solvers.errors import AtollError, InputError

# Rich reads sys.stdout / sys.stderr at print time (no file given), so redirections and
# pytest's capture apply. Off a terminal, tables get a wide page rather than Rich's 80 columns,
# so that a redirected table is not folded.
_WIDE = 200
console = Console(stderr=True)  # progress, logs, notes
results = Console()  # human results


def _wide_if_redirected(c: Console) -> Console:
    if not c.is_terminal:
        c.width = _WIDE
    return c


UserError = InputError
"""Kept as a name for user-input errors raised in the CLI: the same class as InputError."""


def as_user_error(exc: BaseException) -> AtollError:
    """A library error caused by the user's input, as the AtollError the CLI reports: an
    AtollError stays itself (its type is kept for ``--json``), a built-in one becomes an
    InputError with the same message (KeyError's repr quotes removed)."""
    if isinstance(exc, AtollError):
        return exc
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return InputError(str(text))


class Output:
    """Where a command's human results go: stdout, or stderr when ``--json`` owns stdout."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode

    def result(self, renderable: RenderableType) -> None:
        target = console if self.json_mode else results
        # Text lines are never folded (a folded line breaks grep); tables get the page width.
        plain = isinstance(renderable, str)
        _wide_if_redirected(target).print(renderable, highlight=False, markup=not plain,
                                          soft_wrap=plain or isinstance(renderable, Text))

    def note(self, text: str) -> None:
        """A progress or log line (stderr)."""
        console.print(text, highlight=False, markup=False, soft_wrap=True)

    def json(self, document: dict[str, Any]) -> None:
        if self.json_mode:
            emit_json(document)


def output_for(args: Any) -> Output:
    return Output(bool(getattr(args, "json", False)))


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


@contextlib.contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """With ``--json`` stdout carries exactly one document, yet native libraries write to file
    descriptor 1 themselves (HiGHS prints its banner there on some runs). Inside this block fd 1
    is stderr; when ``sys.stdout`` wrote to fd 1 it is replaced by a file on the real stdout,
    which :func:`emit_json` writes (a captured ``sys.stdout``, as in tests, stays as it is)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real fd 1: nothing to guard
        yield
        return
    try:
        writes_fd1 = sys.stdout.fileno() == 1
    except (OSError, ValueError, AttributeError):
        writes_fd1 = False
    previous = sys.stdout
    real = os.fdopen(os.dup(saved), "w", encoding="utf-8") if writes_fd1 else None
    os.dup2(2, 1)
    if real is not None:
        sys.stdout = real
    try:
        yield
    finally:
        if real is not None:
            real.flush()
            sys.stdout = previous
            real.close()
        os.dup2(saved, 1)
        os.close(saved)


def emit_json(document: dict[str, Any]) -> None:
    """Print one JSON document on stdout (NaN/inf become null, numpy scalars plain numbers)."""
    sys.stdout.write(json.dumps(_clean(document), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def report_error(exc: AtollError, json_mode: bool) -> None:
    """The CLI's one rendering of a user error: the message on stderr (no repr quotes, no
    traceback) and, with ``--json``, ``{"error": {"type", "message"}}`` on stdout."""
    message = str(exc)
    console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    if json_mode:
        emit_json({"error": {"type": type(exc).__name__, "message": message}})


class ProgressLog:
    """Progress lines for a stderr that is not a terminal: one every ``fraction`` of the total or
    every ``every_s`` seconds, whichever comes first."""

    def __init__(self, description: str, total: float, *, fraction: float = 0.1, every_s: float = 30.0,
                 write: Callable[[str], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.description, self.total = description, max(float(total), 1.0)
        self.fraction, self.every_s = fraction, every_s
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.monotonic = monotonic
        self.done = 0.0
        self.start = self._last_time = monotonic()
        self._next_share = fraction

    def advance(self, n: float = 1, total: float | None = None) -> None:
        if total is not None:
            self.total = max(float(total), 1.0)
        self.done += n
        self.total = max(self.total, self.done)  # an estimated total the work outgrew
        now = self.monotonic()
        share = self.done / self.total
        if share >= self._next_share or now - self._last_time >= self.every_s:
            self.write(f"{self.description}: {min(share, 1.0):.0%} ({self.done:g}/{self.total:g}, "
                       f"{now - self.start:.0f} s)")
            self._last_time = now
            while self._next_share <= share:
                self._next_share += self.fraction


@contextmanager
def progress(description: str, total: float | None) -> Iterator[Callable[..., None]]:
    """``with progress("training", n) as advance: ... advance(k)`` — a bar on a terminal, progress
    lines (every 10% or 30 s) on a redirected stderr. A total only the library knows is passed
    with the first step: ``advance(k, total=n)``."""
    if console.is_terminal:
        bar = Progress(TextColumn("{task.description}"), BarColumn(),
                       TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                       TimeRemainingColumn(), console=console, transient=True)
        with bar:
            task = bar.add_task(description, total=total)

            def advance(n: float = 1, total: float | None = None) -> None:
                done = bar.tasks[0].completed + n
                if total is not None or (bar.tasks[0].total or 0) < done:
                    # a total only the library knows, or an estimate the work outgrew
                    bar.update(task, total=max(total or 0.0, done))
                bar.advance(task, n)

            yield advance
        return
    log = ProgressLog(description, total or 1.0)
    yield log.advance


def results_table(title: str, policies: dict[str, dict[str, Any]]) -> Table:
    """The one results table of ``simulate``, ``evaluate`` and ``demo`` (columns and cells from
    ``atoll.envs.rollout``, shared with the MLflow comparison artifact): per policy either totals
    (``{key: value}``, one run) or summaries over seeds (``{key: {"mean", "std"}}``)."""
    from atoll.envs.rollout import RESULT_COLUMNS, result_cells  # the simulator, only where it ran

    table = Table(title=title)
    table.add_column("policy")
    for _, header, _ in RESULT_COLUMNS:
        table.add_column(header, justify="right")
    for name, values in policies.items():
        table.add_row(name, *result_cells(values))
    return table
