"""Small builders shared by the control tests (tiny hand-made data, fake clocks)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from atoll.forecast.workloads import DemandSeries


def tiny_series(name: str, rates: list[float], input_tokens: float = 100.0, output_tokens: float = 20.0,
                step_s: float = 60.0) -> DemandSeries:
    """A hand-made demand series: requests/s per step, constant lengths."""
    n = len(rates)
    return DemandSeries(name, step_s, np.array(rates, dtype=float), np.full(n, input_tokens),
                        np.full(n, output_tokens))


class FakeClock:
    """A settable clock for exporters and sources."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log every request to stderr."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class LoopbackHttp:
    """A threading HTTP server on a free loopback port (``url``) answering with ``handler``:
    ``start()`` serves it from a daemon thread, ``close()`` stops it (only once started)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ScriptedHttp(LoopbackHttp):
    """A loopback HTTP server whose answers a test sets: ``answer(path, query) -> (status, body)``.
    ``hang=True`` accepts connections and never answers (for time-out tests)."""

    def __init__(self, answer: Callable[[str, dict[str, list[str]]], tuple[int, bytes]]) -> None:
        self.answer = answer
        self.requests: list[str] = []
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                parsed = urllib.parse.urlparse(self.path)
                outer.requests.append(self.path)
                status, body = outer.answer(parsed.path, urllib.parse.parse_qs(parsed.query))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)

    def __enter__(self) -> ScriptedHttp:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def raw_exchange(port: int, data: bytes, *, pause: float = 0.0,
                 timeout: float = 10.0) -> Iterator[http.client.HTTPResponse]:
    """Send ``data`` as is to the loopback ``port`` (``pause`` s between bytes when > 0) and
    yield the answer with its status line and headers read; the connection closes on exit. A
    server that answers and closes before the rest is sent is fine; a dropped connection fails
    here (RemoteDisconnected), never passes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            if pause:
                for b in data:
                    sock.sendall(bytes([b]))
                    time.sleep(pause)
            else:
                sock.sendall(data)
        except OSError:
            pass  # the server may answer and close before the rest is sent
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        yield resp
    finally:
        sock.close()


def closed_port() -> int:
    """A loopback port with nothing listening (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""


def exported_values(url: str) -> dict[str, dict[str, float]]:
    """metric name -> model name -> value, as the exporter at ``url`` serves them on /metrics."""
    body = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels["model_name"]] = sample.value
    return out


def kill_9(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL ``proc`` mid-work, as a crash or an OOM kill would, and reap it; a process still
    alive after its test is killed too."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
