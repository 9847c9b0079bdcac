"""Routed disaggregation: one entry Service per model, the router behind it reaches both pools
(object graph), and the router itself takes a request through prefill then decode with the
KV-transfer parameters of vLLM's NixlConnector (run here against two fake vLLM servers)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

from atoll.control.k8s import validate_object
from atoll.control.k8s_pd_router import PREFILL_KV_PARAMS, Router, serve
from atoll.control.k8s_render import (
    COMPONENT_LABEL,
    ENTRY_LABEL,
    ROUTER_SCRIPT,
    ROUTER_SOURCE,
    K8sOptions,
    render_manifests,
)
from atoll.control.plans import PlanRecord
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

R = "aws:us-east-2"
LLAMA_P = Template(Service("Llama-3-70B", Phase.PREFILL), R, (("4xL40S", 2),),
                   (Stage(40, ("4xL40S",)), Stage(40, ("4xL40S",))), 9000.0)
LLAMA_D = Template(Service("Llama-3-70B", Phase.DECODE), R, (("8xH100", 1),), (Stage(80, ("8xH100",)),),
                   900.0)
PHI_P = Template(Service("Phi-4-14B", Phase.PREFILL), R, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 5000.0)
PHI_D = Template(Service("Phi-4-14B", Phase.DECODE), R, (("2/8xH100", 1),), (Stage(40, ("2/8xH100",)),),
                 800.0)
QWEN_P = Template(Service("Qwen3-32B", Phase.PREFILL), R, (("1xH100", 1),), (Stage(64, ("1xH100",)),), 5000.0)


def record(templates: tuple[Template, ...], owner: str = "acme-0a1b2c") -> PlanRecord:
    return PlanRecord.from_allocation(3, 0.0, Allocation.of({t.key: 2 for t in templates}), None,
                                      {t.key: t for t in templates}, {}, "test", owner=owner)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Labels of the pods of a workload that serve HTTP (LeaderWorkerSet: the leader's)."""
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["metadata"]["labels"]]
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"]["metadata"]["labels"], lwt["workerTemplate"]["metadata"]["labels"]]
    return []


def test_one_entry_service_per_model_and_the_router_reaches_both_pools() -> None:
    options = K8sOptions(namespace="llm")
    docs = render_manifests(record((LLAMA_P, LLAMA_D, PHI_P, PHI_D, QWEN_P)), options)
    for d in docs:
        validate_object(d)
        if d["kind"] != "LeaderWorkerSet":
            kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    workloads = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
    entries = [s for s in services.values() if s["metadata"]["labels"].get(ENTRY_LABEL) == "true"]
    by_model = {s["metadata"]["annotations"]["atoll.io/model-name"]: s for s in entries}
    # Qwen has only a prefill pool planned: no router (it could not serve a request whole)
    assert len(entries) == len(by_model) == 2 and set(by_model) == {"Llama-3-70B", "Phi-4-14B"}
    (script,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert script["data"][ROUTER_SCRIPT] == ROUTER_SOURCE
    for model, entry in by_model.items():
        # the entry Service selects exactly the model's router pods
        behind = [w for w in workloads if any(selects(entry["spec"]["selector"], lb) for lb in pod_labels(w))]
        assert len(behind) == 1 and behind[0]["kind"] == "Deployment"
        router = behind[0]
        assert router["metadata"]["labels"][COMPONENT_LABEL] == "router"
        pod = router["spec"]["template"]["spec"]
        assert pod["volumes"][0]["configMap"]["name"] == script["metadata"]["name"]
        (c,) = pod["containers"]
        assert c["command"] == ["python3", f"/atoll/{ROUTER_SCRIPT}"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        env = {e["name"]: e["value"] for e in c["env"]}
        reached = {}
        for side in ("PREFILL", "DECODE"):
            host = urlsplit(env[f"{side}_URL"]).hostname
            assert host is not None and host.endswith(".llm.svc")
            svc = services[host.split(".")[0]]  # the URL names a rendered Service ...
            pods = [w for w in workloads if any(selects(svc["spec"]["selector"], lb) for lb in pod_labels(w))]
            # ... which selects serving pods of this model and phase only
            assert pods and all(w["metadata"]["annotations"]["atoll.io/model-name"] == model for w in pods)
            assert {w["metadata"]["labels"]["atoll.io/phase"] for w in pods} == {side.lower()}
            reached[side] = {w["metadata"]["name"] for w in pods}
        expected = {t.key for t in (LLAMA_P, LLAMA_D, PHI_P, PHI_D) if t.service.model == model}
        assert {w["metadata"]["annotations"]["atoll.io/template-key"] for w in workloads
                if w["metadata"]["name"] in reached["PREFILL"] | reached["DECODE"]} == expected
        path = entry["metadata"]["annotations"]["atoll.io/request-path"]
        assert entry["metadata"]["name"] in path and "NIXL" in path
    # LWS workers (Ray only) are never behind a Service; leaders are
    lws = next(w for w in workloads if w["kind"] == "LeaderWorkerSet")
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert not any(selects(s["spec"]["selector"], worker) for s in services.values())


def test_aggregated_serving_has_one_service_per_model_and_no_router() -> None:
    docs = render_manifests(record((LLAMA_P, LLAMA_D, PHI_P)), K8sOptions(pd="aggregated"))
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) == 2 and all(s["metadata"]["labels"][ENTRY_LABEL] == "true" for s in services)
    assert not [d for d in docs if d["kind"] == "ConfigMap" or COMPONENT_LABEL in d["metadata"]["labels"]]
    llama = next(s for s in services if s["metadata"]["annotations"]["atoll.io/model-name"] == "Llama-3-70B")
    both = [d for d in docs if d["kind"] != "Service" and any(selects(llama["spec"]["selector"], lb)
                                                               for lb in pod_labels(d))]
    assert len(both) == 2  # the prefill and the decode workload: each serves whole requests


# ----- the router against fake vLLM servers ------------------------------------------------------
class FakeVllm(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, role: str) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.role, self.healthy = role, True
        self.bodies: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    server: FakeVllm

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        status = 200 if self.server.healthy else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append({**body, "_request_id": self.headers.get("X-Request-Id")})
        if self.server.role == "prefill":
            # what NixlConnector's request_finished returns on the prefill side
            data = json.dumps({"choices": [{"text": "x"}], "kv_transfer_params": {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
                "remote_engine_id": "engine-p", "remote_request_id": "req-p", "remote_host": "10.0.0.7",
                "remote_port": 5600, "tp_size": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': str(i)}]})}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture()
def pair() -> Iterator[tuple[FakeVllm, FakeVllm, Router]]:
    prefill, decode = FakeVllm("prefill"), FakeVllm("decode")
    router = serve(prefill.url, decode.url, port=0, host="127.0.0.1", timeout_s=10.0)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (prefill, decode, router)]
    for t in threads:
        t.start()
    yield prefill, decode, router
    for s in (prefill, decode, router):
        s.shutdown()
        s.server_close()


def call(router: Router, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", router.server_address[1], timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_request_goes_through_prefill_then_decode(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    request = {"model": "Llama-3-70B", "prompt": "hello", "max_tokens": 64, "stream": True,
               "stream_options": {"include_usage": True}}
    status, data = call(router, "POST", "/v1/completions", request)
    assert status == 200
    assert data.decode().count("data: ") == 4 and data.decode().endswith("data: [DONE]\n\n")
    (p,), (d,) = prefill.bodies, decode.bodies
    # hop 1: one token, not streamed, asking the prefill side to keep the KV for a remote decode
    assert p["max_tokens"] == 1 and p["stream"] is False and "stream_options" not in p
    assert p["kv_transfer_params"] == PREFILL_KV_PARAMS and p["prompt"] == "hello"
    # hop 2: the client's own request plus the prefill side's KV parameters
    assert d["max_tokens"] == 64 and d["stream"] is True and d["stream_options"] == {"include_usage": True}
    assert d["kv_transfer_params"]["remote_engine_id"] == "engine-p"
    kv = d["kv_transfer_params"]
    assert (kv["remote_host"], kv["remote_port"]) == ("10.0.0.7", 5600)
    assert p["_request_id"] == d["_request_id"]  # one request id across both hops
    status, _ = call(router, "POST", "/v1/chat/completions",
                     {"model": "m", "messages": [], "max_completion_tokens": 9})
    assert status == 200 and prefill.bodies[-1]["max_completion_tokens"] == 1
    assert decode.bodies[-1]["max_completion_tokens"] == 9


def test_readiness_says_whether_the_pair_works(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    status, data = call(router, "GET", "/health")
    assert status == 200 and json.loads(data) == {"ready": True, "prefill": True, "decode": True}
    decode.healthy = False
    status, data = call(router, "GET", "/health")
    assert status == 503 and json.loads(data)["decode"] is False
    assert call(router, "GET", "/live")[0] == 200  # the router itself is fine: not restarted
    prefill.shutdown()
    prefill.server_close()
    status, data = call(router, "POST", "/v1/completions", {"prompt": "x"})
    assert status == 502 and "prefill side unreachable" in json.loads(data)["error"]
    assert call(router, "POST", "/v1/embeddings", {})[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", router.server_address[1], timeout=10)
    conn.request("POST", "/v1/completions", body=b"{not json", headers={"Content-Length": "9"})
    assert conn.getresponse().status == 400
    conn.close()
