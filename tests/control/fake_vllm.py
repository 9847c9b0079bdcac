"""A fake vLLM server speaking the two hops of NixlConnector's protocol (vLLM 0.33.0,
``v1/nixl/pull_scheduler.py``): a prefill server answers a request carrying
``kv_transfer_params.do_remote_decode`` with the parameters naming its KV blocks and side
channel; a decode server answers the client's request (streamed as server-sent events, or
one JSON document). What it was sent is kept for the test to check.

``mode`` makes it fail the way a real server can: ``"status:<code>"`` answers that status with
an OpenAI-style error body, ``"break"`` sends two events of a stream (or the first bytes of a
JSON answer) and drops the connection, ``"hang"`` accepts the request and never answers.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFILL_ANSWER_KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
                     "remote_engine_id": "engine-p", "remote_request_id": "req-p", "remote_host": "10.0.0.7",
                     "remote_port": 5600, "tp_size": 1}
ROUTED = ("/v1/completions", "/v1/chat/completions")
SEQ = itertools.count()  # the order requests arrived in, across servers


class FakeVllm(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, role: str, keep_alive: bool = True, tokens: int = 3) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.role, self.healthy, self.mode, self.tokens = role, True, "ok", tokens
        self.keep_alive = keep_alive
        self.bodies: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.order: list[int] = []
        self.lock = threading.Lock()
        # a short poll: shutdown() waits for the serving loop's next look at its flag
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FakeVllm:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class FakeHandler(BaseHTTPRequestHandler):
    server: FakeVllm

    def setup(self) -> None:
        self.protocol_version = "HTTP/1.1" if self.server.keep_alive else "HTTP/1.0"
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: Any, content_type: str = "application/json") -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200 if self.server.healthy else 503, {})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path not in ROUTED:  # e.g. a router's tokenization probe: not this fake's
            self._send(404, {"detail": "Not Found"})
            return
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
            self.server.order.append(next(SEQ))
        mode = self.server.mode
        if mode.startswith("status:"):
            code = int(mode.split(":")[1])
            self._send(code, {"object": "error", "message": f"fake {self.server.role} says {code}",
                              "type": "BadRequestError", "param": None, "code": code})
            return
        if mode == "hang":
            time.sleep(3600)
        if self.server.role == "prefill":
            # what NixlConnector's request_finished returns on the prefill side
            self._send(200, {"id": "cmpl-p", "object": "text_completion",
                             "choices": [{"index": 0, "text": "x"}],
                             "kv_transfer_params": dict(PREFILL_ANSWER_KV)})
            return
        if not body.get("stream"):
            doc = {"id": "cmpl-d", "object": "text_completion",
                   "choices": [{"index": 0, "text": "".join(str(i) for i in range(self.server.tokens))}]}
            if mode == "break":
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:5])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send(200, doc)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        chunked = self.server.keep_alive
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            self.wfile.flush()

        for i in range(self.server.tokens):
            if mode == "break" and i == 2:
                self.connection.shutdown(socket.SHUT_RDWR)  # the engine died mid-stream
                self.close_connection = True
                return
            write(f"data: {json.dumps({'choices': [{'index': 0, 'text': str(i)}]})}\n\n".encode())
        write(b"data: [DONE]\n\n")
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
