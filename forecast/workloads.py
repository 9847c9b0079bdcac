"""Demand series per model from real traces: requests/s and mean request lengths per step.

A :class:`DemandSeries` gives, per step, requests/s and the mean input and output tokens of the
requests, hence both services' demand: prefill tokens/s = requests/s x mean input tokens,
decode tokens/s = requests/s x mean output tokens.

Sources (``../shared/data``, see each SOURCE.md):
- ServeGen (Alibaba Bailian, Apache-2.0): per-client arrival rates per 600 s window (14 days
  for the language models m-large, m-mid, m-small; 1 day for deepseek-r1 and mm-image) and
  per-client token-length distributions per 6 h window. Rates of all clients are summed; the
  mean lengths of a window are the request-weighted means over clients. Length files missing
  from the snapshot, or empty windows, are filled from the nearest window of the same client
  that has data (else the model-wide mean), and the fill is reported once per load.
- Azure LLM inference 2023 (code, conv): one row per request, counted per step.
- A CSV file of the user's own, either a request log ``timestamp,model,input_tokens,
  output_tokens`` (one row per request) or counts per interval ``timestamp,model,requests`` plus
  mean or total input and output tokens (:mod:`atoll.forecast.counts`, streamed); the header
  tells them apart.

Workload names: ``servegen:<model>``, ``azure:code``, ``azure:conv``, ``csv:<path>[#model]``,
each optionally followed by ``@<scale>`` (``@mean:10``, ``@factor:2``, ``@none``; see
:mod:`atoll.forecast.scaling`). :func:`load_workload` scales nothing unless asked.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from atoll.forecast.logrows import (  # noqa: F401 - MAX_STEPS, WorkloadError: public here too
    MAX_STEPS,
    FileCheck,
    ModelCheck,
    RowBuffer,
    Rows,
    WorkloadError,
    build,
    row_key,
)

if TYPE_CHECKING:  # pandas is imported where it is used (0.3 s of every command's start)
    import pandas as pd
from atoll.solvers.errors import MissingDataError
from atoll.solvers.paths import shared_data_dir

log = logging.getLogger(__name__)

SERVEGEN_MODELS: dict[str, str] = {
    "m-large": "language", "m-mid": "language", "m-small": "language",
    "deepseek-r1": "reason", "mm-image": "multimodal",
}
SERVEGEN_WINDOW_S = 600
SERVEGEN_LENGTH_WINDOW_S = 21600
AZURE_TRACES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}
DAY_S = 86400


@dataclass(frozen=True)
class DemandSeries:
    """Per-step demand of one model. ``start_s`` is seconds from the trace start."""

    name: str
    step_s: float
    requests_per_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    start_s: float = 0.0

    def __post_init__(self) -> None:
        owner = f"DemandSeries {self.name!r}"
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise WorkloadError(f"{owner}: field 'step_s' must be > 0, got {self.step_s!r}")
        n = len(self.requests_per_s)
        for f in ("requests_per_s", "input_tokens", "output_tokens"):
            arr = np.asarray(getattr(self, f), dtype=float)
            if arr.ndim != 1 or len(arr) != n:
                raise WorkloadError(f"{owner}: field '{f}' must be 1-D with {n} values")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                bad = int(np.flatnonzero(~np.isfinite(arr) | (arr < 0))[0])
                raise WorkloadError(f"{owner}: field '{f}' has {arr[bad]!r} at step {bad}; "
                                    f"values must be finite and >= 0")
            arr.setflags(write=False)
            object.__setattr__(self, f, arr)

    def __len__(self) -> int:
        return len(self.requests_per_s)

    @property
    def prefill_tokens_per_s(self) -> np.ndarray:
        return self.requests_per_s * self.input_tokens

    @property
    def decode_tokens_per_s(self) -> np.ndarray:
        return self.requests_per_s * self.output_tokens

    @property
    def steps_per_day(self) -> int:
        return int(round(DAY_S / self.step_s))

    def to_frame(self) -> pd.DataFrame:
        """The three service demands (and mean lengths) indexed by time since the trace start."""
        import pandas as pd

        index = pd.to_timedelta(self.start_s + np.arange(len(self)) * self.step_s, unit="s")
        return pd.DataFrame({
            "requests_per_s": self.requests_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
        }, index=pd.TimedeltaIndex(index, name="since_start"))

    def days(self, first: int, last: int) -> DemandSeries:
        """Days ``first..last`` (1-based, inclusive) of the series."""
        per = self.steps_per_day
        total = len(self) // per
        if not 1 <= first <= last <= total:
            raise WorkloadError(f"days {first}-{last} out of range for {self.name!r}: it has days 1-{total}")
        sl = slice((first - 1) * per, last * per)
        return replace(self, requests_per_s=self.requests_per_s[sl], input_tokens=self.input_tokens[sl],
                       output_tokens=self.output_tokens[sl], start_s=self.start_s + (first - 1) * DAY_S)


def scale_to_mean_rate(series: DemandSeries, mean_req_per_s: float) -> DemandSeries:
    """Scale requests/s so their mean is ``mean_req_per_s`` (the shape is kept), as the Coral
    paper does with 10 or 25 req/s per model."""
    if not (mean_req_per_s > 0 and math.isfinite(mean_req_per_s)):
        raise WorkloadError(f"mean rate must be > 0 req/s, got {mean_req_per_s!r}")
    mean = float(np.mean(series.requests_per_s))
    if mean <= 0:
        raise WorkloadError(f"series {series.name!r} has no requests; it cannot be scaled")
    return replace(series, requests_per_s=series.requests_per_s * (mean_req_per_s / mean))


def _resample(values: np.ndarray, window_s: float, step_s: float) -> np.ndarray:
    """Rates per ``window_s`` window -> per ``step_s`` step (mean over the step, piecewise-constant
    within a window)."""
    if step_s % window_s == 0:
        k = int(step_s // window_s)
        n = len(values) // k
        return values[: n * k].reshape(n, k).mean(axis=1)
    if window_s % step_s == 0:
        return np.repeat(values, int(window_s // step_s))
    raise WorkloadError(f"step {step_s:g} s must divide or be a multiple of the trace's "
                        f"{window_s:g} s windows")


_PAIR = re.compile(r"[{}\s]")


def _mean_of_dist(literal: str) -> float | None:
    """Mean of a ServeGen ``{value: probability}`` literal; None for an empty distribution."""
    body = _PAIR.sub("", literal)
    if not body:
        return None
    nums = np.array(body.replace(":", ",").split(","), dtype=float)
    values, probs = nums[0::2], nums[1::2]
    total = probs.sum()
    return float((values * probs).sum() / total) if total > 0 else None


MULTIMODAL_INPUTS = ("text_tokens", "image_tokens", "audio_tokens", "video_tokens")


def _input_mean(fields: dict[str, str]) -> float | None:
    """Mean input tokens of a length window: ``input_tokens``, or for the multimodal model (whose
    files split the input by modality) the sum of the modalities' means."""
    if "input_tokens" in fields:
        return _mean_of_dist(fields["input_tokens"])
    parts = [_mean_of_dist(fields[k]) for k in MULTIMODAL_INPUTS if k in fields]
    known = [v for v in parts if v is not None]
    return float(sum(known)) if known else None


def _fill_nearest(means: np.ndarray) -> tuple[np.ndarray, int]:
    """Fill NaN windows from the nearest window with data; returns (filled, count filled)."""
    ok = np.flatnonzero(~np.isnan(means))
    missing = int(np.isnan(means).sum())
    if not len(ok) or not missing:
        return means, missing
    idx = np.arange(len(means))
    nearest = ok[np.abs(idx[:, None] - ok[None, :]).argmin(axis=1)]
    return means[nearest], missing


def servegen_traces(model: str, data: Path | None = None) -> list[Path]:
    """The ``chunk-<client>-trace.csv.gz`` files of ServeGen ``model``, in client order."""
    if model not in SERVEGEN_MODELS:
        raise WorkloadError(f"unknown ServeGen model {model!r}; valid: {', '.join(SERVEGEN_MODELS)}")
    folder = (data or shared_data_dir()) / "servegen" / "data" / SERVEGEN_MODELS[model] / model
    traces = sorted(folder.glob("chunk-*-trace.csv.gz"), key=lambda p: int(p.name.split("-")[1]))
    if not traces:
        raise FileNotFoundError(f"no ServeGen traces in {folder} — check ATOLL_SHARED_DATA")
    return traces


@lru_cache(maxsize=8)
def _servegen_clients(model: str, data: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(rates [clients, windows], input means [clients, length windows], output means, fill report)."""
    traces = servegen_traces(model, data)
    rates = []
    for path in traces:
        with gzip.open(path, "rt") as fh:
            rates.append([float(row[1]) for row in csv.reader(fh)])
    rate = np.array(rates)
    n_len = int(math.ceil(rate.shape[1] * SERVEGEN_WINDOW_S / SERVEGEN_LENGTH_WINDOW_S))
    ins = np.full((len(traces), n_len), np.nan)
    outs = np.full((len(traces), n_len), np.nan)
    missing_files = 0
    for i, path in enumerate(traces):
        dpath = path.with_name(path.name.replace("-trace.csv.gz", "-dataset.json.gz"))
        if not dpath.exists():
            missing_files += 1
            continue
        with gzip.open(dpath, "rt") as fh:
            doc = json.load(fh)
        for start, fields in doc.items():
            w = int(float(start)) // SERVEGEN_LENGTH_WINDOW_S
            if w < n_len and fields:
                ins[i, w] = _input_mean(fields) or np.nan
                outs[i, w] = _mean_of_dist(fields.get("output_tokens", "{}")) or np.nan
    filled = 0
    for arr in (ins, outs):
        for i in range(len(arr)):
            arr[i], k = _fill_nearest(arr[i])
            filled += k
    # A client with no length data at all takes the model-wide window mean.
    for arr in (ins, outs):
        col = np.nanmean(np.where(np.isnan(arr), np.nan, arr), axis=0)
        rows = np.isnan(arr).all(axis=1)
        arr[rows] = col
    report = (f"ServeGen {model}: {missing_files} of {len(traces)} clients have no length file "
              f"(model-wide means used); {filled} empty length windows filled from the nearest window")
    return rate, ins, outs, report


def load_servegen(model: str, *, step_s: float = 300, data: Path | None = None,
                  clients: Sequence[int] | None = None, name: str | None = None) -> DemandSeries:
    """Sum of the (selected) clients' rates, request-weighted mean lengths, at ``step_s``."""
    rate, ins, outs, report = _servegen_clients(model, data or shared_data_dir())
    log.info(report)
    sel = np.arange(len(rate)) if clients is None else np.asarray(clients, dtype=int)
    r = rate[sel]
    per = SERVEGEN_LENGTH_WINDOW_S // SERVEGEN_WINDOW_S
    weights = r.sum(axis=1, keepdims=True)  # keeps idle windows well defined
    ins_w = np.repeat(ins[sel], per, axis=1)[:, : r.shape[1]]
    outs_w = np.repeat(outs[sel], per, axis=1)[:, : r.shape[1]]
    total = r.sum(axis=0)
    denom = np.where(total > 0, total, 1.0)
    w = np.where(total > 0, r, weights)  # idle window: client volume weights
    wsum = np.where(total > 0, denom, weights.sum())
    mean_in = (w * ins_w).sum(axis=0) / wsum
    mean_out = (w * outs_w).sum(axis=0) / wsum
    return DemandSeries(name or f"servegen:{model}", step_s,
                        _resample(total, SERVEGEN_WINDOW_S, step_s),
                        _resample(mean_in, SERVEGEN_WINDOW_S, step_s),
                        _resample(mean_out, SERVEGEN_WINDOW_S, step_s))


def _bucket_requests(times_s: np.ndarray, ins: np.ndarray, outs: np.ndarray, step_s: float,
                     name: str) -> DemandSeries:
    n = int(times_s.max() // step_s) + 1 if len(times_s) else 0
    idx = (times_s // step_s).astype(int)
    count = np.bincount(idx, minlength=n).astype(float)
    sum_in = np.bincount(idx, weights=ins, minlength=n)
    sum_out = np.bincount(idx, weights=outs, minlength=n)
    safe = np.where(count > 0, count, 1.0)
    return DemandSeries(name, step_s, count / step_s, sum_in / safe, sum_out / safe)


# Numeric timestamps are seconds; from 1e11 on (the year 5138 in seconds, 1973 in milliseconds)
# a value is taken to be milliseconds, which the log does not accept.
MS_THRESHOLD = 1e11


def _parse_time(text: str) -> tuple[float, bool]:
    """Seconds since the epoch, and whether the text carried a time zone (numbers count as UTC).
    ISO 8601 text is read whole (any fraction digits, ``Z`` or an offset); a time without a
    zone is taken as UTC, never the host's zone."""
    s = text.strip()
    try:
        v = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(v):
            raise ValueError(f"timestamp {s!r} is not a finite number")
        if abs(v) >= MS_THRESHOLD:
            raise ValueError(f"timestamp {s} looks like milliseconds; the log takes seconds "
                             f"(divide by 1000)")
        return v, True
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC).timestamp(), False
    return dt.timestamp(), True


def load_azure(trace: str, *, step_s: float = 300, data: Path | None = None) -> DemandSeries:
    """Azure LLM inference 2023 ``code`` or ``conv``: requests counted per step."""
    if trace not in AZURE_TRACES:
        raise WorkloadError(f"unknown Azure trace {trace!r}; valid: {', '.join(AZURE_TRACES)}")
    path = (data or shared_data_dir()) / "azure-llm-inference-2023" / AZURE_TRACES[trace]
    if not path.exists():
        raise FileNotFoundError(f"Azure trace missing: {path} — check ATOLL_SHARED_DATA")
    times, ins, outs = [], [], []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            times.append(_parse_time(row["TIMESTAMP"])[0])
            ins.append(float(row["ContextTokens"]))
            outs.append(float(row["GeneratedTokens"]))
    t = np.array(times)
    return _bucket_requests(t - t.min(), np.array(ins), np.array(outs), step_s, f"azure:{trace}")


def load_request_log(path: Path | str, *, step_s: float = 300,
                     models: Collection[str] | None = None) -> dict[str, DemandSeries]:
    """A user's CSV request log ``timestamp,model,input_tokens,output_tokens`` (UTF-8, header
    required; timestamp in seconds since the epoch or ISO 8601, a time without a zone read as
    UTC and reported) -> one series per model (of ``models``, default all), on the time axis of
    the bulk of those models' rows (:mod:`atoll.forecast.logrows`: copies, stray rows and gaps
    dropped or reported). Parsed once per file version, however many models are read from it."""
    return dict(load_request_log_checked(path, step_s=step_s, models=models)[0])


def load_request_log_checked(path: Path | str, *, step_s: float = 300, models: Collection[str] | None = None
                             ) -> tuple[tuple[tuple[str, DemandSeries], ...], FileCheck]:
    """:func:`load_request_log` and what the loader read and corrected (:class:`FileCheck`)."""
    if not (step_s > 0 and math.isfinite(step_s)):
        raise WorkloadError(f"step must be > 0 s, got {step_s!r}")
    p = Path(path)
    mtime_ns, size = file_version(p, "request log")
    return _build_request_log(p.resolve(), mtime_ns, size, float(step_s),
                              None if models is None else tuple(sorted(set(models))))


def file_version(p: Path, what: str) -> tuple[int, int]:
    """(modification time ns, size) of the CSV file ``p`` — the key its parse is cached under —
    or an error naming ``what`` and the path when it is missing, unreadable or not a file."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise MissingDataError(f"{what} not found: {p}") from None
    except OSError as exc:
        raise WorkloadError(f"{what} {p} cannot be read: {exc.strerror or exc}") from exc
    if not p.is_file():
        raise WorkloadError(f"{what} {p} is not a file; give the path of a CSV file")
    return st.st_mtime_ns, st.st_size


def series_from_sums(name: str, step_s: float, sums: np.ndarray) -> DemandSeries:
    """Per-step (requests, input token total, output token total) -> a series of requests/s and
    request-weighted mean lengths (0 in idle steps)."""
    req, tin, tout = sums
    safe = np.where(req > 0, req, 1.0)
    return DemandSeries(f"csv:{name}", step_s, req / step_s, np.where(req > 0, tin / safe, 0.0),
                        np.where(req > 0, tout / safe, 0.0))


@lru_cache(maxsize=8)
def _build_request_log(p: Path, mtime_ns: int, size: int, step_s: float, models: tuple[str, ...] | None
                       ) -> tuple[tuple[tuple[str, DemandSeries], ...], FileCheck]:
    rows = _parse_request_log(p, mtime_ns, size)
    sums, check = build(rows, step_s, models)
    return tuple((m, series_from_sums(m, step_s, a)) for m, a in sums), check


REQUEST_CHUNK = 65_536


@lru_cache(maxsize=4)
def _parse_request_log(p: Path, mtime_ns: int, size: int) -> Rows:
    buf = RowBuffer(p, "requests", REQUEST_CHUNK)
    naive_line = 0
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is dropped
            reader = csv.reader(fh)
            header = [c.strip() for c in next(reader, None) or []]
            need = ("timestamp", "model", "input_tokens", "output_tokens")
            if not set(need) <= set(header):
                raise WorkloadError(f"{p}: header must contain {sorted(need)}, got {header or None}")
            ti, mi, ii, oi = (header.index(c) for c in need)
            width = max(ti, mi, ii, oi) + 1
            line = 1
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # a blank line
                if len(row) < width:
                    raise WorkloadError(f"{p}:{line}: {len(row)} fields where the header has "
                                        f"{len(header)}; give every column of the header on each row")
                try:
                    t, zoned = _parse_time(row[ti])
                    i, o = float(row[ii]), float(row[oi])
                except (TypeError, ValueError, OverflowError, AttributeError) as exc:
                    raise WorkloadError(f"{p}:{line}: malformed row {row} ({exc}); timestamp must be "
                                        f"seconds or ISO 8601, token counts numbers") from exc
                if not zoned and not naive_line:
                    naive_line = line
                if not row[mi]:
                    raise WorkloadError(f"{p}:{line}: empty model name")
                if not (math.isfinite(i) and math.isfinite(o)) or i < 0 or o < 0:
                    raise WorkloadError(f"{p}:{line}: token counts must be >= 0, got {i:g}, {o:g}")
                buf.add(t, row[mi], 1.0, i, o, line, row_key(row))
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the log "
                            f"as UTF-8 CSV") from None
    except csv.Error as exc:
        raise WorkloadError(f"{p}: not a readable CSV file ({exc})") from None
    rows = buf.rows()
    if not len(rows):
        raise WorkloadError(f"{p}: no requests")
    if naive_line:
        log.warning("%s: timestamps without a time zone (first at line %d) are read as UTC",
                    p, naive_line)
    return rows


def load_workload(name: str, *, step_s: float = 300, data: Path | None = None,
                  days: range | None = None, scale: str | None = None) -> DemandSeries:
    """``servegen:<model>``, ``azure:<trace>`` or ``csv:<path>#<model>`` (a request log or a
    counts file), as recorded; ``days`` (1-based, consecutive, e.g. ``range(8, 15)`` for days
    8-14) cuts the series to those days. Scaling only when asked: a ``@<scale>`` suffix on the
    name, else ``scale`` (``mean:R``, ``factor:F`` or ``none``), applied to the whole series
    before ``days`` cuts it and logged (:func:`atoll.forecast.scaling.apply_scale`)."""
    from atoll.forecast.scaling import apply_scale, split_scale  # it imports this module

    base, spec = split_scale(name)
    series, check = _load_named(base, step_s=step_s, data=data)
    # a request log's mean leaves its gaps out (a collector down is no data, not idle time)
    mean = None if check is None else check.mean_rate("exclude")
    series = apply_scale(series, spec if spec is not None else scale, source=name, mean=mean)
    if days is None:
        return series
    if len(days) == 0 or days.step != 1:
        raise WorkloadError(f"days must be a non-empty range of consecutive days such as "
                            f"range(8, 15), got {days!r}")
    return series.days(days[0], days[-1])


def _load_named(name: str, *, step_s: float, data: Path | None) -> tuple[DemandSeries, ModelCheck | None]:
    kind, _, arg = name.partition(":")
    if kind == "servegen":
        return load_servegen(arg, step_s=step_s, data=data), None
    if kind == "azure":
        return load_azure(arg, step_s=step_s, data=data), None
    if kind == "csv":
        from atoll.forecast.counts import load_csv_checked  # it imports this module

        path, _, model = arg.partition("#")
        pairs, check = load_csv_checked(path, step_s=step_s)
        series = dict(pairs)
        if not model:
            if len(series) != 1:
                raise WorkloadError(f"{path} holds models {sorted(series)}; name one as csv:{path}#MODEL")
            model = next(iter(series))
        if model not in series:
            raise WorkloadError(f"model {model!r} not in {path}; it holds {sorted(series)}")
        return series[model], check.model(model)
    raise WorkloadError(f"unknown workload {name!r}; use servegen:<{'|'.join(SERVEGEN_MODELS)}>, "
                        f"azure:<code|conv> or csv:<path>[#model], optionally with @mean:R, "
                        f"@factor:F or @none")


LANGUAGE_MODELS: tuple[str, ...] = ("m-large", "m-mid", "m-small")


# Which of a ServeGen model's clients make the scenario's demand: all of them, or the steady or
# the bursty half of its request volume (the servegen-steady / servegen-bursty workloads).
DEMAND_SPLITS: tuple[str, ...] = ("all", "steady", "bursty")
# The scenario workloads built from ServeGen's client groups, and the split each takes.
SERVEGEN_WORKLOADS: dict[str, str] = {"servegen": "all", "servegen-steady": "steady",
                                      "servegen-bursty": "bursty"}


@lru_cache(maxsize=8)
def client_burstiness(model: str, data: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(requests per second summed over the trace's windows, request-weighted mean coefficient of
    variation of the inter-arrival times) of each client of ServeGen ``model``, in client order.
    The CV is the trace's own per window (its third column): 1 for Poisson arrivals, above 1 for
    arrivals that come in bursts; a window without requests weighs nothing."""
    traces = servegen_traces(model, data)
    volume, cv = np.zeros(len(traces)), np.zeros(len(traces))
    for i, path in enumerate(traces):
        with gzip.open(path, "rt") as fh:
            rows = [(float(r[1]), float(r[2]) if r[2] else 0.0) for r in csv.reader(fh)]
        rate, window_cv = np.array(rows).T if rows else (np.zeros(0), np.zeros(0))
        volume[i] = rate.sum()
        cv[i] = float((rate * window_cv).sum() / volume[i]) if volume[i] > 0 else 0.0
    return volume, cv


def split_clients(model: str, split: str, data: Path | None = None) -> list[int]:
    """The clients of ServeGen ``model`` in ``split`` (:data:`DEMAND_SPLITS`), in client order.

    Clients are ordered by their inter-arrival CV (:func:`client_burstiness`; ties by index); the
    steady ones are those whose cumulative request volume stays below half the model's, the bursty
    ones the rest (the client straddling the half goes to the bursty side). A client that never
    sends a request is in neither."""
    if split not in DEMAND_SPLITS:
        raise WorkloadError(f"unknown demand split {split!r}; valid: {', '.join(DEMAND_SPLITS)}")
    if split == "all":  # every client, without reading their burstiness
        return list(range(len(servegen_traces(model, data))))
    volume, cv = client_burstiness(model, data)
    active = [i for i in range(len(volume)) if volume[i] > 0]
    order = sorted(active, key=lambda i: (cv[i], i))
    cum = np.cumsum(volume[order]) / max(volume.sum(), 1e-12)
    steady = [i for i, c in zip(order, cum, strict=True) if c < 0.5]
    chosen = steady if split == "steady" else [i for i in order if i not in set(steady)]
    return sorted(chosen)


def n_model_groups(n: int, data: Path | None = None, split: str = "all") -> list[tuple[str, list[int], str]]:
    """(ServeGen source model, client indices, series name) of each of :func:`n_model_scenario`'s
    ``n`` models, in order (see there for how clients are grouped), from the clients of ``split``
    (:func:`split_clients`)."""
    if n < 1:
        raise WorkloadError(f"n must be >= 1 model, got {n}")
    data = data or shared_data_dir()
    per = [n // 3 + (1 if i < n % 3 else 0) for i in range(3)]
    out: list[tuple[str, list[int], str]] = []
    for source, groups in zip(LANGUAGE_MODELS, per, strict=True):
        if groups == 0:
            continue
        members = split_clients(source, split, data)
        rate = _servegen_clients(source, data)[0][members]
        if groups > len(rate):
            raise WorkloadError(f"{source} has {len(rate)} clients{'' if split == 'all' else ' ' + split}; "
                                f"it cannot make {groups} groups")
        windows_per_day = DAY_S // SERVEGEN_WINDOW_S
        daily = rate[:, : rate.shape[1] // windows_per_day * windows_per_day]
        profile = daily.reshape(len(rate), -1, windows_per_day).mean(axis=1)
        order = sorted(range(len(rate)), key=lambda i: (int(np.argmax(profile[i])), members[i]))
        volume = rate[order].sum(axis=1)
        cum = np.cumsum(volume) / max(volume.sum(), 1e-12)
        # group g takes clients whose cumulative volume falls in (g/G, (g+1)/G]; every group
        # gets at least one client
        cuts = [0]
        for g in range(1, groups):
            idx = int(np.searchsorted(cum, g / groups)) + 1
            cuts.append(min(max(idx, cuts[-1] + 1), len(order) - (groups - g)))
        cuts.append(len(order))
        tag = "" if split == "all" else f"{split}/"
        for g in range(groups):
            out.append((source, [members[order[i]] for i in range(cuts[g], cuts[g + 1])],
                        f"{source}/{tag}g{g}"))
    return out


def n_model_scenario(n: int, *, step_s: float = 300, data: Path | None = None, split: str = "all"
                     ) -> list[DemandSeries]:
    """``n`` model series with distinct shapes from the clients of the three ServeGen language
    models (deterministic).

    The n models are dealt to m-large, m-mid, m-small in turn (so 6 -> 2 each, 20 -> 7/7/6).
    Within a source model, clients are ordered by the hour of day of their mean peak (ties by
    client index) and cut into contiguous groups of about equal request volume: each group is a
    set of clients with a similar daily phase, so the groups' curves differ in shape, not just
    in scale. Series are named ``<source>/g<i>``; scale them with :func:`scale_to_mean_rate`.
    ``split`` takes the groups from the steady or the bursty half of each source's request volume
    only (:func:`split_clients`; series ``<source>/<split>/g<i>``).
    """
    data = data or shared_data_dir()
    return [load_servegen(source, step_s=step_s, data=data, clients=members, name=name)
            for source, members, name in n_model_groups(n, data, split)]
