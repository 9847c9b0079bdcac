"""vLLM serving metrics per model, read from Prometheus or straight from ``/metrics`` endpoints.

A source's ``read()`` returns a :class:`MetricsSnapshot`: per model (label ``model_name``), one
:class:`SeriesSample` per serving replica (its cumulative ``vllm:prompt_tokens_total`` and
``vllm:generation_tokens_total`` at the time that replica was sampled) and the gauges
``vllm:num_requests_waiting`` / ``vllm:num_requests_running`` summed over replicas (and
``vllm:kv_cache_usage_perc``, averaged, when exported). :class:`atoll.control.rates.RateTracker`
turns successive snapshots into token rates; :func:`read_with_retry` retries a failed read
with exponential backoff.

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
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
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


@dataclass(frozen=True)
class SeriesSample:
    """One replica's cumulative token counters. ``series`` identifies the replica (its labels
    other than the model name, or the endpoint URL); NaN values are kept and reported, never
    turned into 0."""

    series: str
    time_s: float
    prompt_tokens: float
    generation_tokens: float

    def __post_init__(self) -> None:
        owner = f"SeriesSample {self.series!r}"
        if not isinstance(self.time_s, int | float) or not math.isfinite(self.time_s):
            raise ValueError(f"{owner}: field 'time_s' must be a finite number, got {self.time_s!r}")
        _finite_or_nan(owner, "prompt_tokens", self.prompt_tokens)
        _finite_or_nan(owner, "generation_tokens", self.generation_tokens)


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
        return {"series": [[s.series, s.time_s, s.prompt_tokens, s.generation_tokens] for s in self.series],
                "waiting": self.waiting, "running": self.running, "kv_usage": self.kv_usage,
                "problems": list(self.problems)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelMetrics:
        series = tuple(SeriesSample(str(a), float(b), _num(c), _num(d)) for a, b, c, d in doc["series"])
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

    def __post_init__(self) -> None:
        if not isinstance(self.time_s, int | float) or not math.isfinite(self.time_s):
            raise ValueError(f"MetricsSnapshot: field 'time_s' must be a finite number, got {self.time_s!r}")
        object.__setattr__(self, "models", dict(self.models))

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


def assemble(raw: Iterable[tuple[str, str, str, float]], times: Mapping[str, float], now_s: float,
             source: str) -> MetricsSnapshot:
    """Group raw ``(model, replica id, metric name, value)`` samples into a snapshot.

    ``times`` dates replicas by id (missing ones get ``now_s``). Each problem is named so the
    controller can report why a model was held.
    """
    replicas: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for model, replica, name, value in raw:
        replicas[model][replica][name] = value
    models: dict[str, ModelMetrics] = {}
    for model, reps in sorted(replicas.items()):
        problems: list[str] = []
        series: list[SeriesSample] = []
        gauges: dict[str, list[float]] = defaultdict(list)
        for rid, values in sorted(reps.items()):
            where = f"replica {rid!r}" if rid else "its series"
            for name in (WAITING, RUNNING):
                if name in values:
                    gauges[name].append(values[name])
            kv: float | None = values.get(KV_USAGE, values.get(KV_USAGE_OLD))
            if kv is not None and math.isfinite(kv):
                gauges[KV_USAGE].append(kv)
            counters = [values.get(PROMPT), values.get(GENERATION)]
            if counters == [None, None]:
                continue  # a gauge-only series (e.g. a replica still loading): no counters to rate
            for name, counter in zip((PROMPT, GENERATION), counters, strict=True):
                if counter is None:
                    problems.append(f"{name} missing for {where}")
                elif math.isnan(counter):
                    problems.append(f"{name} is NaN for {where}")
            series.append(SeriesSample(rid, times.get(rid, now_s), *(math.nan if v is None else v
                                                                    for v in counters)))
        if not series:
            problems.append(f"no {PROMPT} / {GENERATION} series")
        sums: dict[str, float | None] = {}
        for name in (WAITING, RUNNING):
            vals = gauges.get(name, [])
            if not vals:
                problems.append(f"{name} missing")
            elif any(math.isnan(v) for v in vals):
                problems.append(f"{name} is NaN")
            sums[name] = math.fsum(vals) if vals else None
        kvs = gauges.get(KV_USAGE, [])
        models[model] = ModelMetrics(tuple(series), sums[WAITING], sums[RUNNING],
                                     math.fsum(kvs) / len(kvs) if kvs else None, tuple(problems))
    return MetricsSnapshot(now_s, models, source)


def _fetch(url: str, timeout: float) -> bytes:
    """GET ``url``; every failure becomes :class:`MetricsUnavailable` naming the URL and cause."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # http(s) only: checked in _check_url
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace").strip()
        raise MetricsUnavailable(url, f"HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")
                                 ) from exc
    except urllib.error.URLError as exc:
        raise MetricsUnavailable(url, f"cannot connect ({exc.reason})") from exc
    except TimeoutError as exc:
        raise MetricsUnavailable(url, f"no answer within {timeout:g} s") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise MetricsUnavailable(url, f"{type(exc).__name__}: {exc}") from exc


def _check_url(url: str, owner: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{owner}: field 'url' must be an http(s) URL such as http://127.0.0.1:9090, "
                         f"got {url!r}")
    return url.rstrip("/")


def _check_timeout(timeout: float, owner: str) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"{owner}: field 'timeout' must be > 0 seconds, got {timeout!r}")


class PrometheusSource:
    """Reads the vLLM metrics through the Prometheus HTTP API (two instant queries: the values,
    then the scrape times of the counters; see the module docstring)."""

    def __init__(self, url: str, timeout: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self.url = _check_url(url, "PrometheusSource")
        _check_timeout(timeout, "PrometheusSource")
        self.timeout = float(timeout)
        self._clock = clock

    def _query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = _fetch(url, self.timeout)
        try:
            doc = json.loads(body)
            if doc.get("status") != "success":
                raise MetricsUnavailable(url, f"query failed: {doc.get('error', doc)!r}")
            result = doc["data"]["result"]
            if doc["data"]["resultType"] != "vector" or not isinstance(result, list):
                kind = doc["data"]["resultType"]
                raise MetricsUnavailable(url, f"expected an instant vector, got {kind!r}")
            return result
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetricsUnavailable(url, f"bad JSON answer ({type(exc).__name__}: {exc}): "
                                     f"{body[:200]!r}") from exc

    def read(self) -> MetricsSnapshot:
        names = "|".join(n.removeprefix("vllm:") for n in METRIC_NAMES)
        values = self._query(f'{{__name__=~"vllm:({names})"}}')
        stamps = self._query(f"timestamp({PROMPT})")
        now = float(self._clock())
        times = {_replica_id(r["metric"]): float(r["value"][1]) for r in stamps if MODEL_LABEL in r["metric"]}
        raw = []
        for r in values:
            labels = r["metric"]
            if MODEL_LABEL in labels:
                value = float(r["value"][1])
                raw.append((labels[MODEL_LABEL], _replica_id(labels), labels["__name__"], value))
        return assemble(raw, times, now, self.url)


def _replica_id(labels: Mapping[str, str]) -> str:
    # timestamp() drops __name__, so the id must not include it; the model is keyed separately
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("__name__", MODEL_LABEL))


class ScrapeSource:
    """Reads ``/metrics`` text straight from the exporters (vLLM servers or ``atoll replay``).

    Any endpoint failing fails the whole read: a partial read would show the replicas behind
    the failed endpoint as gone and under-count their models' demand.
    """

    def __init__(self, urls: Sequence[str] | str, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        items = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
        if not items or not all(items):
            raise ValueError(f"ScrapeSource: field 'urls' needs at least one URL, got {urls!r}")
        self.urls = tuple(_endpoint(_check_url(u, "ScrapeSource")) for u in items)
        _check_timeout(timeout, "ScrapeSource")
        self.timeout = float(timeout)
        self._clock = clock

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def read(self) -> MetricsSnapshot:
        raw: list[tuple[str, str, str, float]] = []
        times: dict[str, float] = {}
        for url in self.urls:
            body = _fetch(url, self.timeout)
            stamp = float(self._clock())
            try:
                families = list(text_string_to_metric_families(body.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as exc:
                raise MetricsUnavailable(url, f"not Prometheus text format ({exc})") from exc
            for family in families:
                # the parser strips "_total" from counter family names; sample names keep it
                for sample in family.samples:
                    if sample.name in METRIC_NAMES and MODEL_LABEL in sample.labels:
                        rid = url + ("|" + _replica_id(sample.labels) if len(sample.labels) > 1 else "")
                        times[rid] = stamp
                        raw.append((sample.labels[MODEL_LABEL], rid, sample.name, float(sample.value)))
        return assemble(raw, times, float(self._clock()), self.url)


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
