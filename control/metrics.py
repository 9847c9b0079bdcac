"""vLLM serving metrics per model, read from Prometheus or straight from ``/metrics`` endpoints.

A source's ``read()`` returns a :class:`MetricsSnapshot`: per model (label ``model_name``), one
:class:`SeriesSample` per serving replica (its cumulative ``vllm:prompt_tokens_total`` and
``vllm:generation_tokens_total`` at the time that replica was sampled) and the gauges
``vllm:num_requests_waiting`` / ``vllm:num_requests_running`` summed over replicas (and
``vllm:kv_cache_usage_perc``, averaged, when exported). Each replica also carries, where it
exports them, the cumulative histograms the rates and the capacity correction use
(:class:`Histogram`: ``_sum``, ``_count`` and the latency histograms' ``_bucket`` counts by
``le``): tokens per request (``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``),
time to first token (``vllm:time_to_first_token_seconds``) and inter-token latency
(``vllm:inter_token_latency_seconds``; vLLM releases before it was renamed export
``vllm:time_per_output_token_seconds``, read when the new name is absent). A missing histogram
is simply absent (the controller then uses the scenario's request shape, and has no latency);
a broken one (NaN, +Inf, negative, a ``_sum`` without its ``_count``) is left out with a note,
never a reason to hold the model. :class:`atoll.control.rates.RateTracker` turns successive
snapshots into rates; :func:`read_with_retry` retries a failed read with exponential backoff.

Why raw counters and not PromQL ``rate()``: both sources then share one rate computation
(counter resets, missing or NaN series, per-replica sums) that is tested with scripted
snapshots and a fake clock; the rate covers exactly the span between two controller ticks
with no window to tune against the scrape interval and no extrapolation at window edges;
and the last snapshot is plain data, persisted with the controller state so that the first
tick after a restart already has a rate. Rates are computed per replica and then summed
("rate, then sum"), so a replica that restarts or goes away does not look like a model-wide
counter reset.

Sample times: a replica's counters are dated by the time Prometheus scraped them (a second
query, ``timestamp(vllm:prompt_tokens_total)``), not by the query time; with a 15 s scrape and a
60 s tick, dating by query time would put up to +-25% of jitter on every rate. The scrape
source dates each endpoint's samples by the clock reading when its response arrived.

Hostile or broken input never escapes as an exception other than :class:`MetricsUnavailable`
(the read as a whole failed; the controller holds every model): a sample that cannot be used
(+Inf, negative counter, a non-number, an API item without ``metric`` or ``__name__``, a line
that does not parse) is *held and reported* — a problem of its model (which is then held) when
the model can be told, else a note on the snapshot. Every request has a total deadline
(``timeout``: connecting, headers and body together, so a server trickling one byte at a time
cannot stretch a tick) and a size cap (``max_bytes``: the body is read in chunks and refused
past it, so a huge page costs at most the cap in memory); only the lines of the metrics read
here are parsed, so the rest of a large page costs a scan, not a parse.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from atoll.solvers.errors import AtollError

PROMPT = "vllm:prompt_tokens_total"
GENERATION = "vllm:generation_tokens_total"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
# older vLLM releases export the KV-cache usage under this name; read either.
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
MODEL_LABEL = "model_name"
METRIC_NAMES: tuple[str, ...] = (PROMPT, GENERATION, WAITING, RUNNING, KV_USAGE, KV_USAGE_OLD)
# Finished requests by reason (vLLM's ``finished_reason``: stop, length, abort). Only aborted
# requests are read: under saturation they are the demand that timed out or was cancelled before
# it was served (the rest of the demand a saturated server hides; see atoll.envs.saturation).
FINISHED = "vllm:request_success_total"
ABORT_REASON = "abort"
ABORTED = f"{FINISHED} finished_reason={ABORT_REASON}"  # the raw name assemble groups by replica
# Histograms (names checked in vLLM's source, vllm/v1/metrics/loggers.py): kind -> the names
# read, preferred first. ITL was exported as time_per_output_token before vLLM renamed it.
PROMPT_PER_REQUEST = "vllm:request_prompt_tokens"
GENERATION_PER_REQUEST = "vllm:request_generation_tokens"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
ITL_OLD = "vllm:time_per_output_token_seconds"
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": (PROMPT_PER_REQUEST,), "generation_tokens": (GENERATION_PER_REQUEST,),
    "ttft": (TTFT,), "itl": (ITL, ITL_OLD)}
# the kinds whose bucket counts are kept (latency distributions); tokens per request needs sum/count
BUCKETED: frozenset[str] = frozenset({"ttft", "itl"})
_KIND_OF = {name: kind for kind, names in HISTOGRAMS.items() for name in names}
HISTOGRAM_SAMPLES: tuple[str, ...] = tuple(
    f"{name}_{part}" for name, kind in _KIND_OF.items()
    for part in ("sum", "count", *(("bucket",) if kind in BUCKETED else ())))
# prometheus_client's process collector (vLLM exports it): a changed start time proves a restart
START_TIME = "process_start_time_seconds"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 16 * 2**20  # a vLLM page is ~100 kB; a Prometheus answer for 1000 replicas ~2 MB


class MetricsUnavailable(AtollError):
    """A metrics read failed as a whole (connection refused, time-out, HTTP error, bad body)."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"metrics unavailable from {url}: {cause}")
        self.url = url
        self.cause = cause


def _finite_or_nan(owner: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: field '{name}' must be a number, got {value!r}")
    if math.isinf(value):
        raise ValueError(f"{owner}: field '{name}' must be finite or NaN, got {value!r}")


def _le_text(le: float) -> str | float:
    return "+Inf" if le == math.inf else le


@dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram of one replica: ``sum`` of the observations, their ``count``,
    and ``buckets`` as (upper edge ``le``, cumulative count) with edges ascending (``+Inf``
    included where exported; empty when the buckets are not kept). Cumulative since the
    replica started, or — as :class:`atoll.control.rates.ModelRate` carries them — one
    interval's increase."""

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        owner = "Histogram"
        for name in ("sum", "count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{owner}: field '{name}' must be finite and >= 0, got {v!r}")
        buckets = tuple((float(le), float(c)) for le, c in self.buckets)
        edges = [le for le, _ in buckets]
        if any(math.isnan(le) for le in edges) or edges != sorted(set(edges)):
            raise ValueError(f"{owner}: field 'buckets' must have distinct ascending 'le' edges, got {edges}")
        counts = [c for _, c in buckets]
        if any(not math.isfinite(c) or c < 0 for c in counts) or counts != sorted(counts):
            raise ValueError(f"{owner}: field 'buckets' counts must be finite, >= 0 and cumulative "
                             f"(non-decreasing in 'le'), got {counts}")
        object.__setattr__(self, "sum", float(self.sum))
        object.__setattr__(self, "count", float(self.count))
        object.__setattr__(self, "buckets", buckets)

    @property
    def mean(self) -> float | None:
        """sum / count, None without observations."""
        return self.sum / self.count if self.count > 0 else None

    def as_list(self) -> list[Any]:
        """JSON-ready ``[sum, count, [[le, count], ...]]`` (``le`` +Inf as the string "+Inf")."""
        return [self.sum, self.count, [[_le_text(le), c] for le, c in self.buckets]]

    @classmethod
    def from_list(cls, doc: Sequence[Any]) -> Histogram:
        total, count, *rest = doc
        buckets = tuple((float(le), float(c)) for le, c in (rest[0] if rest else ()))
        return cls(float(total), float(count), buckets)


@dataclass(frozen=True)
class SeriesSample:
    """One replica's cumulative token counters. ``series`` identifies the replica (its labels
    other than the model name, or the endpoint URL); NaN values are kept and reported, never
    turned into 0."""

    series: str
    time_s: float
    prompt_tokens: float
    generation_tokens: float
    start_time_s: float | None = None  # the replica's process start time, where exported
    # kind (a key of HISTOGRAMS) -> the replica's cumulative histogram, where exported
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    # cumulative aborted requests (vllm:request_success_total{finished_reason="abort"}), where exported
    aborted: float | None = None

    def __post_init__(self) -> None:
        owner = f"SeriesSample {self.series!r}"
        a = self.aborted
        if a is not None and (isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a)
                              or a < 0):
            raise ValueError(f"{owner}: field 'aborted' must be None or finite and >= 0, got {a!r}")
        hist = dict(self.histograms)
        bad = sorted(k for k, h in hist.items() if k not in HISTOGRAMS or not isinstance(h, Histogram))
        if bad:
            raise ValueError(f"{owner}: field 'histograms' must map kinds {sorted(HISTOGRAMS)} to Histogram "
                             f"values, got {bad[0]!r}")
        object.__setattr__(self, "histograms", dict(sorted(hist.items())))
        if not isinstance(self.time_s, int | float) or not math.isfinite(self.time_s):
            raise ValueError(f"{owner}: field 'time_s' must be a finite number, got {self.time_s!r}")
        _finite_or_nan(owner, "prompt_tokens", self.prompt_tokens)
        _finite_or_nan(owner, "generation_tokens", self.generation_tokens)
        if self.start_time_s is not None and not (isinstance(self.start_time_s, int | float)
                                                  and math.isfinite(self.start_time_s)):
            raise ValueError(f"{owner}: field 'start_time_s' must be None or a finite number, "
                             f"got {self.start_time_s!r}")


@dataclass(frozen=True)
class ModelMetrics:
    """One model's metrics in one read. ``problems`` lists what makes its numbers unusable
    (a counter or gauge series missing, a NaN value); a model with problems is held, never
    read as zero demand."""

    series: tuple[SeriesSample, ...]
    waiting: float | None
    running: float | None
    kv_usage: float | None = None
    problems: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ids = [s.series for s in self.series]
        if len(set(ids)) != len(ids):
            raise ValueError(f"ModelMetrics: field 'series' names a replica twice: {sorted(ids)}")
        for name in ("waiting", "running", "kv_usage"):
            value = getattr(self, name)
            if value is not None:
                _finite_or_nan("ModelMetrics", name, value)

    @property
    def prompt_tokens(self) -> float:
        """Cumulative prompt tokens summed over replicas (NaN if any replica's value is NaN)."""
        return math.fsum(s.prompt_tokens for s in self.series)

    @property
    def generation_tokens(self) -> float:
        return math.fsum(s.generation_tokens for s in self.series)

    def as_dict(self) -> dict[str, Any]:
        # a series is [id, time, prompt, generation] + [start time] when known + [histograms]
        # when exported (start null then); files written before histograms were read still load
        def row(s: SeriesSample) -> list[Any]:
            tail: list[Any] = []
            if s.aborted is not None:
                tail = [s.start_time_s, {k: h.as_list() for k, h in s.histograms.items()}, s.aborted]
            elif s.histograms:
                tail = [s.start_time_s, {k: h.as_list() for k, h in s.histograms.items()}]
            elif s.start_time_s is not None:
                tail = [s.start_time_s]
            return [s.series, s.time_s, s.prompt_tokens, s.generation_tokens, *tail]
        return {"series": [row(s) for s in self.series],
                "waiting": self.waiting, "running": self.running, "kv_usage": self.kv_usage,
                "problems": list(self.problems)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelMetrics:
        series = tuple(SeriesSample(str(a), float(b), _num(c), _num(d), _opt(rest[0]) if rest else None,
                                    {str(k): Histogram.from_list(h) for k, h in rest[1].items()}
                                    if len(rest) > 1 else {},
                                    _opt(rest[2]) if len(rest) > 2 else None)
                       for a, b, c, d, *rest in doc["series"])
        return cls(series=series,
                   waiting=_opt(doc.get("waiting")), running=_opt(doc.get("running")),
                   kv_usage=_opt(doc.get("kv_usage")), problems=tuple(doc.get("problems", ())))


def _num(value: Any) -> float:
    # JSON has no NaN literal in strict mode; state files store NaN as null
    return math.nan if value is None else float(value)


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one read returned, dated ``time_s`` by the reader's clock (seconds)."""

    time_s: float
    models: Mapping[str, ModelMetrics] = field(default_factory=dict)
    source: str = ""
    notes: tuple[str, ...] = ()  # samples skipped that no model could be told for

    def __post_init__(self) -> None:
        if not isinstance(self.time_s, int | float) or not math.isfinite(self.time_s):
            raise ValueError(f"MetricsSnapshot: field 'time_s' must be a finite number, got {self.time_s!r}")
        object.__setattr__(self, "models", dict(self.models))
        object.__setattr__(self, "notes", tuple(self.notes))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN becomes null, as the state file needs strict JSON)."""
        def clean(v: Any) -> Any:
            if isinstance(v, float) and math.isnan(v):
                return None
            if isinstance(v, list):
                return [clean(x) for x in v]
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v
        return {"time_s": self.time_s, "source": self.source,
                "models": {m: clean(mm.as_dict()) for m, mm in sorted(self.models.items())}}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> MetricsSnapshot:
        return cls(time_s=float(doc["time_s"]), source=str(doc.get("source", "")),
                   models={str(m): ModelMetrics.from_dict(d) for m, d in doc["models"].items()})


class MetricsSource(Protocol):
    """Anything that reads one :class:`MetricsSnapshot`; raises :class:`MetricsUnavailable`."""

    @property
    def url(self) -> str: ...

    def read(self) -> MetricsSnapshot: ...


Problem = tuple[str | None, str]  # (model if it can be told, what is wrong with a sample)


def _bad_value(value: float, counter: bool) -> str | None:
    """Why a sample value is unusable (NaN is reported apart), or None."""
    if math.isinf(value):
        return f"is {'+' if value > 0 else '-'}Inf"
    if counter and value < 0:
        return f"is negative ({value:g})"
    return None


def is_read(name: str) -> bool:
    """Whether a sample name (``vllm:x_bucket`` etc. included) is one this module reads."""
    return name in METRIC_NAMES or name in HISTOGRAM_SAMPLES or name == FINISHED


def bucket_name(sample_name: str, le: str) -> str:
    """The raw name of one histogram bucket: the sample name with its ``le`` edge (assemble's
    raw samples are (model, replica, name, value); the edge must survive grouping by replica)."""
    return f"{sample_name} le={le}"


def _parse_le(text: str) -> float:
    value = float(text)  # "+Inf" parses to inf; ValueError on garbage
    if math.isnan(value):
        raise ValueError(f"bucket edge le={text!r} is NaN")
    return value


def _histograms(values: Mapping[str, float], model: str, where: str
                ) -> tuple[dict[str, Histogram], list[str]]:
    """The histograms of one replica's raw values, and notes on those left out."""
    out: dict[str, Histogram] = {}
    notes: list[str] = []
    for kind, names in HISTOGRAMS.items():
        name = next((n for n in names if f"{n}_sum" in values or f"{n}_count" in values), None)
        if name is None:
            continue  # not exported: fine (a prior or no latency), never an error
        total, count = values.get(f"{name}_sum"), values.get(f"{name}_count")
        if total is None or count is None:
            notes.append(f"{model}: {name} of {where} has {'no _sum' if total is None else 'no _count'}; "
                         f"left out")
            continue
        prefix = bucket_name(f"{name}_bucket", "")
        try:
            buckets = sorted((_parse_le(k[len(prefix):]), v) for k, v in values.items()
                             if k.startswith(prefix)) if kind in BUCKETED else []
            out[kind] = Histogram(total, count, tuple(buckets))
        except ValueError as exc:
            notes.append(f"{model}: {name} of {where} left out ({exc})")
    return out, notes


def assemble(raw: Iterable[tuple[str, str, str, float]], times: Mapping[str, float], now_s: float,
             source: str, *, problems: Iterable[Problem] = (),
             starts: Mapping[str, float] | None = None) -> MetricsSnapshot:
    """Group raw ``(model, replica id, metric name, value)`` samples into a snapshot.

    ``times`` dates replicas by id (missing ones get ``now_s``); ``starts`` gives replicas'
    process start times by id, where known. ``problems`` are samples the reader had to skip:
    those with a model make it held (a problem of its own), the others become the snapshot's
    ``notes``. Each problem is named so the controller can report why a model was held.
    """
    replicas: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for model, replica, name, value in raw:
        replicas[model][replica][name] = value
    skipped: dict[str, list[str]] = defaultdict(list)
    notes: list[str] = []
    for owner, what in problems:
        if not owner:
            notes.append(what)
        else:
            skipped[owner].append(what)
            replicas.setdefault(owner, defaultdict(dict))
    models: dict[str, ModelMetrics] = {}
    for model, reps in sorted(replicas.items()):
        issues: list[str] = list(skipped.get(model, ()))
        series: list[SeriesSample] = []
        gauges: dict[str, list[float]] = defaultdict(list)
        for rid, values in sorted(reps.items()):
            where = f"replica {rid!r}" if rid else "its series"
            for name in (WAITING, RUNNING):
                if name in values:
                    bad = _bad_value(values[name], counter=False)
                    if bad:
                        issues.append(f"{name} {bad} for {where}")
                    gauges[name].append(math.nan if bad else values[name])
            kv: float | None = values.get(KV_USAGE, values.get(KV_USAGE_OLD))
            if kv is not None and math.isfinite(kv):
                gauges[KV_USAGE].append(kv)
            counters = [values.get(PROMPT), values.get(GENERATION)]
            if counters == [None, None]:
                continue  # a gauge-only series (e.g. a replica still loading): no counters to rate
            kept: list[float] = []
            for name, counter in zip((PROMPT, GENERATION), counters, strict=True):
                bad = None if counter is None else _bad_value(counter, counter=True)
                if counter is None:
                    issues.append(f"{name} missing for {where}")
                elif math.isnan(counter):
                    issues.append(f"{name} is NaN for {where}")
                elif bad:
                    issues.append(f"{name} {bad} for {where}")
                kept.append(math.nan if counter is None or bad else counter)
            start = (starts or {}).get(rid)
            hists, hist_notes = _histograms(values, model, where)
            notes += hist_notes
            aborted = values.get(ABORTED)
            if aborted is not None and not (math.isfinite(aborted) and aborted >= 0):
                notes.append(f"{model}: {FINISHED}{{finished_reason=\"{ABORT_REASON}\"}} of {where} is "
                             f"{aborted!r}; left out")
                aborted = None
            series.append(SeriesSample(rid, times.get(rid, now_s), kept[0], kept[1],
                                       start if start is not None and math.isfinite(start) else None,
                                       hists, aborted))
        if not series:
            issues.append(f"no {PROMPT} / {GENERATION} series")
        sums: dict[str, float | None] = {}
        for name in (WAITING, RUNNING):
            vals = gauges.get(name, [])
            if not vals:
                issues.append(f"{name} missing")
            elif any(math.isnan(v) for v in vals):
                issues.append(f"{name} is NaN")
            sums[name] = math.fsum(vals) if vals else None
        kvs = gauges.get(KV_USAGE, [])
        models[model] = ModelMetrics(tuple(series), sums[WAITING], sums[RUNNING],
                                     math.fsum(kvs) / len(kvs) if kvs else None, tuple(dict.fromkeys(issues)))
    return MetricsSnapshot(now_s, models, source, tuple(dict.fromkeys(notes)))


def _fetch(url: str, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """GET ``url`` within ``timeout`` seconds *in all* (connect, headers, body) and at most
    ``max_bytes`` of body; every failure becomes :class:`MetricsUnavailable` naming the URL and
    cause. A watchdog shuts the socket down at the deadline, since a socket time-out alone
    bounds each read, not the request (a server trickling a byte a second never trips it)."""
    parsed = urllib.parse.urlparse(url)
    cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    try:
        conn = cls(parsed.hostname or "", parsed.port, timeout=timeout)
    except (ValueError, http.client.HTTPException) as exc:  # e.g. a bad port in the URL
        raise MetricsUnavailable(url, f"bad URL ({exc})") from exc
    expired = threading.Event()
    held: list[socket.socket] = []  # the connection hands its socket to the response: keep our own

    def abort() -> None:
        expired.set()
        for sock in held:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout, abort)
    watchdog.daemon = True
    watchdog.start()
    late = f"no complete answer within {timeout:g} s (the request deadline, --timeout)"
    try:
        target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        conn.connect()
        if conn.sock is not None:
            held.append(conn.sock)
        if expired.is_set():
            raise MetricsUnavailable(url, late)
        conn.request("GET", target, headers={"Accept-Encoding": "identity"})
        resp = conn.getresponse()
        if resp.status >= 300:
            detail = resp.read(300).decode("utf-8", "replace").strip()
            cause = f"HTTP {resp.status} {resp.reason}" + (f": {detail}" if detail else "")
            raise MetricsUnavailable(url, cause)
        cap = f"answer larger than the {max_bytes / 2**20:g} MiB cap (--max-response-mb)"
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise MetricsUnavailable(url, f"{cap}: Content-Length {int(length)}")
        body = bytearray()
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise MetricsUnavailable(url, cap)
        if expired.is_set():  # the watchdog cut the body short: never parse half a page
            raise MetricsUnavailable(url, late)
        return bytes(body)
    except MetricsUnavailable:
        raise
    except ConnectionRefusedError as exc:
        raise MetricsUnavailable(url, f"cannot connect ({exc})") from exc
    except (TimeoutError, OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise MetricsUnavailable(url, late) from exc
        if isinstance(exc, socket.gaierror | ConnectionError) and conn.sock is None:
            raise MetricsUnavailable(url, f"cannot connect ({exc})") from exc
        raise MetricsUnavailable(url, f"{type(exc).__name__}: {exc}") from exc
    finally:
        watchdog.cancel()
        conn.close()


def _check_url(url: str, owner: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{owner}: field 'url' must be an http(s) URL such as http://127.0.0.1:9090, "
                         f"got {url!r}")
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"{owner}: field 'url' has a bad port ({exc}), got {url!r}") from exc
    return url.rstrip("/")


def _check_limits(timeout: float, max_bytes: int, owner: str) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"{owner}: field 'timeout' must be > 0 seconds, got {timeout!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ValueError(f"{owner}: field 'max_bytes' must be an integer >= 1024, got {max_bytes!r}")


def _query_result(body: bytes, url: str) -> list[Any]:
    """The result list of a Prometheus instant-vector answer; MetricsUnavailable otherwise."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        cause = f"bad JSON answer ({type(exc).__name__}: {exc}): {body[:200]!r}"
        raise MetricsUnavailable(url, cause) from exc
    if not isinstance(doc, dict):
        raise MetricsUnavailable(url, f"bad JSON answer: not an object: {body[:200]!r}")
    if doc.get("status") != "success":
        raise MetricsUnavailable(url, f"query failed: {str(doc.get('error', doc))[:300]!r}")
    data = doc.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if kind != "vector" or not isinstance(result, list):
        raise MetricsUnavailable(url, f"expected an instant vector, got {str(kind)[:50]!r}")
    return result


def _item(item: Any) -> tuple[dict[str, str] | None, float | None, str]:
    """(labels, value, why unusable) of one API result item; labels None if it has none usable."""
    if not isinstance(item, dict):
        return None, None, f"a result item is a {type(item).__name__}, not an object"
    labels = item.get("metric")
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        return None, None, "a result item has no 'metric' label set"
    pair = item.get("value")
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        return labels, None, "its 'value' is not a [time, value] pair"
    raw = pair[1]
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        return labels, None, f"its value {str(raw)[:40]!r} is not a number"
    try:
        return labels, float(raw), ""
    except ValueError:
        return labels, None, f"its value {str(raw)[:40]!r} is not a number"


def prometheus_snapshot(values: list[Any], stamps: list[Any], starts: list[Any], now_s: float,
                        source: str) -> MetricsSnapshot:
    """The snapshot of three instant-vector results (values, their scrape times, process start
    times); any item that cannot be used is held and reported (see the module docstring)."""
    problems: list[Problem] = []
    times: dict[str, float] = {}
    for item in stamps:
        labels, value, why = _item(item)
        if labels is not None and MODEL_LABEL in labels and value is not None and math.isfinite(value):
            times[_replica_id(labels)] = value
    by_process: dict[tuple[str | None, str | None], float] = {}
    for item in starts:
        labels, value, why = _item(item)
        if labels is not None and labels.get("__name__") == START_TIME and value is not None \
                and math.isfinite(value):
            by_process[(labels.get("instance"), labels.get("job"))] = value
    raw: list[tuple[str, str, str, float]] = []
    start_of: dict[str, float] = {}
    for item in values:
        labels, value, why = _item(item)
        model = labels.get(MODEL_LABEL) if labels is not None else None
        name = labels.get("__name__") if labels is not None else None
        if labels is None or model is None:
            if name is None or is_read(name):  # others are not ours to judge
                problems.append((None, f"skipped a result item: {why or 'no ' + MODEL_LABEL + ' label'}"))
            continue
        if name is None or not is_read(name):
            if name is None:
                problems.append((model, "a result item has no __name__ label"))
            continue
        rid = _replica_id(labels)
        if name == FINISHED:
            if labels.get("finished_reason") == ABORT_REASON:
                raw.append((model, rid, ABORTED, math.nan if value is None else value))
            continue
        if name in HISTOGRAM_SAMPLES:
            # a histogram's bad item is left out with a note (assemble), never a held model
            name = bucket_name(name, labels.get("le", "")) if name.endswith("_bucket") else name
            raw.append((model, rid, name, math.nan if value is None else value))
            continue
        if value is None:
            problems.append((model, f"{name} for replica {rid!r}: {why}"))
            continue
        raw.append((model, rid, name, value))
        start = by_process.get((labels.get("instance"), labels.get("job")))
        if start is not None:
            start_of[rid] = start
    return assemble(raw, times, now_s, source, problems=problems, starts=start_of)


class PrometheusSource:
    """Reads the vLLM metrics through the Prometheus HTTP API (instant queries: the values, the
    scrape times of the counters and the servers' process start times; see the module docstring)."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.time,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.url = _check_url(url, "PrometheusSource")
        _check_limits(timeout, max_bytes, "PrometheusSource")
        self.timeout = float(timeout)
        self.max_bytes = max_bytes
        self._clock = clock

    def _query(self, promql: str, at: float) -> list[Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
        return _query_result(_fetch(url, self.timeout, self.max_bytes), url)

    def read(self) -> MetricsSnapshot:
        names = "|".join(n.removeprefix("vllm:") for n in (*METRIC_NAMES, *HISTOGRAM_SAMPLES, FINISHED))
        # one evaluation instant for the three queries: without a shared ``time=`` each is
        # evaluated when it arrives, and a scrape landing between them pairs a counter with
        # another scrape's timestamp (a rate off by a scrape interval's share)
        at = float(self._clock())
        values = self._query(f'{{__name__=~"vllm:({names})"}}', at)
        stamps = self._query(f"timestamp({PROMPT})", at)
        starts = self._query(START_TIME, at)
        return prometheus_snapshot(values, stamps, starts, at, self.url)


def _replica_id(labels: Mapping[str, str]) -> str:
    # timestamp() drops __name__, so the id must not include it; the model is keyed separately;
    # a histogram bucket's edge (le) names the bucket, not the replica
    # a histogram bucket's edge (le) names the bucket and finished_reason the counter, not the replica
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())
                    if k not in ("__name__", MODEL_LABEL, "le", "finished_reason"))


# Lines naming a metric read here; the rest of a page is never parsed (see the module docstring).
_WANTED = re.compile(rb"^(?:vllm:|process_start_time_seconds)[^\n]*", re.MULTILINE)
_MODEL_IN_LINE = re.compile(r'model_name\s*=\s*"((?:[^"\\]|\\.)*)"')


def _parse_lines(lines: list[str]) -> list[Any]:
    return [s for family in text_string_to_metric_families("\n".join(lines) + "\n") for s in family.samples]


def exposition_samples(body: bytes, url: str, stamp: float
                       ) -> tuple[list[tuple[str, str, str, float]], dict[str, float], dict[str, float],
                                  list[Problem]]:
    """(raw samples, replica times, replica start times, problems) of one ``/metrics`` page.

    A line that does not parse is held and reported (its model's problem when the line names
    one); the page as a whole fails only when it is not text at all."""
    if b"\x00" in body[:4096]:
        raise MetricsUnavailable(url, "not Prometheus text format (binary content)")
    lines: list[str] = []
    problems: list[Problem] = []
    for match in _WANTED.finditer(body):
        try:
            lines.append(match.group().decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError:
            problems.append((None, f"a line is not UTF-8: {match.group()[:80]!r}"))
    samples: list[Any] = []
    try:
        samples = _parse_lines(lines)
    except Exception:  # noqa: BLE001 - any parser failure: find the bad lines one by one below
        for line in lines:
            try:
                samples += _parse_lines([line])
            except Exception as exc:  # noqa: BLE001 - the parser raises several kinds
                found = _MODEL_IN_LINE.search(line)
                why = f"unparsable line {line[:120]!r} ({type(exc).__name__})"
                problems.append((found.group(1) if found else None, why))
    raw: list[tuple[str, str, str, float]] = []
    times: dict[str, float] = {}
    start: float | None = None
    rids: list[str] = []
    for sample in samples:
        if sample.name == START_TIME and not sample.labels:
            start = float(sample.value)
        if not is_read(sample.name):
            continue
        model = sample.labels.get(MODEL_LABEL)
        if not isinstance(model, str):
            problems.append((None, f"a {sample.name} sample without a {MODEL_LABEL} label"))
            continue
        if sample.name == FINISHED and sample.labels.get("finished_reason") != ABORT_REASON:
            continue
        labels = {k: v for k, v in sample.labels.items() if k not in ("le", "finished_reason")}
        rid = url + ("|" + _replica_id(labels) if len(labels) > 1 else "")
        times[rid] = stamp
        rids.append(rid)
        name = ABORTED if sample.name == FINISHED else sample.name
        if name.endswith("_bucket"):
            name = bucket_name(name, str(sample.labels.get("le", "")))
        raw.append((model, rid, name, float(sample.value)))
    starts = {rid: start for rid in rids} if start is not None and math.isfinite(start) else {}
    return raw, times, starts, problems


class ScrapeSource:
    """Reads ``/metrics`` text straight from the exporters (vLLM servers or ``atoll replay``).

    Any endpoint failing fails the whole read: a partial read would show the replicas behind
    the failed endpoint as gone and under-count their models' demand.
    """

    def __init__(self, urls: Sequence[str] | str, timeout: float = DEFAULT_TIMEOUT_S,
                 clock: Callable[[], float] = time.time, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        items = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
        if not items or not all(items):
            raise ValueError(f"ScrapeSource: field 'urls' needs at least one URL, got {urls!r}")
        self.urls = tuple(_endpoint(_check_url(u, "ScrapeSource")) for u in items)
        _check_limits(timeout, max_bytes, "ScrapeSource")
        self.timeout = float(timeout)
        self.max_bytes = max_bytes
        self._clock = clock

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def read(self) -> MetricsSnapshot:
        raw: list[tuple[str, str, str, float]] = []
        times: dict[str, float] = {}
        starts: dict[str, float] = {}
        problems: list[Problem] = []
        for url in self.urls:
            body = _fetch(url, self.timeout, self.max_bytes)
            r, t, st, p = exposition_samples(body, url, float(self._clock()))
            raw += r
            times.update(t)
            starts.update(st)
            problems += p
        return assemble(raw, times, float(self._clock()), self.url, problems=problems, starts=starts)


def _endpoint(url: str) -> str:
    # a bare host:port means its /metrics page, as Prometheus' default metrics_path
    return url if urllib.parse.urlparse(url).path not in ("", "/") else url + "/metrics"


def read_with_retry(source: MetricsSource, attempts: int = 3, backoff_s: float = 0.5,
                    sleep: Callable[[float], None] = time.sleep) -> MetricsSnapshot:
    """``source.read()``, retried ``attempts`` times in all with waits of ``backoff_s``,
    ``2 x backoff_s``, ... between them; the last :class:`MetricsUnavailable` is re-raised with
    the attempt count so the caller can hold its plan and report stale data."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"read_with_retry: 'attempts' must be an integer >= 1, got {attempts!r}")
    if not (math.isfinite(backoff_s) and backoff_s >= 0):
        raise ValueError(f"read_with_retry: 'backoff_s' must be >= 0, got {backoff_s!r}")
    for attempt in range(attempts):
        try:
            return source.read()
        except MetricsUnavailable as exc:
            if attempt == attempts - 1:
                raise MetricsUnavailable(exc.url, f"{exc.cause} (after {attempts} attempts)") from exc
            sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")  # the loop returns or raises
