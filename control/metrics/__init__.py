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

The package's modules: :mod:`~atoll.control.metrics.snapshot` (the names read, the snapshot types,
:func:`~atoll.control.metrics.snapshot.assemble`), :mod:`~atoll.control.metrics.http` (the GET
with its deadline and cap), :mod:`~atoll.control.metrics.prometheus` and
:mod:`~atoll.control.metrics.scrape` (the two sources). Their public names are this package's.
"""

from atoll.control.metrics.prometheus import PrometheusSource, prometheus_snapshot
from atoll.control.metrics.scrape import ScrapeSource, exposition_samples
from atoll.control.metrics.snapshot import (
    ABORT_REASON,
    ABORTED,
    BUCKETED,
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    FINISHED,
    GENERATION,
    GENERATION_PER_REQUEST,
    HISTOGRAM_SAMPLES,
    HISTOGRAMS,
    ITL,
    ITL_OLD,
    KV_USAGE,
    KV_USAGE_OLD,
    METRIC_NAMES,
    MODEL_LABEL,
    PROMPT,
    PROMPT_PER_REQUEST,
    RUNNING,
    START_TIME,
    TTFT,
    WAITING,
    Histogram,
    MetricsSnapshot,
    MetricsSource,
    MetricsUnavailable,
    ModelMetrics,
    Problem,
    SeriesSample,
    assemble,
    bucket_name,
    is_read,
    read_with_retry,
    replica_id,
)

__all__ = [
    "ABORTED",
    "ABORT_REASON",
    "BUCKETED",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "FINISHED",
    "GENERATION",
    "GENERATION_PER_REQUEST",
    "HISTOGRAMS",
    "HISTOGRAM_SAMPLES",
    "Histogram",
    "ITL",
    "ITL_OLD",
    "KV_USAGE",
    "KV_USAGE_OLD",
    "METRIC_NAMES",
    "MODEL_LABEL",
    "MetricsSnapshot",
    "MetricsSource",
    "MetricsUnavailable",
    "ModelMetrics",
    "PROMPT",
    "PROMPT_PER_REQUEST",
    "Problem",
    "PrometheusSource",
    "RUNNING",
    "START_TIME",
    "ScrapeSource",
    "SeriesSample",
    "TTFT",
    "WAITING",
    "assemble",
    "bucket_name",
    "exposition_samples",
    "is_read",
    "prometheus_snapshot",
    "read_with_retry",
    "replica_id",
]
