"""vLLM's metrics per model as plain data: the names read, the snapshot types and how raw samples
are grouped into a snapshot (:func:`assemble`), whichever source read them
(:mod:`~atoll.control.metrics.prometheus`, :mod:`~atoll.control.metrics.scrape`); and
:func:`read_with_retry`. The package docstring (:mod:`atoll.control.metrics`) says what is read
and why."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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


def replica_id(labels: Mapping[str, str]) -> str:
    # timestamp() drops __name__, so the id must not include it; the model is keyed separately;
    # a histogram bucket's edge (le) names the bucket, not the replica
    # a histogram bucket's edge (le) names the bucket and finished_reason the counter, not the replica
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())
                    if k not in ("__name__", MODEL_LABEL, "le", "finished_reason"))


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
