"""The prefill/decode router atoll renders in front of a disaggregated model (standard library
only: it runs on any image with Python 3.9+, and its source is shipped in a ConfigMap).

One request from a client takes two hops, the protocol of vLLM 0.33.0's NixlConnector (read
from its source: ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``; the
same flow as vLLM's own toy proxy for NIXL and the production-stack router's
"disaggregated_prefill_orchestrated" mode):

1. **prefill**: the client's body with ``max_tokens`` (and ``max_completion_tokens``) 1,
   ``stream`` false and ``kv_transfer_params = {"do_remote_decode": true, ...}`` goes to the
   prefill Service (any ready prefill pod). vLLM computes the prompt's KV, keeps its blocks and
   answers with ``kv_transfer_params`` naming its engine, blocks and NIXL side channel
   (``remote_engine_id``, ``remote_block_ids``, ``remote_host`` = that pod's IP, ``remote_port``).
2. **decode**: the client's own body plus those ``kv_transfer_params`` goes to the decode
   Service (any ready decode pod), which pulls the KV from the prefill pod named in them and
   generates; its answer (streamed or not) is the client's.

``GET /health`` is the readiness path that says the pair works: 200 only when both the prefill
and the decode Service answer their ``/health`` (so each has a ready pod); ``GET /live`` is the
router's own liveness. ``GET /v1/models`` is the decode side's. Environment: ``PREFILL_URL``,
``DECODE_URL`` (``http://host:port``), ``PORT`` (8000), ``UPSTREAM_TIMEOUT_S`` (600).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
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


class Upstream:
    """One side (prefill or decode): an http://host:port base URL."""

    def __init__(self, name: str, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{name.upper()}_URL must be http://host[:port], got {url!r}")
        self.name, self.host, self.port, self.timeout_s = name, parts.hostname, parts.port or 80, timeout_s

    def open(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
             timeout_s: float | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s or self.timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def healthy(self) -> bool:
        try:
            conn, resp = self.open("GET", "/health", None, {}, timeout_s=3.0)
        except OSError:
            return False
        try:
            resp.read()
            return resp.status == 200
        finally:
            conn.close()


class Router(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], prefill: Upstream, decode: Upstream) -> None:
        super().__init__(address, Handler)
        self.prefill, self.decode = prefill, decode


class Handler(BaseHTTPRequestHandler):
    server: Router

    def log_message(self, format: str, *args: Any) -> None:  # one line per request on stderr
        sys.stderr.write(f"pd-router {self.address_string()} {format % args}\n")

    def _reply(self, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _headers(self, request_id: str) -> dict[str, str]:
        out = {"Content-Type": "application/json", "X-Request-Id": request_id}
        for h in FORWARDED_HEADERS:
            if self.headers.get(h):
                out[h] = self.headers[h]
        return out

    def _relay(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """The upstream's answer to the client as it arrives (server-sent events included); the
        connection closes at its end (HTTP/1.0), so no length is needed."""
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
            self.end_headers()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            conn.close()

    def do_GET(self) -> None:
        if self.path == "/live":
            self._reply(200, {"status": "ok"})
        elif self.path == "/health":
            sides = {u.name: u.healthy() for u in (self.server.prefill, self.server.decode)}
            self._reply(200 if all(sides.values()) else 503, {"ready": all(sides.values()), **sides})
        elif self.path == "/v1/models":
            try:
                conn, resp = self.server.decode.open("GET", self.path, None, self._headers(uuid.uuid4().hex))
            except OSError as exc:
                self._reply(502, {"error": f"decode side unreachable: {exc}"})
                return
            self._relay(conn, resp)
        else:
            self._reply(404, {"error": f"no route {self.path}; use {', '.join(ROUTED_PATHS)}"})

    def do_POST(self) -> None:
        if self.path not in ROUTED_PATHS:
            self._reply(404, {"error": f"no route {self.path}; use {', '.join(ROUTED_PATHS)}"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        except ValueError:
            self._reply(400, {"error": "the request body is not JSON"})
            return
        if not isinstance(body, dict):
            self._reply(400, {"error": "the request body must be a JSON object"})
            return
        request_id = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        prefill = {k: v for k, v in body.items() if k != "stream_options"}
        prefill.update({"kv_transfer_params": dict(PREFILL_KV_PARAMS), "max_tokens": 1, "stream": False})
        if "max_completion_tokens" in prefill:
            prefill["max_completion_tokens"] = 1
        try:
            conn, resp = self.server.prefill.open("POST", self.path, json.dumps(prefill).encode(),
                                                  self._headers(request_id))
            try:
                data = resp.read()
            finally:
                conn.close()
        except OSError as exc:
            self._reply(502, {"error": f"prefill side unreachable: {exc}"})
            return
        if resp.status != 200:
            self._reply(502, {"error": f"prefill side answered HTTP {resp.status}",
                              "detail": data.decode(errors="replace")[:2000]})
            return
        try:
            kv = json.loads(data).get("kv_transfer_params")
        except (ValueError, AttributeError):
            self._reply(502, {"error": "prefill side answered something other than a JSON object"})
            return
        decode = dict(body)
        if kv:  # without it the decode side would compute the prompt itself: still an answer
            decode["kv_transfer_params"] = kv
        try:
            conn, resp = self.server.decode.open("POST", self.path, json.dumps(decode).encode(),
                                                 self._headers(request_id))
        except OSError as exc:
            self._reply(502, {"error": f"decode side unreachable: {exc}"})
            return
        self._relay(conn, resp)


def serve(prefill_url: str, decode_url: str, port: int = 8000, host: str = "0.0.0.0",
          timeout_s: float = 600.0) -> Router:
    """A router bound to ``host:port`` (port 0: any free port), not yet serving."""
    return Router((host, port), Upstream("prefill", prefill_url, timeout_s),
                  Upstream("decode", decode_url, timeout_s))


def main() -> int:
    try:
        router = serve(os.environ["PREFILL_URL"], os.environ["DECODE_URL"],
                       int(os.environ.get("PORT", "8000")),
                       timeout_s=float(os.environ.get("UPSTREAM_TIMEOUT_S", "600")))
    except (KeyError, ValueError) as exc:
        sys.stderr.write(f"pd-router: set PREFILL_URL and DECODE_URL to http://host:port ({exc})\n")
        return 2
    sys.stderr.write(f"pd-router: {router.server_address} -> prefill {router.prefill.host}:"
                     f"{router.prefill.port}, decode {router.decode.host}:{router.decode.port}\n")
    router.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
