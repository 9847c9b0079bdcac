"""From the parsed rows of a user's CSV (request log or counts) to demand series, with what was
corrected said: the time axis is the bulk of the rows, never an outlier's.

Both loaders (:mod:`atoll.forecast.workloads` for the per-request log, :mod:`atoll.forecast.counts`
for counts per interval) parse a file once into :class:`Rows` — one entry per row, in file order,
as numbers (about 60 bytes a row) — and :func:`build` turns them into series for the models asked
for. What :func:`build` does, in order:

1. **Copied rows.** A block of two or more consecutive rows that repeats, field for field, an
   earlier block that ends before it starts (a log concatenated twice, a chunk pasted twice) is a
   copy: dropped and reported. A lone exact duplicate is kept and counted (two requests in the same
   second with the same lengths happen in a busy log), and so is a run of identical rows.
2. **The time axis is the bulk's.** Only rows of the models asked for shape it (a fleet's other
   models in the same file never do). Their times are cut into periods wherever two consecutive
   times are more than :data:`ISOLATION_GAP_S` apart (or ten times the file's usual spacing, for
   coarse counts); the period with the most rows is the bulk. Rows outside it are dropped and
   reported by line when they are at most :data:`ISOLATED_SHARE` of the rows, else the file is
   refused naming the periods (two periods of real size in one file are not something to guess
   about). The series start at the bulk's first row; the cost of binning is bounded by the bulk's
   span, whatever a stray timestamp says.
3. **Gaps.** Within a model's span, a run of steps that no row covers, at least
   :data:`GAP_MIN_S` long and long enough that the model's mean rate would have put
   :data:`GAP_EXPECTED` requests in it, is a gap (a collector down), not idle time: reported, and
   left out of a ``mean_rate`` scaling unless the user counts gaps as zero.

Every correction is logged as a warning once per file version and returned in a
:class:`FileCheck` (what ``atoll check`` prints).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from atoll.solvers.errors import InputError

log = logging.getLogger(__name__)

DAY_S = 86400
# Two rows more than this apart (with no row between) belong to different periods of the file.
ISOLATION_GAP_S = float(DAY_S)
# Rows outside the bulk are dropped (and reported) when they are at most this share of the rows;
# more is an error: the file mixes periods and the loader will not pick one silently.
ISOLATED_SHARE = 0.01
GAP_MIN_S = 3600.0  # a gap is at least an hour with no rows ...
GAP_EXPECTED = 30.0  # ... in which the model's mean rate would have sent this many requests
# A span of more steps than this is a unit error, and binning it would allocate gigabytes.
MAX_STEPS = 10_000_000
COPY_MIN_ROWS = 2  # a copied block has at least this many rows
SHOW_LINES = 5  # lines quoted in a message


class WorkloadError(InputError):
    """Bad workload input; the message names the thing, its value and the fix."""


def iso(t: float) -> str:
    """Epoch seconds as ISO 8601 UTC (``Z``), or the number when it is out of the calendar."""
    try:
        return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return f"{t:g} s"


def _lines(lines: np.ndarray) -> str:
    shown = ", ".join(str(int(x)) for x in lines[:SHOW_LINES])
    return shown + (f" and {len(lines) - SHOW_LINES} more" if len(lines) > SHOW_LINES else "")


@dataclass
class Rows:
    """A parsed file, one entry per data row in file order: time (epoch s), model code,
    requests (1 per row of a request log), input and output token totals, line number, and a
    hash of the row's text (all columns) for finding copies."""

    path: Path
    kind: str  # "requests" or "counts"
    names: list[str]
    t: np.ndarray
    model: np.ndarray
    requests: np.ndarray
    tin: np.ndarray
    tout: np.ndarray
    line: np.ndarray
    key: np.ndarray

    def __len__(self) -> int:
        return len(self.t)


class RowBuffer:
    """Rows collected a chunk at a time (Python lists up to ``chunk`` rows, then numpy arrays),
    so a large file is held as numbers, not Python objects."""

    def __init__(self, path: Path, kind: str, chunk: int) -> None:
        self.path, self.kind, self.chunk = path, kind, chunk
        self.codes: dict[str, int] = {}
        self.cols: list[list[float]] = [[] for _ in range(7)]
        self.parts: list[np.ndarray] = []
        self.buffered = 0

    def add(self, t: float, model: str, requests: float, tin: float, tout: float, line: int,
            key: int) -> None:
        code = self.codes.setdefault(model, len(self.codes))
        for col, v in zip(self.cols, (t, code, requests, tin, tout, line, key), strict=True):
            col.append(v)
        self.buffered += 1
        if self.buffered >= self.chunk:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            block = np.empty((7, self.buffered))
            for k in (0, 2, 3, 4):
                block[k] = self.cols[k]
            # codes, lines and hashes are integers: kept exact in their own arrays below
            self.parts.append(block)
            self.parts.append(np.array(self.cols[1], dtype=np.int64))
            self.parts.append(np.array(self.cols[5], dtype=np.int64))
            self.parts.append(np.array(self.cols[6], dtype=np.int64))
            self.cols = [[] for _ in range(7)]
        self.buffered = 0

    def rows(self) -> Rows:
        self.flush()
        blocks, models, lines, keys = (self.parts[i::4] for i in range(4))
        def cat(xs: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(0, dtype=dtype)
        b = np.concatenate(blocks, axis=1) if blocks else np.zeros((7, 0))
        return Rows(self.path, self.kind, list(self.codes), b[0], cat(models, np.int64), b[2], b[3], b[4],
                    cat(lines, np.int64), cat(keys, np.int64))


def row_key(fields: list[str] | tuple[str, ...]) -> int:
    """A 64-bit hash of a row's text (all columns, so an id column tells two requests apart)."""
    return hash(tuple(f.strip() for f in fields))


@dataclass(frozen=True)
class Gap:
    """Steps ``first .. last`` (inclusive, of the series) with no rows of a model."""

    first: int
    last: int
    start: str  # ISO time of the gap's first step
    hours: float


@dataclass(frozen=True)
class ModelCheck:
    """What the loader read of one model."""

    model: str
    rows: int
    requests: float
    first: str  # ISO times of the first and last row kept
    last: str
    first_step: int  # steps of the series the model's rows cover
    last_step: int
    steps: int  # length of the series (padded to the file's axis)
    step_s: float
    gaps: tuple[Gap, ...]
    isolated_lines: tuple[int, ...]
    copies_dropped: int
    duplicates_kept: int

    @property
    def gap_steps(self) -> int:
        return sum(g.last - g.first + 1 for g in self.gaps)

    @property
    def active_steps(self) -> int:
        """Steps of the span not in a gap: what a mean that leaves gaps out divides by."""
        return max(self.last_step - self.first_step + 1 - self.gap_steps, 1)

    def mean_rate(self, gaps: str = "exclude") -> float:
        """Mean requests/s over the model's span with gaps left out (``exclude``), or over the
        whole series with gaps and idle padding counted as zero (``zero``)."""
        steps = self.active_steps if gaps == "exclude" else max(self.steps, 1)
        return self.requests / (steps * self.step_s)

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "rows": self.rows, "requests": self.requests, "first": self.first,
                "last": self.last, "span_days": round((self.last_step - self.first_step + 1) * self.step_s
                                                      / DAY_S, 3),
                "mean_rate": self.mean_rate("exclude"), "mean_rate_gaps_as_zero": self.mean_rate("zero"),
                "gaps": [{"start": g.start, "hours": round(g.hours, 2)} for g in self.gaps],
                "isolated_rows_dropped": len(self.isolated_lines),
                "isolated_lines": list(self.isolated_lines[:20]),
                "copied_rows_dropped": self.copies_dropped, "duplicate_rows_kept": self.duplicates_kept}


@dataclass(frozen=True)
class FileCheck:
    """What the loader read of one file for a set of models, and every correction it made."""

    path: str
    format: str
    step_s: float
    rows: int
    start: str  # ISO time of the axis' first step
    models: tuple[ModelCheck, ...]
    other_models: tuple[str, ...]  # in the file, not asked for: they do not shape the axis
    copies_dropped: int
    copy_lines: tuple[int, int] | None  # (first copied line, the line it copies)
    isolated_lines: tuple[int, ...]
    warnings: tuple[str, ...] = field(default=())

    def model(self, name: str) -> ModelCheck:
        return next(m for m in self.models if m.model == name)

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "format": self.format, "step_s": self.step_s, "rows": self.rows,
                "start": self.start, "other_models": list(self.other_models),
                "copied_rows_dropped": self.copies_dropped,
                "isolated_rows_dropped": len(self.isolated_lines),
                "models": [m.to_json() for m in self.models], "warnings": list(self.warnings)}


def copies(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(rows that are copies of an earlier block, each row's previous identical row or -1,
    lone exact duplicates kept). See the module docstring."""
    n = len(key)
    prev = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return np.zeros(n, dtype=bool), prev, 0
    order = np.argsort(key, kind="stable")
    same = key[order[1:]] == key[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    dup = prev >= 0
    # runs of rows whose previous occurrences are consecutive rows too
    step = np.zeros(n, dtype=bool)
    step[1:] = dup[1:] & dup[:-1] & (prev[1:] == prev[:-1] + 1)
    copied = np.zeros(n, dtype=bool)
    i = 0
    while i < n:
        if not dup[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and step[j + 1]:
            j += 1
        # a copy: long enough, and its original block ends before it starts (so not a run of
        # identical rows, nor a repeating pattern inside one busy second)
        if j - i + 1 >= COPY_MIN_ROWS and prev[j] < i:
            copied[i: j + 1] = True
        i = j + 1
    return copied, prev, int((dup & ~copied).sum())


def bulk(path: Path, t: np.ndarray, line: np.ndarray, coarse: float = 0.0) -> np.ndarray:
    """Mask of the rows in the bulk period (see the module docstring); an error when the rows
    outside it are too many to drop."""
    n = len(t)
    if n < 2:
        return np.ones(n, dtype=bool)
    order = np.argsort(t, kind="stable")
    ts = t[order]
    diffs = np.diff(ts)
    limit = max(ISOLATION_GAP_S, 2 * coarse)
    cuts = np.flatnonzero(diffs > limit)
    if not len(cuts):
        return np.ones(n, dtype=bool)
    bounds = np.concatenate([[0], cuts + 1, [n]])
    sizes = np.diff(bounds)
    b = int(np.argmax(sizes))
    keep = np.zeros(n, dtype=bool)
    keep[order[bounds[b]: bounds[b + 1]]] = True
    outside = n - int(sizes[b])
    if outside > ISOLATED_SHARE * n:
        stray = min((k for k in range(len(sizes)) if k != b), key=lambda k: (int(sizes[k]), k))
        where = int(line[order[bounds[stray]: bounds[stray + 1]]].min())
        periods = "; ".join(
            f"{iso(ts[bounds[k]])} to {iso(ts[bounds[k + 1] - 1])} ({int(sizes[k])} rows, from line "
            f"{int(line[order[bounds[k]: bounds[k + 1]]].min())})" for k in range(len(sizes)))
        raise WorkloadError(f"{path}:{where}: the rows form {len(sizes)} periods more than "
                            f"{limit / DAY_S:.3g} days apart: {periods}. A stray row (an unset "
                            f"clock, a canary, seconds mixed with other units?) or logs of "
                            f"different periods in one file: remove the rows "
                            f"outside the period you mean, or split the file")
    return keep


def _gaps(covered: np.ndarray, first: int, last: int, requests: float, step_s: float) -> tuple[Gap, ...]:
    span = last - first + 1
    rate = requests / (span * step_s) if span > 0 else 0.0
    need = max(GAP_MIN_S, GAP_EXPECTED / rate if rate > 0 else math.inf)
    out = []
    hole = ~covered[first: last + 1]
    if not hole.any():
        return ()
    edges = np.diff(np.concatenate([[0], hole.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
        if (b - a) * step_s >= need:
            out.append(Gap(first + int(a), first + int(b) - 1, "", (b - a) * step_s / 3600))
    return tuple(out)


def _typical(t: np.ndarray) -> float:
    """The median spacing of distinct times (0 with fewer than three)."""
    u = np.unique(t)
    return float(np.median(np.diff(u))) if len(u) >= 3 else 0.0


def _interval(t: np.ndarray) -> float | None:
    u = np.unique(t)
    d = np.diff(u)
    return float(d.min()) if len(d) else None


@dataclass(frozen=True)
class _Selection:
    """The rows :func:`build` bins: the models asked for (``wanted``, their ``codes``), the copied
    rows (``copied``, each row's previous identical row ``prev``, ``lone`` duplicates kept), the
    kept rows of the bulk and the isolated ones outside it (indices), and the bulk's first and
    last times ``t0``, ``t1``."""

    wanted: list[str]
    codes: np.ndarray
    copied: np.ndarray
    prev: np.ndarray
    lone: int
    kept: np.ndarray
    isolated: np.ndarray
    t0: float
    t1: float


def _select(rows: Rows, step_s: float, models: Collection[str] | None) -> _Selection:
    """Steps 1 and 2 of the module docstring: copies out, then the bulk of the wanted models'
    rows; refuses a file with no row of them or a bulk too long for the step."""
    p = rows.path
    wanted = list(rows.names) if models is None else [m for m in rows.names if m in set(models)]
    codes = np.array([rows.names.index(m) for m in wanted], dtype=np.int64)
    copied, prev, lone = copies(rows.key)
    sel = np.isin(rows.model, codes) & ~copied
    if not sel.any():
        raise WorkloadError(f"{p}: no rows of {sorted(models or ())} (it holds {sorted(rows.names)})")
    idx_sel = np.flatnonzero(sel)
    coarse = 0.0
    if rows.kind == "counts":
        # counts at coarse intervals (daily, weekly) are periods apart by design: the typical
        # interval of each model (the median, so one stray row does not set it) widens the limit
        per = [_typical(rows.t[idx_sel[rows.model[idx_sel] == c]]) for c in codes]
        coarse = max(per, default=0.0)
    keep_sel = bulk(p, rows.t[idx_sel], rows.line[idx_sel], coarse)
    kept = idx_sel[keep_sel]
    isolated = idx_sel[~keep_sel]
    t0 = float(rows.t[kept].min())
    t1 = float(rows.t[kept].max())
    if (t1 - t0) / step_s > MAX_STEPS:
        raise WorkloadError(f"{p}: requests span {(t1 - t0) / DAY_S:,.0f} days ({t0:g} to {t1:g} s), more "
                       f"than {MAX_STEPS:,} steps of {step_s:g} s; are seconds mixed with other units?")
    return _Selection(wanted, codes, copied, prev, lone, kept, isolated, t0, t1)


def _grown(cov: np.ndarray, n: int, length: int) -> np.ndarray:
    """Coverage of a series spread to ``length`` steps: each covered step of the first ``n``
    covers the steps its interval was spread over."""
    width = length - n + 1
    if width <= 1:
        return cov
    grown = np.zeros(length, dtype=bool)
    for k in range(width):
        grown[k: k + n] |= cov
    return grown


def _model_sums(rows: Rows, sel: _Selection, step_s: float, spread: object
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per wanted model with kept rows: (its per-step sums of requests, input and output tokens,
    the steps its rows cover), binned on the bulk's axis from ``t0`` (spread over its interval
    when ``spread`` is given). A request log's step is covered when it holds a request."""
    kept = sel.kept
    step_idx = np.floor((rows.t[kept] - sel.t0) / step_s).astype(np.int64)
    sums: dict[str, np.ndarray] = {}
    covered: dict[str, np.ndarray] = {}
    file_interval = _interval(rows.t[kept]) if rows.kind == "counts" else None
    for c, name in zip(sel.codes, sel.wanted, strict=True):
        mine = rows.model[kept] == c
        if not mine.any():
            continue
        ix = step_idx[mine]
        n = int(ix.max()) + 1
        arr = np.stack([np.bincount(ix, weights=w[kept][mine], minlength=n)
                        for w in (rows.requests, rows.tin, rows.tout)])
        cov = np.bincount(ix, minlength=n) > 0
        if rows.kind == "requests":
            cov = arr[0] > 0
        if spread is not None:
            interval = _interval(rows.t[kept][mine])
            interval = file_interval if interval is None else interval
            arr = spread(name, arr, interval)  # type: ignore[operator]
            cov = _grown(cov, n, arr.shape[1])  # an interval covers the steps it is spread over
        sums[name] = arr
        covered[name] = cov
    return sums, covered


def _model_check(rows: Rows, sel: _Selection, c: int, name: str, sums: np.ndarray, covered: np.ndarray,
                 n: int, step_s: float) -> tuple[ModelCheck, np.ndarray]:
    """(what was read of one model, its sums padded to the axis' ``n`` steps); its gaps (step 3
    of the module docstring) are found on the padded coverage."""
    kept, isolated = sel.kept, sel.isolated
    padded = np.zeros((3, n))
    padded[:, : sums.shape[1]] = sums
    cov = np.zeros(n, dtype=bool)
    cov[: len(covered)] = covered
    hit = np.flatnonzero(cov)
    first, last = int(hit[0]), int(hit[-1])
    requests = float(padded[0].sum())
    gaps = tuple(Gap(g.first, g.last, iso(sel.t0 + g.first * step_s), g.hours)
                 for g in _gaps(cov, first, last, requests, step_s))
    mine = rows.model == c
    m_kept = rows.t[kept][rows.model[kept] == c]
    iso_lines = tuple(int(x) for x in np.sort(rows.line[isolated][rows.model[isolated] == c]))
    mc = ModelCheck(name, int((rows.model[kept] == c).sum()), requests, iso(float(m_kept.min())),
                    iso(float(m_kept.max())), first, last, n, step_s, gaps, iso_lines,
                    int((sel.copied & mine).sum()), int(((sel.prev >= 0) & ~sel.copied & mine).sum()))
    return mc, padded


def _gap_warning(p: Path, name: str, gaps: tuple[Gap, ...]) -> str:
    """The warning for a model's gaps: how many, how long in all, the longest."""
    total = sum(g.hours for g in gaps)
    return (f"{p}: model {name!r} has {len(gaps)} gap(s) with no rows, {total:.1f} h in "
            f"all (the longest from {max(gaps, key=lambda g: g.hours).start}, "
            f"{max(g.hours for g in gaps):.1f} h); read as no data: a mean_rate scaling "
            f"leaves them out unless the workload says gaps: zero")


def _file_warnings(rows: Rows, sel: _Selection, warnings: list[str]) -> tuple[int, tuple[int, int] | None]:
    """Put the file's own corrections before the models' warnings (copies first, then isolated
    rows); (the copied rows dropped, the first copy's line and the line it copies)."""
    p, isolated, copied = rows.path, sel.isolated, sel.copied
    if len(isolated):
        lines = np.sort(rows.line[isolated])
        warnings.insert(0, f"{p}: {len(isolated)} row(s) far outside the bulk of the file "
                           f"({iso(sel.t0)} to {iso(sel.t1)}) dropped: line(s) {_lines(lines)}")
    n_copied = int(copied.sum())
    copy_lines = None
    if n_copied:
        i = int(np.flatnonzero(copied)[0])
        copy_lines = (int(rows.line[i]), int(rows.line[sel.prev[i]]))
        warnings.insert(0, f"{p}: {n_copied} row(s) repeat earlier rows field for field, in blocks (a "
                           f"log concatenated twice?) and were dropped: the first at line "
                           f"{copy_lines[0]} copies line {copy_lines[1]}")
    return n_copied, copy_lines


def build(rows: Rows, step_s: float, models: Collection[str] | None,
          spread: object = None) -> tuple[tuple[tuple[str, np.ndarray], ...], FileCheck]:
    """Per-step sums (requests, input tokens, output tokens) per model on the bulk's axis, all
    padded to one length, and the :class:`FileCheck`. ``models`` None: every model of the file.
    ``spread`` (counts only) spreads a model's sums over its interval:
    ``spread(model, sums, interval) -> sums``."""
    p = rows.path
    sel = _select(rows, step_s, models)
    sums, covered = _model_sums(rows, sel, step_s, spread)
    n = max(a.shape[1] for a in sums.values())
    warnings: list[str] = []
    checks = []
    out = []
    for c, name in zip(sel.codes, sel.wanted, strict=True):
        if name not in sums:
            lines = rows.line[sel.isolated][rows.model[sel.isolated] == c]
            raise WorkloadError(f"{p}: every row of model {name!r} lies outside the bulk of the file's "
                           f"rows (lines {_lines(lines)}); its requests are of another period")
        mc, padded = _model_check(rows, sel, c, name, sums[name], covered[name], n, step_s)
        checks.append(mc)
        if mc.gaps:
            warnings.append(_gap_warning(p, name, mc.gaps))
        out.append((name, padded))
    n_copied, copy_lines = _file_warnings(rows, sel, warnings)
    other = tuple(m for m in rows.names if m not in sel.wanted)
    check = FileCheck(str(p), rows.kind, step_s, len(rows), iso(sel.t0), tuple(checks), other, n_copied,
                      copy_lines, tuple(int(x) for x in np.sort(rows.line[sel.isolated])), tuple(warnings))
    for w in warnings:
        log.warning("%s", w)
    if sel.lone:
        log.info("%s: %d exact duplicate row(s) kept (lone duplicates: two requests alike in the same "
                 "second happen)", p, sel.lone)
    return tuple(out), check
