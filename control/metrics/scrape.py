"""Reading vLLM's ``/metrics`` pages straight from its endpoints: only the lines of the metrics
read are parsed (Prometheus' text exposition format)."""

from __future__ import annotations

import math
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from atoll.control.metrics.http import check_limits, check_url, fetch
from atoll.control.metrics.snapshot import (
    ABORT_REASON,
    ABORTED,
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    FINISHED,
    MODEL_LABEL,
    START_TIME,
    MetricsSnapshot,
    MetricsUnavailable,
    Problem,
    assemble,
    bucket_name,
    is_read,
    replica_id,
)

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
        rid = url + ("|" + replica_id(labels) if len(labels) > 1 else "")
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
        self.urls = tuple(_endpoint(check_url(u, "ScrapeSource")) for u in items)
        check_limits(timeout, max_bytes, "ScrapeSource")
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
            body = fetch(url, self.timeout, self.max_bytes)
            r, t, st, p = exposition_samples(body, url, float(self._clock()))
            raw += r
            times.update(t)
            starts.update(st)
            problems += p
        return assemble(raw, times, float(self._clock()), self.url, problems=problems, starts=starts)


def _endpoint(url: str) -> str:
    # a bare host:port means its /metrics page, as Prometheus' default metrics_path
    return url if urllib.parse.urlparse(url).path not in ("", "/") else url + "/metrics"
