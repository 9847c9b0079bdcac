"""``metrics:[HOST:]PORT``: the delivered plan's desired replicas (and its bill, demand, forecast
and SLO estimate) on ``/metrics`` for HPA or KEDA, and example ScaledObjects; a server that cannot
starve the controller (time-outs, a connection cap, a sized backlog)."""

from __future__ import annotations

import errno
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from atoll.control.k8s.apply import K8sOptions, dump_yaml_all
from atoll.control.k8s.scale import DESIRED, NODES, SEQUENCE, desired_rows, pool_rows, scaled_objects
from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.solvers.validation import check_port

SINK_SPECS = "json:DIR, k8s:DIR, k8s-apply[:NAMESPACE] or metrics:[HOST:]PORT"
METRICS_HOST = "127.0.0.1"  # the metrics sink is reachable from this host only unless told otherwise
CLIENT_TIMEOUT_S = 5.0  # a scraper idle or slow this long is dropped
MAX_CONNECTIONS = 32  # connections served at once; the rest are closed at once
LISTEN_BACKLOG = 128  # pending connections the kernel queues (50 scrapers at once fit)
DESIRED_LABELS = ("model", "phase", "template", "region", "tier", "workload")


class _PlanCollector(Collector):
    """The delivered plan as gauges, read under the sink's lock at each scrape."""

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.sink.lock:
            rows, pools, record = list(self.sink.rows), list(self.sink.pools), self.sink.record
        desired = GaugeMetricFamily(DESIRED, "Instances of each template in the plan atoll delivered last "
                                             "(0: a template the plan dropped)", labels=list(DESIRED_LABELS))
        for labels, n in rows:
            desired.add_metric([labels[k] for k in DESIRED_LABELS], float(n))
        yield desired
        sequence = GaugeMetricFamily(SEQUENCE, "The sequence number of the plan atoll delivered last "
                                               "(absent before the first)")
        if record is not None:
            sequence.add_metric([], float(record.sequence))
        yield sequence
        nodes = GaugeMetricFamily(NODES, "Nodes the delivered plan pays for per pool "
                                         "(<region>[~spot]/<node config>)", labels=["pool"])
        for labels, n in pools:
            nodes.add_metric([labels["pool"]], float(n))
        yield nodes
        with self.sink.lock:
            view = dict(self.sink.tick_view)
        cost = GaugeMetricFamily("atoll_plan_cost_usd_per_hour", "What the running plan costs per hour (USD)")
        if view.get("usd_per_h") is not None:
            cost.add_metric([], float(view["usd_per_h"]))
        yield cost
        by_tier = GaugeMetricFamily("atoll_plan_tier_cost_usd_per_hour", "What the running plan's instances "
                                    "of each price tier cost per hour (USD)", labels=["tier"])
        for tier, usd in sorted(view.get("usd_per_h_by_tier", {}).items()):
            by_tier.add_metric([tier], float(usd))
        yield by_tier
        demand = GaugeMetricFamily("atoll_demand_tokens_per_second", "Each phase's planning demand at the "
                                   "last tick (estimated arrivals where saturated)",
                                   labels=["model", "phase"])
        forecast = GaugeMetricFamily("atoll_forecast_tokens_per_second", "Each phase's forecast over the "
                                     "look-ahead at the planning level", labels=["model", "phase"])
        slo = GaugeMetricFamily("atoll_slo_attainment_ratio", "Estimated share of requests meeting both "
                                "latency budgets on the running plan, at the last tick's demand",
                                labels=["model"])
        for model, row in sorted(view.get("models", {}).items()):
            for i, phase in enumerate(("prefill", "decode")):
                if row.get("demand") is not None:
                    demand.add_metric([model, phase], float(row["demand"][i]))
                if row.get("forecast") is not None:
                    forecast.add_metric([model, phase], float(row["forecast"][i]))
            if row.get("slo_attainment") is not None:
                slo.add_metric([model], float(row["slo_attainment"]))
        yield from (demand, forecast, slo)
        last = GaugeMetricFamily("atoll_last_tick_timestamp_seconds", "When the controller's last tick ran "
                                 "(Unix time)")
        if view.get("wall_s") is not None:
            last.add_metric([], float(view["wall_s"]))
        yield last
        refused = GaugeMetricFamily("atoll_metrics_connections_refused", "Connections this endpoint closed "
                                    "unserved since it started (over its connection cap, or out of file "
                                    "descriptors)")
        refused.add_metric([], float(self.sink.refused))
        yield refused


class MetricsSink:
    """``metrics:[HOST:]PORT``: a sink that owns no workload. It serves the delivered plan on
    ``/metrics`` (Prometheus text format: ``atoll_desired_replicas``, ``atoll_plan_sequence``,
    ``atoll_desired_nodes``) and an example KEDA ScaledObject per planned workload on
    ``/scaledobjects.yaml`` (``prometheus_url``: where KEDA finds the Prometheus that scrapes this
    sink). The port is bound when the sink is made, so a port in use fails at start-up; port 0
    takes a free one (``self.port``). Delivery replaces the exported plan in one step (a scrape
    sees the previous plan or the new one); make-before-break is the controller's: it delivers
    the additions first and the removals once the additions are ready."""

    def __init__(self, port: int, host: str = METRICS_HOST, options: K8sOptions | None = None,
                 prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090", *,
                 max_connections: int = MAX_CONNECTIONS, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        check_port("metrics sink", "port", port, any_free=True, error=SinkError)
        self.options = options or K8sOptions()
        self.prometheus_url = prometheus_url
        self.lock = threading.Lock()
        self.record: PlanRecord | None = None
        self.rows: list[tuple[dict[str, str], int]] = []
        self.pools: list[tuple[dict[str, str], int]] = []
        self._seen: dict[str, dict[str, str]] = {}
        self.tick_view: dict[str, Any] = {}
        self.refused = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_PlanCollector(self))
        try:
            self._server = _BoundedServer((host, port), _handler(self, timeout_s), self, max_connections)
        except OSError as exc:
            raise SinkError(f"metrics sink: cannot listen on {host}:{port} ({_os_reason(exc)}); pick a free "
                            f"port (metrics:PORT)") from exc
        self.host, self.port = host, int(self._server.server_address[1])
        self.name = f"metrics:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)
        self._thread.start()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def scaled_objects_yaml(self) -> str:
        with self.lock:
            record = self.record
        if record is None:
            return ""
        return dump_yaml_all(scaled_objects(record, self.options, self.prometheus_url))

    def write(self, record: PlanRecord) -> SinkResult:
        with self.lock:
            rows = desired_rows(record, self.options, self._seen)
            pools = pool_rows(record)
            self.record, self.rows, self.pools = record, rows, pools
        zero = [labels["template"] for labels, n in rows if n == 0]
        return SinkResult(self.name, True, (f"http://{self.host}:{self.port}/metrics",), tuple(zero),
                          f"plan {record.sequence}: {sum(1 for _, n in rows if n)} template(s) desired, "
                          f"{len(zero)} at 0")

    def observe_tick(self, view: dict[str, Any]) -> None:
        """The controller's tick, as gauges: the plan's $/h, per model its planning demand,
        forecast and estimated SLO attainment, and the tick's wall time."""
        with self.lock:
            self.tick_view = dict(view)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _os_reason(exc: OSError) -> str:
    """An OS error as what it is (running out of descriptors is not a permissions problem)."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return (f"too many open files ({exc.strerror}): the process reached its file-descriptor limit; "
                f"raise it (ulimit -n) or lower the metrics sink's connection cap")
    return str(exc.strerror or exc)


class _BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``cap`` connections at once (more are closed
    unserved and counted), with a listen backlog sized for scrapers, and whose accept errors —
    out of descriptors included — are counted rather than printed or raised."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], sink: MetricsSink,
                 cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise SinkError(f"metrics sink: field 'max_connections' must be an integer >= 1, got {cap!r}")
        self.sink = sink
        self.slots = threading.BoundedSemaphore(cap)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.sink.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except (OSError, RuntimeError):  # no thread could be started: the slot is given back
            self.slots.release()
            self.sink.refused += 1
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.sink.refused += 1
                time.sleep(0.05)  # descriptors run out: let the scrapers' time-outs free some
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up or timed out is the client's business, not a log line


def _handler(sink: MetricsSink, timeout_s: float = CLIENT_TIMEOUT_S) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = timeout_s  # an idle or slow client is dropped, its thread and descriptor freed

        def log_message(self, format: str, *args: Any) -> None:  # scrapes every 15 s: not logged
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = sink.exposition(), CONTENT_TYPE_LATEST
            elif path == "/scaledobjects.yaml":
                body, ctype = sink.scaled_objects_yaml().encode(), "application/yaml"
            elif path in ("/", "/health"):
                body, ctype = b"ok\n", "text/plain"
            else:
                self.send_error(404, "use /metrics or /scaledobjects.yaml")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def metrics_address(arg: str) -> tuple[str, int]:
    host, sep, port = arg.rpartition(":")
    if not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise SinkError(f"metrics sink: 'metrics:{arg}' needs a port 0..65535 (metrics:PORT or "
                        f"metrics:HOST:PORT)")
    return (host if sep else METRICS_HOST), int(port)
