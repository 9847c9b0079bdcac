"""Aggregated workload input: request counts per interval, streamed into demand series.

A production trace of billions of requests is usually kept as counts per interval, not one row
per request. The counts format is a UTF-8 CSV file with a header and one row per (interval,
model)::

    timestamp,model,requests,mean_input_tokens,mean_output_tokens
    2024-05-01T00:00:00Z,phi-4,1250,812.5,143.0
    2024-05-01T00:01:00Z,phi-4,1302,790.1,150.2

- ``timestamp``: the start of the interval, with the request log's rules (seconds since the
  epoch, or ISO 8601; a time without a zone is read as UTC and reported; milliseconds refused);
- ``model``: the model's name (one file may hold several models);
- ``requests``: the number of requests that arrived in the interval (a number >= 0);
- the request lengths, either ``mean_input_tokens,mean_output_tokens`` (means over the
  interval's requests; may be left empty when ``requests`` is 0) or ``input_tokens,
  output_tokens`` (the interval's totals).

Other columns are ignored; rows of the same interval and model are added (e.g. one per server).
Intervals may be of any length: a model's interval is the smallest gap between two of its rows.
Counts are re-binned to the simulator's step, aligned to the file's first timestamp like the
request log: requests are summed and the mean lengths are request-weighted; an interval longer
than the step (a whole multiple of it) is spread evenly over the steps it covers, the step being
the finest grain the loader can give it. An interval that does not divide the step is warned
about (steps hold unequal numbers of intervals); a longer one that is no multiple of it is an
error. The file is read in chunks and accumulated per (model, step), so memory does not grow
with the number of rows, and a file is parsed once per version and step however many models are
read from it.

:func:`load_csv` reads either format, telling them apart by the header: a ``requests`` column
means counts, ``timestamp,model,input_tokens,output_tokens`` without it a per-request log
(:func:`atoll.forecast.workloads.load_request_log`).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Collection, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from atoll.forecast.logrows import FileCheck, RowBuffer, Rows, build, row_key
from atoll.forecast.workloads import (
    DemandSeries,
    WorkloadError,
    _parse_time,
    file_version,
    load_request_log_checked,
    series_from_sums,
)

log = logging.getLogger(__name__)

REQUEST_LOG_COLUMNS = ("timestamp", "model", "input_tokens", "output_tokens")
COUNTS_COLUMNS = ("timestamp", "model", "requests")
MEAN_COLUMNS = ("mean_input_tokens", "mean_output_tokens")
TOTAL_COLUMNS = ("input_tokens", "output_tokens")
CHUNK_ROWS = 65_536  # rows parsed before they are added into the per-(model, step) sums

FORMATS_HELP = ("a request log has the columns timestamp,model,input_tokens,output_tokens (one row "
                "per request); a counts file timestamp,model,requests plus mean_input_tokens,"
                "mean_output_tokens or input_tokens,output_tokens (one row per interval and model)")


_stat = file_version  # missing, unreadable or not a file: an error naming the file


def _header(p: Path) -> list[str]:
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            row = next(csv.reader(fh), None)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the file "
                            f"as UTF-8 CSV") from None
    except csv.Error as exc:
        raise WorkloadError(f"{p}:1: not a readable CSV header ({exc})") from None
    return [c.strip() for c in row or []]


def csv_format(path: Path | str) -> str:
    """``"counts"`` or ``"requests"`` (a per-request log), from the file's header; an error
    naming both formats when it is neither."""
    p = Path(path)
    _stat(p, "workload file")
    cols = set(_header(p))
    if "requests" in cols:
        return "counts"
    if set(REQUEST_LOG_COLUMNS) <= cols:
        return "requests"
    raise WorkloadError(f"{p}:1: unknown format, header {sorted(cols)}; {FORMATS_HELP}")


def load_csv(path: Path | str, *, step_s: float = 300,
             models: Collection[str] | None = None) -> dict[str, DemandSeries]:
    """A request log or a counts file (told apart by the header) -> one series per model (of
    ``models``, default all, whose rows alone shape the time axis)."""
    return dict(load_csv_checked(path, step_s=step_s, models=models)[0])


def load_csv_checked(path: Path | str, *, step_s: float = 300, models: Collection[str] | None = None
                     ) -> tuple[tuple[tuple[str, DemandSeries], ...], FileCheck]:
    """:func:`load_csv` and what the loader read and corrected (:class:`FileCheck`)."""
    if csv_format(path) == "counts":
        return load_counts_checked(path, step_s=step_s, models=models)
    return load_request_log_checked(path, step_s=step_s, models=models)


def load_counts(path: Path | str, *, step_s: float = 300,
                models: Collection[str] | None = None) -> dict[str, DemandSeries]:
    """A counts file (see the module's docstring) -> one series per model at ``step_s``, on the
    time axis of the bulk of the rows of ``models`` (default all), padded with idle steps to a
    common length. Parsed once per file version, however many models are read from it."""
    return dict(load_counts_checked(path, step_s=step_s, models=models)[0])


def load_counts_checked(path: Path | str, *, step_s: float = 300, models: Collection[str] | None = None
                        ) -> tuple[tuple[tuple[str, DemandSeries], ...], FileCheck]:
    """:func:`load_counts` and what the loader read and corrected (:class:`FileCheck`)."""
    if not (step_s > 0 and math.isfinite(step_s)):
        raise WorkloadError(f"step must be > 0 s, got {step_s!r}")
    p = Path(path)
    mtime_ns, size = _stat(p, "counts file")
    return _build_counts(p.resolve(), mtime_ns, size, float(step_s),
                         None if models is None else tuple(sorted(set(models))))


class _Pass:
    """One pass over a counts file: rows parsed, validated and kept as numbers a chunk at a time
    (:class:`atoll.forecast.logrows.RowBuffer`)."""

    def __init__(self, p: Path) -> None:
        self.p = p
        self.buf = RowBuffer(p, "counts", 1 << 62)  # flushed here, every CHUNK_ROWS rows
        self.naive_line = 0
        self.rows = 0

    @property
    def buffered(self) -> int:
        return self.buf.buffered

    def flush(self) -> None:
        self.buf.flush()

    def run(self) -> _Pass:
        p = self.p
        try:
            with p.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is dropped
                reader = csv.reader(fh)
                header = [c.strip() for c in next(reader, None) or []]
                cols, means = _columns(p, header)
                width = max(cols) + 1
                for row in reader:
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue  # a blank line
                    self._row(row, reader.line_num, cols, means, width, len(header))
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the "
                                f"file as UTF-8 CSV") from None
        except csv.Error as exc:
            raise WorkloadError(f"{p}: not a readable CSV file ({exc}); check its quoting") from None
        self.flush()
        return self

    def _row(self, row: list[str], line: int, cols: Sequence[int], means: bool, width: int,
             n_header: int) -> None:
        p = self.p
        if len(row) < width:
            raise WorkloadError(f"{p}:{line}: {len(row)} fields where the header has {n_header}; "
                                f"give every column of the header on each row")
        ti, mi, ri, ii, oi = cols
        text = row[ti]
        try:
            t, zoned = _parse_time(text)
        except (ValueError, OverflowError) as exc:
            raise WorkloadError(f"{p}:{line}: column 'timestamp': {text!r} is not a time ({exc}); "
                                f"give seconds since the epoch or ISO 8601") from None
        if not zoned and not self.naive_line:
            self.naive_line = line
        model = row[mi]
        if not model.strip():
            raise WorkloadError(f"{p}:{line}: column 'model' is empty; name the model of every row")
        names = (MEAN_COLUMNS if means else TOTAL_COLUMNS)
        requests = _number(p, line, "requests", row[ri])
        a = _number(p, line, names[0], row[ii], empty_ok=requests == 0)
        b = _number(p, line, names[1], row[oi], empty_ok=requests == 0)
        if means:
            a, b = a * requests, b * requests
        elif requests == 0 and (a > 0 or b > 0):
            raise WorkloadError(f"{p}:{line}: columns 'input_tokens','output_tokens' hold {a:g} and "
                                f"{b:g} tokens in an interval of 0 requests; fix the row's counts")
        self.rows += 1
        self.buf.add(t, model, requests, a, b, line, row_key(row))
        if self.buf.buffered >= CHUNK_ROWS:
            self.flush()


def _columns(p: Path, header: list[str]) -> tuple[tuple[int, int, int, int, int], bool]:
    """Column indices (timestamp, model, requests, input, output) and whether the lengths are
    means; errors name the missing columns and the fix."""
    have = set(header)
    missing = [c for c in COUNTS_COLUMNS if c not in have]
    has_mean = [c for c in MEAN_COLUMNS if c in have]
    has_total = [c for c in TOTAL_COLUMNS if c in have]
    fix = (f"a counts file needs {','.join(COUNTS_COLUMNS)} and either {','.join(MEAN_COLUMNS)} "
           f"(means per request) or {','.join(TOTAL_COLUMNS)} (totals per interval)")
    if missing:
        raise WorkloadError(f"{p}:1: header lacks column(s) {missing}, got {header}; {fix}")
    if has_mean and has_total:
        raise WorkloadError(f"{p}:1: header has both mean columns {has_mean} and total columns "
                            f"{has_total}; keep one pair: {fix}")
    pair = MEAN_COLUMNS if has_mean else TOTAL_COLUMNS
    lacking = [c for c in pair if c not in have]
    if lacking:
        raise WorkloadError(f"{p}:1: header lacks column(s) {lacking}, got {header}; {fix}")
    ti, mi, ri = (header.index(c) for c in COUNTS_COLUMNS)
    return (ti, mi, ri, header.index(pair[0]), header.index(pair[1])), bool(has_mean)


def _number(p: Path, line: int, column: str, text: str, *, empty_ok: bool = False) -> float:
    s = text.strip()
    what = "a count" if column == "requests" else "a token number"
    if not s:
        if empty_ok:
            return 0.0
        raise WorkloadError(f"{p}:{line}: column {column!r} is empty; give {what} >= 0"
                            + ("" if column == "requests" else " (it may be empty only when requests is 0)"))
    try:
        v = float(s)
    except ValueError:
        raise WorkloadError(f"{p}:{line}: column {column!r}: {s!r} is not a number; "
                            f"give {what} >= 0") from None
    if math.isnan(v):
        raise WorkloadError(f"{p}:{line}: column {column!r} is NaN; give {what} >= 0"
                            + ("" if column == "requests" else " (or leave it empty when requests is 0)"))
    if not math.isfinite(v):
        raise WorkloadError(f"{p}:{line}: column {column!r}: {s!r} is not finite; give {what} >= 0")
    if v < 0:
        raise WorkloadError(f"{p}:{line}: column {column!r}: {s} is negative; give {what} >= 0")
    return v


@lru_cache(maxsize=4)
def _parse_counts(p: Path, mtime_ns: int, size: int) -> Rows:
    run = _Pass(p).run()
    if not run.rows:
        raise WorkloadError(f"{p}: no rows after the header; give one row per interval and model")
    if run.naive_line:
        log.warning("%s: timestamps without a time zone (first at line %d) are read as UTC",
                    p, run.naive_line)
    return run.buf.rows()


@lru_cache(maxsize=8)
def _build_counts(p: Path, mtime_ns: int, size: int, step_s: float, models: tuple[str, ...] | None
                  ) -> tuple[tuple[tuple[str, DemandSeries], ...], FileCheck]:
    rows = _parse_counts(p, mtime_ns, size)
    sums, check = build(rows, step_s, models,
                        spread=lambda model, arr, interval: _spread(p, model, arr, interval, step_s))
    return tuple((m, series_from_sums(m, step_s, a)) for m, a in sums), check


def _spread(p: Path, model: str, sums: np.ndarray, interval: float | None, step_s: float) -> np.ndarray:
    """Sums binned at each interval's first step -> spread over the steps the interval covers
    (only when it is longer than the step)."""
    if interval is None:
        return sums
    ratio = interval / step_s
    whole = round(ratio)
    if ratio <= 1 + 1e-9:
        per = step_s / interval
        if abs(per - round(per)) > 1e-6:
            log.warning("%s: model %r has counts every %g s, which does not divide the %g s step: "
                        "steps hold %d or %d intervals, an uneven series; aggregate to intervals "
                        "that divide the step", p, model, interval, step_s, math.floor(per), math.ceil(per))
        return sums
    if abs(ratio - whole) > 1e-6:
        raise WorkloadError(f"{p}: model {model!r} has counts every {interval:g} s, longer than the "
                            f"{step_s:g} s step and not a multiple of it (some steps would get none); "
                            f"give counts at intervals that divide {step_s:g} s or are multiples of it")
    out = np.zeros((3, sums.shape[1] + whole - 1))
    for i in range(whole):
        out[:, i: i + sums.shape[1]] += sums / whole
    return out
