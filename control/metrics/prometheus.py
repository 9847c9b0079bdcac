"""Reading vLLM's metrics through the Prometheus HTTP API (instant queries; each replica's
counters dated by their scrape time, ``timestamp()``)."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from atoll.control.metrics.http import check_limits, check_url, fetch
from atoll.control.metrics.snapshot import (
    ABORT_REASON,
    ABORTED,
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    FINISHED,
    HISTOGRAM_SAMPLES,
    METRIC_NAMES,
    MODEL_LABEL,
    PROMPT,
    START_TIME,
    MetricsSnapshot,
    MetricsUnavailable,
    Problem,
    assemble,
    bucket_name,
    is_read,
    replica_id,
)


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
            times[replica_id(labels)] = value
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
        rid = replica_id(labels)
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
        self.url = check_url(url, "PrometheusSource")
        check_limits(timeout, max_bytes, "PrometheusSource")
        self.timeout = float(timeout)
        self.max_bytes = max_bytes
        self._clock = clock

    def _query(self, promql: str, at: float) -> list[Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
        return _query_result(fetch(url, self.timeout, self.max_bytes), url)

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
