"""The built-in prefill/decode router (``kubernetes.router: builtin``): standard library only, so
it runs on any image with Python 3.10+, its source shipped in a ConfigMap. The default router is
vLLM's own ``vllm-router`` (:mod:`atoll.control.k8s.render`); this one needs no extra image.

One request from a client takes two hops, the protocol of vLLM 0.33.0's NixlConnector (read
from its source: ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``; the
same flow as vLLM's own toy proxy for NIXL and ``vllm-router --vllm-pd-disaggregation``):

1. **prefill**: the client's body with ``max_tokens`` (and ``max_completion_tokens``) 1,
   ``stream`` false and ``kv_transfer_params = {"do_remote_decode": true, ...}`` goes to the
   prefill Service (any ready prefill pod). vLLM computes the prompt's KV, keeps its blocks and
   answers with ``kv_transfer_params`` naming its engine, blocks and NIXL side channel
   (``remote_engine_id``, ``remote_block_ids``, ``remote_host`` = that pod's IP, ``remote_port``).
2. **decode**: the client's own body plus those ``kv_transfer_params`` goes to the decode
   Service (any ready decode pod), which pulls the KV from the prefill pod named in them and
   generates; its answer (streamed or not) is relayed to the client as it arrives.

What a client or an upstream can do wrong, and the answer:

- a body over ``MAX_BODY_BYTES`` -> 413; bodies in flight over ``MAX_INFLIGHT_BODY_BYTES``
  together -> 503 (the pod's memory limit holds); chunked request bodies are read;
- a bad ``Content-Length`` (negative, not a number, two values) or a bad chunk -> 400; a POST
  with no length -> 411; a body that is not a JSON object -> 400; never a dropped connection;
- request line and headers not complete within ``HEADER_TIMEOUT_S``, or a body within
  ``BODY_TIMEOUT_S`` (total deadlines, not per read: a client sending a byte at a time is cut
  off too) -> 408; an idle keep-alive connection closes after ``IDLE_TIMEOUT_S``;
- more than ``MAX_CONNECTIONS`` connections at once -> 503 at once on the extra ones;
- a prefill answer 4xx -> the same status and body (the client's request was wrong); 5xx or
  unreachable -> 502 naming the side;
- the decode answer broken off midway (connection lost, upstream time-out, a short body): a
  plain answer is read whole before it is sent, so that is a 502; a streamed one (relayed as it
  arrives, an upstream's chunked framing passed through) ends without the chunked terminator,
  after an SSE ``event: error`` when it broke between chunks, so an HTTP client sees an error,
  never a clean but truncated 200.

``GET /health`` is the readiness path that says the pair works: 200 only when both the prefill
and the decode Service answer their ``/health``; ``GET /live`` is the router's own liveness;
``GET /metrics`` is Prometheus text (requests by path and status, errors by kind, latency
histograms, connections); ``GET /v1/models`` is the decode side's. Environment: ``PREFILL_URL``,
``DECODE_URL`` (``http://host:port``), ``PORT`` (8000), ``UPSTREAM_TIMEOUT_S`` (600) and the
limits above (:data:`DEFAULTS`).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

# what vLLM's NixlConnector expects on a request whose decode runs elsewhere (pull_scheduler.py)
PREFILL_KV_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False,
                                     "remote_engine_id": None, "remote_block_ids": None,
                                     "remote_host": None, "remote_port": None}
ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
FORWARDED_HEADERS = ("Authorization", "X-Request-Id")
# the limits, overridable by environment variables of the same names
DEFAULTS: dict[str, float] = {
    "MAX_BODY_BYTES": 16 * 2**20,
    "MAX_INFLIGHT_BODY_BYTES": 128 * 2**20,
    "HEADER_TIMEOUT_S": 10.0,
    "BODY_TIMEOUT_S": 60.0,
    "IDLE_TIMEOUT_S": 75.0,
    "MAX_CONNECTIONS": 1024,
    "BACKLOG": 1024,
}
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class RequestError(Exception):
    """A request the router answers with ``status`` itself (and closes when ``close``)."""

    def __init__(self, status: int, message: str, kind: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.close = status, message, kind, close


class Metrics:
    """Counters and histograms in Prometheus' text format (no client library on the image)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}
        self.errors: dict[str, int] = {}
        self.latency: dict[str, list[float]] = {}  # name -> bucket counts + [sum, count]
        self.active = 0
        self.rejected = 0

    def request(self, path: str, status: int) -> None:
        key = (path if path in ROUTED_PATHS or path in ("/health", "/live", "/metrics", "/v1/models")
               else "other", str(status))
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def observe(self, name: str, seconds: float) -> None:
        with self.lock:
            h = self.latency.setdefault(name, [0.0] * (len(LATENCY_BUCKETS) + 2))
            for i, b in enumerate(LATENCY_BUCKETS):
                if seconds <= b:
                    h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    def text(self) -> str:
        out = ["# HELP atoll_router_requests_total Requests answered, by path and HTTP status.",
               "# TYPE atoll_router_requests_total counter"]
        with self.lock:
            for (path, code), n in sorted(self.requests.items()):
                out.append(f'atoll_router_requests_total{{path="{path}",code="{code}"}} {n}')
            out += ["# HELP atoll_router_errors_total Requests that failed, by cause.",
                    "# TYPE atoll_router_errors_total counter"]
            for kind, n in sorted(self.errors.items()):
                out.append(f'atoll_router_errors_total{{kind="{kind}"}} {n}')
            out += ["# HELP atoll_router_request_duration_seconds Time from the request's headers to its "
                    "last byte answered, by stage (total, prefill, decode_first_byte).",
                    "# TYPE atoll_router_request_duration_seconds histogram"]
            for name, h in sorted(self.latency.items()):
                for i, b in enumerate(LATENCY_BUCKETS):
                    out.append(f'atoll_router_request_duration_seconds_bucket{{stage="{name}",le="{b:g}"}} '
                               f"{int(h[i])}")
                out.append(f'atoll_router_request_duration_seconds_bucket{{stage="{name}",le="+Inf"}} '
                           f"{int(h[-1])}")
                out.append(f'atoll_router_request_duration_seconds_sum{{stage="{name}"}} {h[-2]:.6f}')
                out.append(f'atoll_router_request_duration_seconds_count{{stage="{name}"}} {int(h[-1])}')
            out += ["# HELP atoll_router_connections Client connections open now.",
                    "# TYPE atoll_router_connections gauge", f"atoll_router_connections {self.active}",
                    "# HELP atoll_router_connections_rejected_total Connections answered 503 at the "
                    "connection cap.", "# TYPE atoll_router_connections_rejected_total counter",
                    f"atoll_router_connections_rejected_total {self.rejected}"]
        return "\n".join(out) + "\n"


class _Connection(http.client.HTTPConnection):
    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, bytes):
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        # the request line, headers and body in one write
        buffer = self._buffer  # type: ignore[attr-defined]
        buffer.extend((b"", b""))
        msg = b"\r\n".join(buffer) + message_body
        del buffer[:]
        self.send(msg)

    def connect(self) -> None:
        super().connect()
        # headers and body go out as two writes: without this, Nagle's algorithm holds the body
        # until the upstream's delayed ACK (~40 ms a hop on Linux)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Upstream:
    """One side (prefill or decode): an http://host:port base URL, with a pool of keep-alive
    connections (a fresh TCP connection per hop costs more CPU than the hop's own work)."""

    def __init__(self, name: str, url: str, timeout_s: float, pool_size: int = 64) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{name.upper()}_URL must be http://host[:port], got {url!r}")
        self.name, self.host, self.port, self.timeout_s = name, parts.hostname, parts.port or 80, timeout_s
        self.pool: list[http.client.HTTPConnection] = []
        self.pool_size = pool_size
        self.lock = threading.Lock()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self.lock:
            if self.pool:
                return self.pool.pop(), True
        return _Connection(self.host, self.port, timeout=self.timeout_s), False

    def give_back(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Keep ``conn`` for the next hop if its response was read whole and it stays open."""
        if resp.will_close or not resp.isclosed():
            conn.close()
            return
        with self.lock:
            if len(self.pool) < self.pool_size:
                self.pool.append(conn)
                return
        conn.close()

    def open(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
             timeout_s: float | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        for attempt in (0, 1):
            conn, reused = self._take() if timeout_s is None else (
                _Connection(self.host, self.port, timeout=timeout_s), False)
            try:
                conn.request(method, path, body=body, headers=headers)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                # a pooled connection the upstream closed while idle: once more on a new one
                if not reused or attempt:
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def healthy(self) -> bool:
        try:
            conn, resp = self.open("GET", "/health", None, {}, timeout_s=3.0)
        except (OSError, http.client.HTTPException):
            return False
        try:
            resp.read()
            return resp.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()


class Router(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = int(DEFAULTS["BACKLOG"])  # socketserver's default of 5 drops connections under load

    def __init__(self, address: tuple[str, int], prefill: Upstream, decode: Upstream,
                 limits: dict[str, float] | None = None) -> None:
        self.limits = {**DEFAULTS, **(limits or {})}
        self.request_queue_size = int(self.limits["BACKLOG"])
        super().__init__(address, Handler)
        self.prefill, self.decode = prefill, decode
        self.metrics = Metrics()
        self.slots = threading.BoundedSemaphore(int(self.limits["MAX_CONNECTIONS"]))
        self.body_lock = threading.Lock()
        self.body_bytes = 0

    def reserve_body(self, n: int) -> bool:
        with self.body_lock:
            if self.body_bytes + n > self.limits["MAX_INFLIGHT_BODY_BYTES"]:
                return False
            self.body_bytes += n
            return True

    def release_body(self, n: int) -> None:
        with self.body_lock:
            self.body_bytes -= n

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            # over the cap: answer here, in the accepting thread, and close
            with self.metrics.lock:
                self.metrics.rejected += 1
            self.metrics.request("other", 503)
            data = json.dumps({"error": "too many connections; retry"}).encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(data), data))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.metrics.lock:
            self.metrics.active += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.metrics.lock:
                self.metrics.active -= 1
            self.slots.release()


class ChunkedFraming:
    """Where a chunked body ends, fed its bytes as they arrive: the router passes an upstream's
    chunked answer through verbatim (one read and one write per burst instead of one per
    event) and still knows the answer's end, and whether it was cut off."""

    def __init__(self) -> None:
        self.skip = 0  # bytes of chunk data (and its CRLF) still to come
        self.line = bytearray()  # a size or trailer line not yet complete
        self.trailers = False
        self.done = False

    @property
    def at_boundary(self) -> bool:
        """Between chunks: a chunk of the router's own may be sent here."""
        return not self.skip and not self.line and not self.trailers and not self.done

    def feed(self, data: bytes) -> int | None:
        """The offset in ``data`` just past the body's end, or None if it goes on; ValueError
        on a malformed size line."""
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                step = min(self.skip, n - i)
                i += step
                self.skip -= step
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > 4096:
                    raise ValueError("a chunk size line of over 4096 bytes")
                return None
            line = bytes(self.line + data[i:j + 1])
            self.line.clear()
            i = j + 1
            if self.trailers:
                if not line.strip():
                    self.done = True
                    return i
                continue
            size = line.split(b";", 1)[0].strip()
            if not size or size.strip(b"0123456789abcdefABCDEF") or len(size) > 16:
                raise ValueError(f"bad chunk size line {line[:40]!r}")
            if int(size, 16) == 0:
                self.trailers = True
            else:
                self.skip = int(size, 16) + 2
        return None


class DeadlineReader:
    """The connection's buffered reader, every socket read bounded by one total deadline."""

    def __init__(self, raw: Any, sock: socket.socket) -> None:
        self.raw, self.sock, self.deadline = raw, sock, float("inf")

    def _wait(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)

    def readline(self, limit: int = -1) -> bytes:
        out = bytearray()
        while limit < 0 or len(out) < limit:
            self._wait()
            buffered = self.raw.peek(1)
            if not buffered:
                break
            want = len(buffered) if limit < 0 else min(len(buffered), limit - len(out))
            nl = buffered.find(b"\n", 0, want)
            chunk = self.raw.read(nl + 1 if nl >= 0 else want)
            out += chunk
            if nl >= 0:
                break
        return bytes(out)

    def close(self) -> None:
        self.raw.close()

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            self._wait()
            chunk = self.raw.read1(n - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)


class Handler(BaseHTTPRequestHandler):
    server: Router
    protocol_version = "HTTP/1.1"  # keep-alive: a client need not connect per request
    default_request_version = "HTTP/1.0"  # garbage gets a status line, not an HTTP/0.9 bare body

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as for upstreams
        self.reader = DeadlineReader(self.rfile, self.connection)
        self.rfile = self.reader  # type: ignore[assignment]  # http.server reads through it

    def log_message(self, format: str, *args: Any) -> None:  # only errors go to stderr
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def log_error(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"pd-router {self.address_string()} {format % args}\n")

    def handle_one_request(self) -> None:
        self.started = self.sent = False
        try:
            # an idle keep-alive connection may wait; once a request starts, its headers have a deadline
            self.reader.deadline = time.monotonic() + self.server.limits["IDLE_TIMEOUT_S"]
            self.reader._wait()
            if not self.reader.raw.peek(1):
                self.close_connection = True
                return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        self.started = True
        self.t0 = time.monotonic()
        # what a reply needs even when the request line never arrived whole
        self.command, self.path, self.requestline, self.request_version = "", "other", "", "HTTP/1.1"
        self.reader.deadline = self.t0 + self.server.limits["HEADER_TIMEOUT_S"]
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self._fail(RequestError(414, "request line too long", "bad_request", close=True))
                return
            if not self.raw_requestline.endswith(b"\n"):
                raise TimeoutError("request line incomplete") if self.raw_requestline else EOFError
            if not self.parse_request():  # it answered 400/431/505 (or 413 to Expect) itself
                if not self.sent:
                    self.server.metrics.error("bad_request")
                    self.server.metrics.request("other", 400)
                self.close_connection = True
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self._fail(RequestError(405, f"method {self.command} not allowed", "bad_request", close=True))
                return
            method()
            self.wfile.flush()
        except RequestError as exc:
            self._fail(exc)
        except TimeoutError:
            self._fail(RequestError(408, "request not received in time", "timeout", close=True))
        except EOFError:
            self.close_connection = True
        except (OSError, http.client.HTTPException) as exc:
            self.log_error("connection lost: %s", exc)
            self.close_connection = True

    def _fail(self, exc: RequestError) -> None:
        self.server.metrics.error(exc.kind)
        if exc.close:
            self.close_connection = True
        if self.sent:  # the answer has begun: nothing more can be said on this connection
            self.close_connection = True
            return
        try:
            self._reply(exc.status, {"error": exc.message}, close=exc.close)
        except OSError:
            self.close_connection = True

    def _reply(self, status: int, doc: Any, close: bool = False,
               content_type: str = "application/json", data: bytes | None = None) -> None:
        data = json.dumps(doc).encode() if data is None else data
        self.sent = True
        self.connection.settimeout(self.server.limits["BODY_TIMEOUT_S"])  # per write to a slow reader
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if close or self.close_connection:
            self.send_header("Connection", "close")
            self.close_connection = True
        self._headers_buffer.append(b"\r\n" + data)  # type: ignore[attr-defined]  # one write
        # counted before the write that answers: a client holding its answer finds it in /metrics
        self.server.metrics.request(getattr(self, "path", "other"), status)
        self.flush_headers()

    def handle_expect_100(self) -> bool:
        # a body over the limit is refused before the client sends it
        length = (self.headers.get("Content-Length") or "").strip()
        limit = int(self.server.limits["MAX_BODY_BYTES"])
        if length.isascii() and length.isdigit() and int(length) > limit:
            self._fail(RequestError(413, f"request body of {length} bytes is over this router's limit of "
                                         f"{limit}", "too_large", close=True))
            return False
        return super().handle_expect_100()

    def _headers(self, request_id: str) -> dict[str, str]:
        out = {"Content-Type": "application/json", "X-Request-Id": request_id}
        for h in FORWARDED_HEADERS:
            if self.headers.get(h):
                out[h] = self.headers[h]
        return out

    def _read_body(self) -> bytes:
        """The request body (Content-Length or chunked) within the size and time limits."""
        limit = int(self.server.limits["MAX_BODY_BYTES"])
        self.reader.deadline = time.monotonic() + self.server.limits["BODY_TIMEOUT_S"]
        te = [v.strip().lower() for v in self.headers.get_all("Transfer-Encoding") or []]
        lengths = self.headers.get_all("Content-Length") or []
        if te:
            if lengths or te != ["chunked"]:
                raise RequestError(400, "Transfer-Encoding must be 'chunked' alone, without Content-Length",
                                   "bad_request", close=True)
            return self._read_chunked(limit)
        if not lengths:
            raise RequestError(411, "a POST needs Content-Length or Transfer-Encoding: chunked",
                               "bad_request", close=True)
        text = lengths[0].strip()
        if len(set(v.strip() for v in lengths)) != 1 or not (text.isascii() and text.isdigit()):
            raise RequestError(400, f"Content-Length {', '.join(lengths)!r} is not one non-negative integer",
                               "bad_request", close=True)
        n = int(text)
        if n > limit:
            raise RequestError(413, f"request body of {n} bytes is over this router's limit of {limit}",
                               "too_large", close=True)
        if not self.server.reserve_body(n):
            raise RequestError(503, "too many request bytes in flight; retry", "overloaded", close=True)
        self.reserved = n
        data = self.rfile.read(n)
        if len(data) < n:
            raise EOFError
        return data

    def _read_chunked(self, limit: int) -> bytes:
        out = bytearray()
        while True:
            line = self.rfile.readline(1026)
            if not line.endswith(b"\n"):
                if not line:
                    raise EOFError
                raise RequestError(400, "chunk size line too long", "bad_request", close=True)
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF") or len(size_text) > 16:
                raise RequestError(400, f"bad chunk size {size_text[:20]!r}", "bad_request", close=True)
            size = int(size_text, 16)
            if size == 0:
                while self.rfile.readline(1026) not in (b"\r\n", b"\n", b""):
                    pass  # trailers: ignored
                return bytes(out)
            if len(out) + size > limit:
                raise RequestError(413, f"request body over this router's limit of {limit} bytes",
                                   "too_large", close=True)
            if not self.server.reserve_body(size):
                raise RequestError(503, "too many request bytes in flight; retry", "overloaded", close=True)
            self.reserved += size
            data = self.rfile.read(size)
            if len(data) < size:
                raise EOFError
            out += data
            if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise RequestError(400, "chunk not followed by CRLF", "bad_request", close=True)

    def _relay(self, side: Upstream, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
               stream: bool) -> None:
        """The upstream's answer to the client. A whole answer of known length (a plain
        completion) is read first and sent in one write, so a broken one becomes a 502; anything
        else (server-sent events) is relayed as it arrives in chunked encoding, and one broken
        off upstream ends without the terminating chunk."""
        self.connection.settimeout(self.server.limits["BODY_TIMEOUT_S"])  # per write to a slow reader
        ctype = resp.getheader("Content-Type", "application/json")
        if resp.length is not None and resp.length <= self.server.limits["MAX_BODY_BYTES"]:
            self._relay_whole(side, conn, resp, ctype)
        else:
            self._relay_stream(side, conn, resp, stream, ctype)

    def _relay_whole(self, side: Upstream, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                     ctype: str) -> None:
        """An answer of known length, read whole before the client gets a byte: one broken off
        is still a clean 502, and the connection goes back to the pool before the write."""
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise RequestError(502, f"{side.name} side broke off its answer: {exc!r}"[:500],
                               f"{side.name}_broken") from None
        side.give_back(conn, resp)
        self.server.metrics.observe("decode_first_byte", time.monotonic() - self.t0)
        # the whole answer is in hand: its time is observed before the one write that sends it
        self.server.metrics.observe("total", time.monotonic() - self.t0)
        self._reply(resp.status, None, content_type=ctype, data=data)

    def _relay_stream(self, side: Upstream, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                      stream: bool, ctype: str) -> None:
        """An answer relayed as it arrives, in chunked encoding; the headers go with its first
        bytes in one write. A chunked answer goes through as it came, framing and all (its
        connection pooled once read whole); another is framed here."""
        self.sent = True
        self.send_response(resp.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        first = True
        framing = ChunkedFraming() if resp.chunked else None
        try:
            while True:
                chunk, out = self._next_piece(side, conn, resp, framing)
                if first:  # the headers and the first bytes in one write
                    self.server.metrics.observe("decode_first_byte", time.monotonic() - self.t0)
                    self._headers_buffer.append(b"\r\n" + out)  # type: ignore[attr-defined]
                    out, first = b"", False
                if not self._write_piece(out, conn, framing):
                    return
                if not chunk or (framing is not None and framing.done):
                    break
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._broken_stream(side, conn, exc, stream, framing, first)
            return
        if framing is None:
            side.give_back(conn, resp)
        self.server.metrics.request(self.path, resp.status)
        self.server.metrics.observe("total", time.monotonic() - self.t0)

    @staticmethod
    def _next_piece(side: Upstream, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                    framing: ChunkedFraming | None) -> tuple[bytes, bytes]:
        """(what the upstream sent next, the bytes to write for it). An upstream that closes early
        raises IncompleteRead; a chunked answer read whole frees its connection at once, before
        the client has it all."""
        if framing is not None:
            chunk = resp.fp.read1(65536)
            if not chunk:
                raise http.client.IncompleteRead(b"")
            end = framing.feed(chunk)
            out = chunk if end is None else chunk[:end]
            if framing.done:  # read whole: free for the next hop before the client has it all
                resp._close_conn()  # type: ignore[attr-defined]  # as http.client marks it
                side.give_back(conn, resp)
            return chunk, out
        chunk = resp.read1(65536)
        if not chunk and resp.length:  # the upstream closed before its Content-Length
            raise http.client.IncompleteRead(b"", resp.length)
        return chunk, (b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b"0\r\n\r\n")

    def _write_piece(self, out: bytes, conn: http.client.HTTPConnection,
                     framing: ChunkedFraming | None) -> bool:
        """Write ``out`` (nothing: flush the buffered headers); False when the client went away,
        with the upstream connection closed unless it was already pooled."""
        try:
            if out:
                self.wfile.write(out)
            else:
                self.flush_headers()
        except OSError:  # the client went away: nothing to tell it
            if framing is None or not framing.done:  # (a whole answer's connection is pooled)
                conn.close()
            self.server.metrics.error("client_gone")
            self.close_connection = True
            return False
        return True

    def _broken_stream(self, side: Upstream, conn: http.client.HTTPConnection, exc: BaseException,
                       stream: bool, framing: ChunkedFraming | None, first: bool) -> None:
        """The upstream broke off a relayed answer: counted and logged as a 502, a stream's reader
        told why in an error event (where a chunk may begin), and the connection ended without
        the terminating chunk, so the client sees an incomplete body."""
        conn.close()
        self.server.metrics.error(f"{side.name}_broken")
        self.server.metrics.request(self.path, 502)
        self.log_error("%s side broke off its answer: %r", side.name, exc)
        data = b""
        # a stream's reader learns why before the connection ends (when a chunk may begin)
        if stream and (framing is None or framing.at_boundary):
            event = json.dumps({"error": {"message": f"{side.name} side broke off: {exc!r}"[:500],
                                          "type": "upstream_error", "code": 502}})
            data = f"event: error\ndata: {event}\n\n".encode()
            data = b"%x\r\n%s\r\n" % (len(data), data)
        try:
            if first:
                self._headers_buffer.append(b"\r\n" + data)  # type: ignore[attr-defined]
                self.flush_headers()
            elif data:
                self.wfile.write(data)
        except OSError:
            pass
        self.close_connection = True  # no terminating chunk: the client sees an incomplete body

    def do_GET(self) -> None:
        if self.path == "/live":
            self._reply(200, {"status": "ok"})
        elif self.path == "/metrics":
            self._reply(200, None, content_type="text/plain; version=0.0.4; charset=utf-8",
                        data=self.server.metrics.text().encode())
        elif self.path == "/health":
            sides = {u.name: u.healthy() for u in (self.server.prefill, self.server.decode)}
            self._reply(200 if all(sides.values()) else 503, {"ready": all(sides.values()), **sides})
        elif self.path == "/v1/models":
            try:
                conn, resp = self.server.decode.open("GET", self.path, None, self._headers(uuid.uuid4().hex))
            except (OSError, http.client.HTTPException) as exc:
                raise RequestError(502, f"decode side unreachable: {exc}", "decode_unreachable") from None
            self._relay(self.server.decode, conn, resp, False)
        else:
            raise RequestError(404, f"no route {self.path}; use {', '.join(ROUTED_PATHS)}", "not_found")

    def do_POST(self) -> None:
        self.reserved = 0
        try:
            self._route()
        finally:
            if self.reserved:
                self.server.release_body(self.reserved)

    def _route(self) -> None:
        if self.path not in ROUTED_PATHS:
            # the body is not read: the connection cannot carry another request
            raise RequestError(404, f"no route {self.path}; use {', '.join(ROUTED_PATHS)}", "not_found",
                               close=True)
        raw = self._read_body()
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise RequestError(400, "the request body is not JSON", "bad_request") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object", "bad_request")
        request_id = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        headers = self._headers(request_id)
        prefill = {k: v for k, v in body.items() if k != "stream_options"}
        prefill.update({"kv_transfer_params": dict(PREFILL_KV_PARAMS), "max_tokens": 1, "stream": False})
        if "max_completion_tokens" in prefill:
            prefill["max_completion_tokens"] = 1
        side = self.server.prefill
        try:
            conn, resp = side.open("POST", self.path, json.dumps(prefill).encode(), headers)
            try:
                data = resp.read()
            except BaseException:
                conn.close()
                raise
            side.give_back(conn, resp)
        except (OSError, http.client.HTTPException) as exc:
            raise RequestError(502, f"prefill side unreachable: {exc}", "prefill_unreachable") from None
        self.server.metrics.observe("prefill", time.monotonic() - self.t0)
        if 400 <= resp.status < 500:
            # the client's request was wrong (a bad parameter, an unknown model): say so as vLLM did
            self.server.metrics.error("prefill_4xx")
            self._reply(resp.status, None, content_type=resp.getheader("Content-Type", "application/json"),
                        data=data)
            return
        if resp.status != 200:
            raise RequestError(502, f"prefill side answered HTTP {resp.status}: "
                                    f"{data.decode(errors='replace')[:2000]}", "prefill_status")
        try:
            kv = json.loads(data).get("kv_transfer_params")
        except (ValueError, AttributeError):
            raise RequestError(502, "prefill side answered something other than a JSON object",
                               "prefill_status") from None
        decode = dict(body)
        if kv:  # without it the decode side would compute the prompt itself: still an answer
            decode["kv_transfer_params"] = kv
        del body, prefill, raw
        try:
            conn, resp = self.server.decode.open("POST", self.path, json.dumps(decode).encode(), headers)
        except (OSError, http.client.HTTPException) as exc:
            raise RequestError(502, f"decode side unreachable: {exc}", "decode_unreachable") from None
        self._relay(self.server.decode, conn, resp, bool(decode.get("stream")))


def serve(prefill_url: str, decode_url: str, port: int = 8000, host: str = "0.0.0.0",
          timeout_s: float = 600.0, limits: dict[str, float] | None = None) -> Router:
    """A router bound to ``host:port`` (port 0: any free port), not yet serving; ``limits``
    overrides :data:`DEFAULTS`."""
    return Router((host, port), Upstream("prefill", prefill_url, timeout_s),
                  Upstream("decode", decode_url, timeout_s), limits)


def main() -> int:
    try:
        limits = {k: float(os.environ[k]) for k in DEFAULTS if k in os.environ}
        router = serve(os.environ["PREFILL_URL"], os.environ["DECODE_URL"],
                       int(os.environ.get("PORT", "8000")),
                       timeout_s=float(os.environ.get("UPSTREAM_TIMEOUT_S", "600")), limits=limits)
    except (KeyError, ValueError) as exc:
        sys.stderr.write(f"pd-router: set PREFILL_URL and DECODE_URL to http://host:port, and the limits "
                         f"({', '.join(DEFAULTS)}) to numbers ({exc})\n")
        return 2
    sys.stderr.write(f"pd-router: {router.server_address} -> prefill {router.prefill.host}:"
                     f"{router.prefill.port}, decode {router.decode.host}:{router.decode.port}\n")
    router.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
