"""The one HTTP GET the metrics sources make: a total deadline and a size cap (see
:mod:`atoll.control.metrics`), and the checks of a source's URL and limits."""

from __future__ import annotations

import http.client
import math
import socket
import threading
import urllib.parse

from atoll.control.metrics.snapshot import DEFAULT_MAX_BYTES, MetricsUnavailable


def fetch(url: str, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
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


def check_url(url: str, owner: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{owner}: field 'url' must be an http(s) URL such as http://127.0.0.1:9090, "
                         f"got {url!r}")
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"{owner}: field 'url' has a bad port ({exc}), got {url!r}") from exc
    return url.rstrip("/")


def check_limits(timeout: float, max_bytes: int, owner: str) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"{owner}: field 'timeout' must be > 0 seconds, got {timeout!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ValueError(f"{owner}: field 'max_bytes' must be an integer >= 1024, got {max_bytes!r}")
