"""Routed disaggregation: one entry Service per model, the router behind it reaches both pools
(object graph), and the router itself takes a request through prefill then decode with the
KV-transfer parameters of vLLM's NixlConnector (run here against two fake vLLM servers)."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from control_helpers import raw_exchange
from fake_vllm import PREFILL_ANSWER_KV, FakeVllm
from prometheus_client.parser import text_string_to_metric_families

from atoll.control.k8s.apply import K8sApplySink, K8sManifestSink, KubeObjects, validate_object
from atoll.control.k8s.render import (
    COMPONENT_LABEL,
    ENTRY_LABEL,
    ROUTER_SCRIPT,
    ROUTER_SOURCE,
    K8sOptions,
    k8s_options,
    render_manifests,
    request_timeout_s,
    router_name,
    vllm_router_args,
)
from atoll.control.k8s.router import PREFILL_KV_PARAMS, ChunkedFraming, Router, serve
from atoll.control.k8s.vllm import VLLM_ROUTER_IMAGE
from atoll.control.plans import PlanRecord, SinkError
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


def _selector_args(args: list[str], flag: str) -> dict[str, str]:
    i = args.index(flag) + 1
    out = {}
    while i < len(args) and not args[i].startswith("--"):
        k, v = args[i].split("=", 1)
        out[k] = v
        i += 1
    return out


@pytest.mark.parametrize("router", ["vllm-router", "builtin"])
def test_one_entry_service_per_model_and_the_router_reaches_both_pools(router: str) -> None:
    options = K8sOptions(namespace="llm", router=router)
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
    scripts = [d for d in docs if d["kind"] == "ConfigMap"]
    if router == "builtin":
        assert len(scripts) == 1 and scripts[0]["data"][ROUTER_SCRIPT] == ROUTER_SOURCE
        assert not [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    else:
        assert not scripts
    for model, entry in by_model.items():
        # the entry Service selects exactly the model's router pods
        behind = [w for w in workloads if any(selects(entry["spec"]["selector"], lb) for lb in pod_labels(w))]
        assert len(behind) == 1 and behind[0]["kind"] == "Deployment"
        dep = behind[0]
        assert dep["metadata"]["labels"][COMPONENT_LABEL] == "router"
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        reached = {}
        for side in ("prefill", "decode"):
            if router == "builtin":
                assert pod["volumes"][0]["configMap"]["name"] == scripts[0]["metadata"]["name"]
                assert c["command"] == ["python3", f"/atoll/{ROUTER_SCRIPT}"]
                assert c["readinessProbe"]["httpGet"]["path"] == "/health"
                env = {e["name"]: e["value"] for e in c["env"]}
                assert env["MAX_BODY_BYTES"] == str(16 * 2**20)  # router_max_body_mb
                host = urlsplit(env[f"{side.upper()}_URL"]).hostname
                assert host is not None and host.endswith(".llm.svc")
                selector = services[host.split(".")[0]]["spec"]["selector"]  # the URL names a Service
            else:
                assert c["command"] == ["vllm-router"] and c["image"] == VLLM_ROUTER_IMAGE
                assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
                assert c["args"][c["args"].index("--service-discovery-namespace") + 1] == "llm"
                selector = _selector_args(c["args"], f"--{side}-selector")
                # the pods it discovers are the ones the phase's Service selects
                phase_services = [sv for sv in services.values() if sv["spec"]["selector"] == selector]
                assert len(phase_services) == 1
            pods = [w for w in workloads if any(selects(selector, lb) for lb in pod_labels(w))]
            # ... serving pods of this model and phase only
            assert pods and all(w["metadata"]["annotations"]["atoll.io/model-name"] == model for w in pods)
            assert {w["metadata"]["labels"]["atoll.io/phase"] for w in pods} == {side}
            reached[side] = {w["metadata"]["name"] for w in pods}
        expected = {t.key for t in (LLAMA_P, LLAMA_D, PHI_P, PHI_D) if t.service.model == model}
        assert {w["metadata"]["annotations"]["atoll.io/template-key"] for w in workloads
                if w["metadata"]["name"] in reached["prefill"] | reached["decode"]} == expected
        path = entry["metadata"]["annotations"]["atoll.io/request-path"]
        assert entry["metadata"]["name"] in path and "NIXL" in path
        if router == "vllm-router":
            # it may watch pods in its namespace, nothing more
            account = pod["serviceAccountName"]
            (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == account]
            pods_rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            assert role["rules"] == [pods_rule]
            (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == account]
            assert binding["roleRef"]["name"] == account
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]
            assert [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account]
            (metrics,) = [sv for sv in services.values() if sv is not entry and
                          sv["spec"]["selector"] == entry["spec"]["selector"]]
            ann = metrics["metadata"]["annotations"]
            assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "29000"
            assert metrics["spec"]["ports"][0]["targetPort"] == "metrics"
            assert {"name": "metrics", "containerPort": 29000, "protocol": "TCP"} in c["ports"]
            # each plan here has two instances per phase: the load-aware policies
            assert c["args"][c["args"].index("--prefill-policy") + 1] == "cache_aware"
            assert c["args"][c["args"].index("--decode-policy") + 1] == "power_of_two"
    # LWS workers (Ray only) are never behind a Service; leaders are
    lws = next(w for w in workloads if w["kind"] == "LeaderWorkerSet")
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert not any(selects(s["spec"]["selector"], worker) for s in services.values())


def test_router_settings() -> None:
    one = PlanRecord.from_allocation(1, 0.0, Allocation.of({PHI_P.key: 1, PHI_D.key: 3}), None,
                                     {t.key: t for t in (PHI_P, PHI_D)}, {}, "test")
    options = K8sOptions(api_key_secret="vllm-key", router_max_tokens=1000)
    docs = render_manifests(one, options)
    (router,) = [d for d in docs if d["kind"] == "Deployment" and COMPONENT_LABEL in d["metadata"]["labels"]]
    (c,) = router["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--prefill-policy") + 1] == "round_robin"  # one prefill pod planned
    assert args[args.index("--decode-policy") + 1] == "power_of_two"
    # Phi-4's SLO: TTFT 1200 ms + 1000 tokens x 60 ms, twice over
    assert args[args.index("--request-timeout-secs") + 1] == "123"  # ceil(2 x 61.2 s)
    assert request_timeout_s("Acme-8B", options) == options.startup_timeout_s  # no SLO known here
    # the servers' API key: from the Secret on every vLLM pod, and to the router
    assert args[args.index("--api-key") + 1] == "$(OPENAI_API_KEY)"
    key = {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}}
    assert c["env"] == [{**key, "name": "OPENAI_API_KEY"}]  # what vllm-router sends the servers
    for d in docs:
        if d["kind"] == "Deployment" and d is not router:
            assert key in d["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "--api-key" not in vllm_router_args(K8sOptions(), "Phi-4-14B", "", 1, 1)
    assert K8sOptions(router="builtin").router_image == "python:3.12-slim"
    assert K8sOptions(router_image="reg.local/vllm-router:1").router_image == "reg.local/vllm-router:1"
    assert k8s_options({"router": "builtin"}).router == "builtin"
    with pytest.raises(SinkError, match="field 'router' must be one of vllm-router, builtin"):
        k8s_options({"router": "envoy"}, "fleet.yaml: kubernetes")
    with pytest.raises(SinkError, match="api_key_secret"):
        K8sOptions(api_key_secret="Not A Name")


def test_aggregated_serving_has_one_service_per_model_and_no_router() -> None:
    docs = render_manifests(record((LLAMA_P, LLAMA_D, PHI_P)), K8sOptions(pd="aggregated"))
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) == 2 and all(s["metadata"]["labels"][ENTRY_LABEL] == "true" for s in services)
    assert not [d for d in docs if d["kind"] == "ConfigMap" or COMPONENT_LABEL in d["metadata"]["labels"]]
    llama = next(s for s in services if s["metadata"]["annotations"]["atoll.io/model-name"] == "Llama-3-70B")
    both = [d for d in docs if d["kind"] != "Service" and any(selects(llama["spec"]["selector"], lb)
                                                               for lb in pod_labels(d))]
    assert len(both) == 2  # the prefill and the decode workload: each serves whole requests


# ----- the built-in router against fake vLLM servers ----------------------------------------------
@pytest.fixture(params=[True, False], ids=["upstream-keepalive", "upstream-close"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[FakeVllm, FakeVllm, Router]]:
    prefill = FakeVllm("prefill", keep_alive=request.param).start()
    decode = FakeVllm("decode", keep_alive=request.param).start()
    router = serve(prefill.url, decode.url, port=0, host="127.0.0.1", timeout_s=10.0,
                   limits={"MAX_BODY_BYTES": 4096, "HEADER_TIMEOUT_S": 0.5, "BODY_TIMEOUT_S": 0.5,
                           "MAX_CONNECTIONS": 8})
    thread = threading.Thread(target=router.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield prefill, decode, router
    for s in (prefill, decode, router):
        s.shutdown()
        s.server_close()


def call(router: Router, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", router.server_address[1], timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def raw(router: Router, data: bytes, pause: float = 0.0) -> http.client.HTTPResponse:
    """Send ``data`` as is (``pause`` s between bytes when > 0) and read the answer: a dropped
    connection fails the test here (RemoteDisconnected), never passes it."""
    with raw_exchange(router.server_address[1], data, pause=pause) as resp:
        resp.body = resp.read()  # type: ignore[attr-defined]
    return resp


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_a_request_goes_through_prefill_then_decode(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    request = {"model": "Llama-3-70B", "prompt": "hello", "max_tokens": 64, "stream": True,
               "stream_options": {"include_usage": True}}
    status, data = call(router, "POST", "/v1/completions", request, {"Authorization": "Bearer k"})
    assert status == 200
    assert data.decode().count("data: ") == 4 and data.decode().endswith("data: [DONE]\n\n")
    (p,), (d,) = prefill.bodies, decode.bodies
    # hop 1: one token, not streamed, asking the prefill side to keep the KV for a remote decode
    assert p["max_tokens"] == 1 and p["stream"] is False and "stream_options" not in p
    assert p["kv_transfer_params"] == PREFILL_KV_PARAMS and p["prompt"] == "hello"
    # hop 2: the client's own request plus the prefill side's KV parameters
    assert d["max_tokens"] == 64 and d["stream"] is True and d["stream_options"] == {"include_usage": True}
    assert d["kv_transfer_params"] == PREFILL_ANSWER_KV
    (ph,), (dh,) = prefill.headers_seen, decode.headers_seen
    assert ph["x-request-id"] == dh["x-request-id"]  # one request id across both hops
    assert ph["authorization"] == dh["authorization"] == "Bearer k"
    status, data = call(router, "POST", "/v1/chat/completions",
                        {"model": "m", "messages": [], "max_completion_tokens": 9})
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "012"
    assert prefill.bodies[-1]["max_completion_tokens"] == 1
    assert decode.bodies[-1]["max_completion_tokens"] == 9


def test_keep_alive_and_chunked_request_bodies(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    conn = http.client.HTTPConnection("127.0.0.1", router.server_address[1], timeout=10)
    for i in range(3):  # one connection, three requests; the third body chunked
        body = json.dumps({"prompt": f"p{i}", "max_tokens": 4}).encode()
        if i == 2:
            conn.request("POST", "/v1/completions", body=iter([body[:7], body[7:]]),
                         headers={"Content-Type": "application/json"}, encode_chunked=True)
        else:
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["choices"][0]["text"] == "012"
    conn.close()
    assert [b["prompt"] for b in decode.bodies] == ["p0", "p1", "p2"]
    # a chunked body with chunk extensions and a trailer, sent by hand
    body = b'{"prompt": "hand"}'
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\n" + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] +
               b"\r\n0\r\nX-Trailer: t\r\n\r\n")
    assert raw(router, chunked).status == 200 and decode.bodies[-1]["prompt"] == "hand"


def test_a_body_over_the_limit_is_refused_with_413(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, _, router = pair
    big = json.dumps({"prompt": "x" * 5000}).encode()
    assert raw(router, post("/v1/completions", big)).status == 413
    chunks = b"".join(b"400\r\n" + b"x" * 1024 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n"
    resp = raw(router, b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
    assert resp.status == 413
    # a client that asks first (Expect: 100-continue) is told before it sends the body
    resp = raw(router, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 999999\r\n"
                       b"Expect: 100-continue\r\n\r\n")
    assert resp.status == 413
    assert not prefill.bodies  # nothing over the limit reached vLLM


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}", 400),
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
    (b"DELETE /v1/completions HTTP/1.1\r\n\r\n", 405),
    (post("/v1/completions", b"{not json"), 400),
    (post("/v1/completions", b"[1, 2]"), 400),
    (post("/v1/embeddings", b"{}"), 404),
])
def test_malformed_requests_are_answered(pair: tuple[FakeVllm, FakeVllm, Router], request_bytes: bytes,
                                         status: int) -> None:
    prefill, _, router = pair
    resp = raw(router, request_bytes)
    assert resp.status == status
    assert not prefill.bodies


def test_slow_headers_and_bodies_time_out_with_408(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, _, router = pair
    # a byte every 0.05 s keeps each read short, but the headers' total deadline (0.5 s) passes
    resp = raw(router, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n",
               pause=0.05)
    assert resp.status == 408
    # a body that stops arriving
    with raw_exchange(router.server_address[1],
                      b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":") as resp:
        assert resp.status == 408
    assert not prefill.bodies


def test_connections_over_the_cap_get_503(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    _, _, router = pair
    idle = [socket.create_connection(("127.0.0.1", router.server_address[1]), timeout=10) for _ in range(8)]
    try:
        resp = raw(router, post("/v1/completions", b"{}"))
        assert resp.status == 503 and resp.getheader("Retry-After") == "1"
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while router.metrics.active and time.monotonic() < deadline:  # the idle ones are released
        time.sleep(0.02)
    assert call(router, "POST", "/v1/completions", {"prompt": "x"})[0] == 200


def test_a_prefill_4xx_reaches_the_client_as_it_was(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    prefill.mode = "status:400"
    status, data = call(router, "POST", "/v1/completions", {"prompt": "x", "max_tokens": -3})
    assert status == 400 and json.loads(data)["message"] == "fake prefill says 400"
    prefill.mode = "status:500"
    status, data = call(router, "POST", "/v1/completions", {"prompt": "x"})
    assert status == 502 and "prefill side answered HTTP 500" in json.loads(data)["error"]
    assert not decode.bodies


@pytest.mark.parametrize("stream", [True, False])
def test_a_decode_failure_midway_ends_the_response_as_an_error(stream: bool) -> None:
    prefill = FakeVllm("prefill").start()
    decode = FakeVllm("decode", keep_alive=True, tokens=5).start()
    router = serve(prefill.url, decode.url, port=0, host="127.0.0.1", timeout_s=10.0)
    threading.Thread(target=router.serve_forever, args=(0.05,), daemon=True).start()
    try:
        decode.mode = "break"
        conn = http.client.HTTPConnection("127.0.0.1", router.server_address[1], timeout=10)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "stream": stream}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if stream:
            assert resp.status == 200  # the status was sent before the failure
            with pytest.raises(http.client.IncompleteRead) as info:
                resp.read()
            partial = info.value.partial.decode()
            assert partial.count("data: {\"choices\"") == 2 and "event: error" in partial
            assert "[DONE]" not in partial
        else:  # a plain answer is read whole before it is sent: its failure is a status
            assert resp.status == 502 and "decode side broke off" in json.loads(resp.read())["error"]
        conn.close()
        decode.mode = "ok"
        assert call(router, "POST", "/v1/completions", {"prompt": "x", "stream": stream})[0] == 200
        assert router.metrics.errors == {"decode_broken": 1}
    finally:
        for s in (prefill, decode, router):
            s.shutdown()
            s.server_close()


def test_readiness_says_whether_the_pair_works(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, decode, router = pair
    status, data = call(router, "GET", "/health")
    assert status == 200 and json.loads(data) == {"ready": True, "prefill": True, "decode": True}
    decode.healthy = False
    status, data = call(router, "GET", "/health")
    assert status == 503 and json.loads(data)["decode"] is False
    assert call(router, "GET", "/live")[0] == 200  # the router itself is fine: not restarted
    assert json.loads(call(router, "GET", "/v1/models")[1])["data"][0]["id"] == "m"
    prefill.shutdown()
    prefill.server_close()
    status, data = call(router, "POST", "/v1/completions", {"prompt": "x"})
    assert status == 502 and "prefill side unreachable" in json.loads(data)["error"]


def test_the_listen_backlog_holds_a_burst_of_connections(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    _, _, router = pair
    # stop accepting, then connect more clients than socketserver's default backlog (5) holds:
    # every connect completes in the kernel's queue at once (with a backlog of 5 the extra SYNs
    # are dropped and the connects wait for retransmits)
    router.shutdown()
    socks = []
    for _ in range(64):
        s = socket.socket()
        s.settimeout(0.5)
        s.connect(("127.0.0.1", router.server_address[1]))
        socks.append(s)
    threading.Thread(target=router.serve_forever, args=(0.05,), daemon=True).start()
    for s in socks[:6]:
        s.sendall(post("/v1/completions", b'{"prompt": "x"}'))
        s.settimeout(10)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        assert resp.status in (200, 503)  # 503: over this fixture's cap of 8 connections
        resp.read()
    for s in socks:
        s.close()


def test_metrics_count_requests_errors_and_latency(pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    prefill, _, router = pair
    for _ in range(3):
        assert call(router, "POST", "/v1/completions", {"prompt": "x"})[0] == 200
    prefill.mode = "status:404"
    assert call(router, "POST", "/v1/chat/completions", {"messages": []})[0] == 404
    assert raw(router, b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status == 400
    status, data = call(router, "GET", "/metrics")
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(data.decode()) for s in fam.samples}
    assert samples[("atoll_router_requests_total", (("code", "200"), ("path", "/v1/completions")))] == 3
    assert samples[("atoll_router_requests_total", (("code", "404"), ("path", "/v1/chat/completions")))] == 1
    assert samples[("atoll_router_errors_total", (("kind", "prefill_4xx"),))] == 1
    assert samples[("atoll_router_errors_total", (("kind", "bad_request"),))] == 1
    assert samples[("atoll_router_request_duration_seconds_count", (("stage", "total"),))] == 3
    assert samples[("atoll_router_request_duration_seconds_count", (("stage", "prefill"),))] == 4
    inf = ("atoll_router_request_duration_seconds_bucket", (("le", "+Inf"), ("stage", "total")))
    assert samples[inf] == 3


def test_the_manifest_sink_writes_vllm_router_with_its_rbac_by_default(tmp_path: Path) -> None:
    result = K8sManifestSink(tmp_path / "k8s", K8sOptions(kube_version="1.33")).write(
        record((LLAMA_P, LLAMA_D, PHI_P, PHI_D)))
    assert result.ok
    files = {Path(f).name for f in result.written}
    for model in ("Llama-3-70B", "Phi-4-14B"):
        name = router_name(model, "acme-0a1b2c")
        kinds = ("deployment", "serviceaccount", "role", "rolebinding")
        assert {f"{name}.{kind}.yaml" for kind in kinds} <= files
    kustomization = yaml.safe_load((tmp_path / "k8s" / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == files - {"kustomization.yaml"}
    assert not [f for f in files if f.endswith(".configmap.yaml")]


class FakeApiServer(ThreadingHTTPServer):
    """Records what the kubernetes client asks; answers a PATCH with the object as an API server
    would (resource quantities as strings), a list with no items."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeApiHandler)
        self.calls: list[tuple[str, str]] = []


class FakeApiHandler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PATCH(self) -> None:
        self.server.calls.append(("PATCH", self.path.split("?")[0]))
        def served(node: Any, key: str = "") -> Any:
            if isinstance(node, dict):
                return {k: str(v) if key in ("limits", "requests") else served(v, k) for k, v in node.items()}
            return [served(v) for v in node] if isinstance(node, list) else node

        self._answer(json.dumps(served(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))).encode())

    def do_GET(self) -> None:
        self.server.calls.append(("GET", self.path.split("?")[0]))
        self._answer(b'{"items": []}')


def test_k8s_apply_sends_the_router_identity_first_through_the_real_client() -> None:
    from kubernetes import client

    api = FakeApiServer()
    threading.Thread(target=api.serve_forever, args=(0.05,), daemon=True).start()
    try:
        cfg = client.Configuration(host=f"http://127.0.0.1:{api.server_address[1]}")
        cfg.client_side_validation = False
        sink = K8sApplySink(K8sOptions(namespace="llm"), apply=True,
                            api_factory=lambda: KubeObjects(client.ApiClient(cfg)))
        assert sink.write(record((PHI_P, PHI_D))).ok
    finally:
        api.shutdown()
        api.server_close()
    name = router_name("Phi-4-14B", "acme-0a1b2c")
    patched = [p for m, p in api.calls if m == "PATCH"]
    identity = [f"/api/v1/namespaces/llm/serviceaccounts/{name}",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/llm/roles/{name}",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/llm/rolebindings/{name}"]
    assert set(identity) <= set(patched)
    router = patched.index(f"/apis/apps/v1/namespaces/llm/deployments/{name}")
    assert all(patched.index(p) < router for p in identity)  # the pod's account exists before it
    listed = {p for m, p in api.calls if m == "GET"}
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/llm"
    assert {"/api/v1/namespaces/llm/serviceaccounts", f"{rbac}/roles", f"{rbac}/rolebindings"} <= listed


def test_chunked_framing_finds_the_end_however_the_bytes_arrive() -> None:
    body = (b"5;ext=1\r\nhello\r\n" + b"1a\r\n" + b"x" * 26 + b"\r\n" + b"0\r\nX-Trailer: t\r\n\r\n")
    rng = random.Random(7)
    for _ in range(200):  # any split of the same bytes: the same end, found in the last piece
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 8)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        framing, ends = ChunkedFraming(), []
        for piece in pieces:
            ends.append(framing.feed(piece))
        assert ends[:-1] == [None] * (len(pieces) - 1) and ends[-1] == len(pieces[-1]) and framing.done
    cut = ChunkedFraming()
    assert cut.feed(body[:20]) is None and not cut.done and not cut.at_boundary  # mid-chunk
    between = ChunkedFraming()
    assert between.feed(b"5\r\nhello\r\n") is None and between.at_boundary
    for bad in (b"zz\r\n", b"-5\r\n", b"0x5\r\n", b"\r\n"):
        with pytest.raises(ValueError):
            ChunkedFraming().feed(bad)


def test_a_streamed_answer_passes_through_and_its_connection_is_reused(
        pair: tuple[FakeVllm, FakeVllm, Router]) -> None:
    _, decode, router = pair
    for _ in range(3):
        status, data = call(router, "POST", "/v1/completions", {"prompt": "x", "stream": True})
        assert status == 200 and data.decode().count("data: ") == 4
    # a keep-alive upstream's connection goes back to the pool after each whole answer
    assert len(router.decode.pool) == (1 if decode.keep_alive else 0)
