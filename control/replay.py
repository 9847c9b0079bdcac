"""Replay demand traces as a vLLM-style ``/metrics`` exporter, for demos and tests.

Per model (label ``model_name``) it serves what a fleet of vLLM servers would export while
serving the trace's demand:

- ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``: the integral, from the
  replay's start (``start_s``: the servers start there, counters at 0) to the current trace
  time, of requests/s x mean input (output) tokens. The series are piecewise constant per
  step, so the integral is exact and deterministic (no sampling).
- ``vllm:num_requests_running`` = lambda x (ttft_s + output tokens x tpot_s), by Little's law
  (requests in the system = arrival rate x time each spends there), with lambda the trace's
  requests/s at the current trace time and the stated per-request latencies (defaults: 0.5 s to
  the first token, 50 ms per output token).
- ``vllm:num_requests_waiting`` = lambda x queue_s (default 0.1 s spent queued).
- ``vllm:kv_cache_usage_perc`` = running x (input + output / 2) tokens / kv_capacity_tokens,
  capped at 1: a running request holds its prompt and, on average, half its output.

Trace time = start_s + speedup x (clock() - clock() at start()); past the trace's end the
counters stop growing and the gauges drop to 0. Counter rates measured against wall time are
therefore ``speedup`` x the trace's rates: divide by ``speedup``, or, in-process, date reads in
trace time (``ScrapeSource(url, clock=exporter.trace_time)``).

**Serving a plan** (``served=``, :class:`atoll.control.served.ServedFleet`; ``atoll replay --plans
DIR``): the servers are those of the plan a controller delivered, and what they export is what
they could serve — tokens processed at most the plan's *true* capacity (``--capacity-error``: a
world that differs from the model), running / waiting / KV-cache from the simulator's latency
model, and the histograms ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:request_prompt_tokens`` and
``vllm:request_generation_tokens`` (sum, count, buckets), latencies in trace seconds, and the
requests it could not serve as ``vllm:request_success_total{finished_reason="abort"}``
(:func:`atoll.envs.saturation.abandoned_requests`).

Faults for tests: :meth:`ReplayExporter.set_fault` (a model's series missing or NaN),
:meth:`ReplayExporter.reset` (a counter reset, as when a server restarts) and
:meth:`ReplayExporter.set_status` (every scrape answers an HTTP error).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from atoll.control.served import Histogram, ServedFleet
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.validation import check_number, check_port

Fault = Literal["missing", "nan"]
FAULTS: tuple[str, ...] = ("missing", "nan")


@dataclass(frozen=True)
class ModelValues:
    """What one model's servers export at one trace time (tokens, requests, fraction)."""

    prompt_tokens: float
    generation_tokens: float
    waiting: float
    running: float
    kv_usage: float


class ReplayTrace:
    """The pure part: exported values of every model as a function of trace time (seconds
    since the series' first step)."""

    def __init__(self, series: Sequence[DemandSeries], models: Sequence[str] | None = None, *,
                 ttft_s: float = 0.5, tpot_s: float = 0.05, queue_s: float = 0.1,
                 kv_capacity_tokens: float = 1e6) -> None:
        owner = "ReplayTrace"
        self.series = tuple(series)
        if not self.series:
            raise ValueError(f"{owner}: field 'series' needs at least one DemandSeries")
        names = [s.name for s in self.series] if models is None else list(models)
        if len(names) != len(self.series):
            raise ValueError(f"{owner}: field 'models' has {len(names)} names for {len(self.series)} "
                             f"series; give one model name per workload")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"{owner}: field 'models' must be distinct non-empty names, got {names}")
        self.models = tuple(names)
        for name, value in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("queue_s", queue_s)):
            check_number(owner, name, value, allow_zero=True)
        check_number(owner, "kv_capacity_tokens", kv_capacity_tokens)
        self.ttft_s, self.tpot_s, self.queue_s = float(ttft_s), float(tpot_s), float(queue_s)
        self.kv_capacity_tokens = float(kv_capacity_tokens)
        # cumulative tokens at each step boundary: the integral at any time is one lookup plus
        # the partial step
        self._cum = [(np.concatenate([[0.0], np.cumsum(s.prefill_tokens_per_s * s.step_s)]),
                      np.concatenate([[0.0], np.cumsum(s.decode_tokens_per_s * s.step_s)]))
                     for s in self.series]

    @property
    def duration_s(self) -> float:
        """Trace seconds until the longest series ends."""
        return max(len(s) * s.step_s for s in self.series)

    def values(self, trace_s: float) -> dict[str, ModelValues]:
        out = {}
        for model, s, (cum_in, cum_out) in zip(self.models, self.series, self._cum, strict=True):
            t = max(0.0, float(trace_s))
            k = int(t // s.step_s)
            if k >= len(s):
                out[model] = ModelValues(float(cum_in[-1]), float(cum_out[-1]), 0.0, 0.0, 0.0)
                continue
            rate, inp, outp = (float(s.requests_per_s[k]), float(s.input_tokens[k]),
                               float(s.output_tokens[k]))
            partial = t - k * s.step_s
            running = rate * (self.ttft_s + outp * self.tpot_s)
            kv = min(1.0, running * (inp + outp / 2) / self.kv_capacity_tokens)
            out[model] = ModelValues(float(cum_in[k]) + rate * inp * partial,
                                     float(cum_out[k]) + rate * outp * partial,
                                     rate * self.queue_s, running, kv)
        return out

    def demand_at(self, trace_s: float, models: Sequence[str], fallback: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """([M] requests/s, [M, 2] tokens per request) of ``models`` at ``trace_s``: 0 requests for a
        model the trace does not replay (or past its end), ``fallback`` [M, 2] its shape then."""
        rates = np.zeros(len(models))
        shape = np.array(fallback, dtype=float).reshape(len(models), 2)
        index = {m: i for i, m in enumerate(self.models)}
        for j, model in enumerate(models):
            i = index.get(model)
            if i is None:
                continue
            s = self.series[i]
            k = int(max(0.0, float(trace_s)) // s.step_s)
            if k < len(s):
                rates[j] = float(s.requests_per_s[k])
                shape[j] = (float(s.input_tokens[k]), float(s.output_tokens[k]))
        return rates, shape


# (metric name, help) of the histograms a served replay exports, as vLLM names them
_HISTOGRAMS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("prompt_lengths", "vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("output_lengths", "vllm:request_generation_tokens", "Number of generation tokens processed."),
)


class _Collector:
    def __init__(self, exporter: ReplayExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        label = ["model_name"]
        # help texts as vLLM's own
        prompt = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels=label)
        gen = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.",
                                  labels=label)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.", labels=label)
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.", labels=label)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                               labels=label)
        current = self._exporter.current()
        for model, v in current.items():
            prompt.add_metric([model], v.prompt_tokens)
            gen.add_metric([model], v.generation_tokens)
            waiting.add_metric([model], v.waiting)
            running.add_metric([model], v.running)
            kv.add_metric([model], v.kv_usage)
        yield from (prompt, gen, waiting, running, kv)
        served = self._exporter.served
        if served is None:
            return
        # requests the servers gave up on (the demand a saturated plan could not serve)
        finished = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                       labels=[*label, "finished_reason"])
        for model, v in current.items():
            if model in served.served and math.isfinite(v.prompt_tokens):
                finished.add_metric([model, "abort"], served.served[model].aborted)
        yield finished
        for attr, name, doc in _HISTOGRAMS:
            family = HistogramMetricFamily(name, doc, labels=label)
            for model, v in current.items():
                if model in served.served and math.isfinite(v.prompt_tokens):
                    h: Histogram = getattr(served.served[model], attr)
                    family.add_metric([model], h.cumulative(), h.total)
            yield family


class ReplayExporter:
    """An HTTP exporter of a :class:`ReplayTrace` on ``host:port`` (port 0 = a free port).

    ``start()`` binds and serves from a daemon thread; ``url`` is then ``http://host:port``
    (metrics at ``/metrics``); ``stop()`` shuts it down. Also a context manager.
    """

    def __init__(self, series: Sequence[DemandSeries], models: Sequence[str] | None = None,
                 speedup: float = 1.0, port: int = 0, *, host: str = "127.0.0.1", start_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, ttft_s: float = 0.5, tpot_s: float = 0.05,
                 queue_s: float = 0.1, kv_capacity_tokens: float = 1e6,
                 served: ServedFleet | None = None) -> None:
        owner = "ReplayExporter"
        self.served = served
        self.trace = ReplayTrace(series, models, ttft_s=ttft_s, tpot_s=tpot_s, queue_s=queue_s,
                                 kv_capacity_tokens=kv_capacity_tokens)
        check_number(owner, "speedup", speedup)
        check_number(owner, "start_s", start_s, allow_zero=True)
        check_port(owner, "port", port, any_free=True)
        self.speedup, self.start_s, self.host, self.port = float(speedup), float(start_s), host, port
        self._clock = clock
        self._t0: float | None = None
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}
        # counters start at 0 at start_s, as servers started then would
        self._offsets: dict[str, tuple[float, float]] = {} if served is not None else {
            m: (v.prompt_tokens, v.generation_tokens) for m, v in self.trace.values(self.start_s).items()}
        self._status: int | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))

    @property
    def models(self) -> tuple[str, ...]:
        return self.trace.models

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("ReplayExporter: call start() before reading 'url'")
        return f"http://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """``host:port`` as a Prometheus static target."""
        return self.url.removeprefix("http://")

    def trace_time(self) -> float:
        """Current trace time (seconds since the series' first step); ``start_s`` before start()."""
        if self._t0 is None:
            return self.start_s
        return self.start_s + self.speedup * (self._clock() - self._t0)

    def current(self) -> dict[str, ModelValues]:
        """What a scrape now returns (faults applied; a 'missing' model is left out)."""
        values = self._values(self.trace_time())
        out = {}
        with self._lock:
            for model, v in values.items():
                fault = self._faults.get(model)
                if fault == "missing":
                    continue
                if fault == "nan":
                    v = ModelValues(*(math.nan,) * 5)
                else:
                    off_in, off_out = self._offsets.get(model, (0.0, 0.0))
                    v = ModelValues(v.prompt_tokens - off_in, v.generation_tokens - off_out, v.waiting,
                                    v.running, v.kv_usage)
                out[model] = v
        return out

    def set_fault(self, model: str, fault: Fault | None) -> None:
        """Leave ``model``'s series out of every scrape ('missing'), export NaN ('nan'), or
        clear the fault (None)."""
        if model not in self.models:
            raise ValueError(f"ReplayExporter: unknown model {model!r}; it serves {list(self.models)}")
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"ReplayExporter: fault must be one of {FAULTS} or None, got {fault!r}")
        with self._lock:
            if fault is None:
                self._faults.pop(model, None)
            else:
                self._faults[model] = fault

    def reset(self, model: str) -> None:
        """Restart ``model``'s counters from 0 at the current trace time, as a restarted server."""
        if model not in self.models:
            raise ValueError(f"ReplayExporter: unknown model {model!r}; it serves {list(self.models)}")
        v = self._values(self.trace_time())[model]
        with self._lock:
            self._offsets[model] = (v.prompt_tokens, v.generation_tokens)

    def _values(self, trace_s: float) -> dict[str, ModelValues]:
        """The trace's values, or (serving a plan) what the plan's servers did up to ``trace_s``."""
        values = self.trace.values(trace_s)
        served = self.served
        if served is None:
            return values
        model = served.model
        served.advance(trace_s, lambda t: self.trace.demand_at(t, model.models, model.shape))
        return {m: ModelValues(s.prompt_tokens, s.generation_tokens, s.waiting, s.running, s.kv_usage)
                for m, s in served.served.items() if m in values}

    def set_status(self, status: int | None) -> None:
        """Answer every request with HTTP ``status`` (e.g. 503), or serve normally (None)."""
        if status is not None and not 400 <= status <= 599:
            raise ValueError(f"ReplayExporter: status must be an HTTP error code 400-599 or None, "
                             f"got {status!r}")
        self._status = status

    def render(self) -> bytes:
        """The ``/metrics`` body (Prometheus text format 0.0.4)."""
        return generate_latest(self._registry)

    def start(self) -> ReplayExporter:
        if self._server is not None:
            raise RuntimeError("ReplayExporter: already started")
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if exporter._status is not None:
                    self.send_error(exporter._status, "fault injected by ReplayExporter.set_status")
                    return
                if self.path.split("?")[0] not in ("/metrics", "/metrics/"):
                    self.send_error(404, "metrics are served at /metrics")
                    return
                body = exporter.render()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # one line per scrape would flood stderr

        try:
            server = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as exc:
            raise OSError(f"ReplayExporter: cannot listen on {self.host}:{self.port} ({exc}); "
                          f"pick another --port or 0 for any free port") from exc
        server.daemon_threads = True
        self._server = server
        self.port = int(server.server_address[1])
        self._t0 = self._clock()
        # a short poll interval: stop() waits for the serving loop's next poll
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=f"replay:{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> ReplayExporter:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
