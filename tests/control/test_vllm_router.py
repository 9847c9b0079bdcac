"""vllm-router, the default prefill/decode router, for real: the installed package is the pinned
version, every flag atoll renders is one its ``--help`` lists (with the rendered values among its
choices), and the binary started with exactly the arguments atoll rendered — static
``--prefill`` / ``--decode`` URLs in place of Kubernetes pod discovery, loopback addresses in
place of the pod's — takes plain, streaming, malformed and failing requests through fake vLLM
servers that follow NixlConnector's two hops."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from control_helpers import closed_port, raw_exchange
from fake_vllm import PREFILL_ANSWER_KV, FakeVllm

from atoll.control.k8s.render import K8sOptions, render_manifests
from atoll.control.k8s.router import PREFILL_KV_PARAMS
from atoll.control.k8s.vllm import (
    VLLM_ROUTER_CHOICES,
    VLLM_ROUTER_FLAGS,
    VLLM_ROUTER_IMAGE,
    VLLM_ROUTER_LISTS,
    VLLM_ROUTER_SWITCHES,
    VLLM_ROUTER_VERSION,
    unknown_router_args,
)
from atoll.control.plans import PlanRecord
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

BINARY = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")
R = "aws:us-east-2"
PHI_P = Template(Service("Phi-4-14B", Phase.PREFILL), R, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 5000.0)
PHI_D = Template(Service("Phi-4-14B", Phase.DECODE), R, (("1xH100", 1),), (Stage(40, ("1xH100",)),), 800.0)
# flags the test replaces: discovery (no Kubernetes API here) and the addresses bound
DISCOVERY = ("--service-discovery", "--service-discovery-namespace", "--service-discovery-port",
             "--prefill-selector", "--decode-selector")


def rendered_container(options: K8sOptions) -> dict[str, Any]:
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of({PHI_P.key: 2, PHI_D.key: 2}), None,
                                        {t.key: t for t in (PHI_P, PHI_D)}, {}, "test", owner="acme-0a1b2c")
    (router,) = [d for d in render_manifests(record, options)
                 if d["kind"] == "Deployment" and d["spec"]["template"]["spec"]["containers"][0]["command"]
                 == ["vllm-router"]]
    container: dict[str, Any] = router["spec"]["template"]["spec"]["containers"][0]
    return container


def options_of(args: list[str]) -> list[tuple[str, list[str]]]:
    """(flag, values) in order."""
    out: list[tuple[str, list[str]]] = []
    for a in args:
        if a.startswith("--"):
            out.append((a, []))
        else:
            out[-1][1].append(a)
    return out


def help_text() -> str:
    assert BINARY, "vllm-router is a test dependency (pip install -e '.[dev]')"
    done = subprocess.run([BINARY, "--help"], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_installed_router_is_the_pinned_one_and_knows_every_rendered_flag() -> None:
    assert version("vllm-router") == VLLM_ROUTER_VERSION
    text = help_text()
    # the options block: "  --flag VALUE [VALUE ...]   description", "  --flag {a,b}", "  --flag"
    known = {}
    for line in text.split("\noptions:\n", 1)[1].splitlines():
        if line.startswith("  --"):
            head = re.split(r" {2,}", line.strip(), maxsplit=1)[0]
            flag, _, takes = head.partition(" ")
            known[flag] = takes
    for flag in VLLM_ROUTER_FLAGS:
        assert flag in known, f"{flag} is not in vllm-router {VLLM_ROUTER_VERSION} --help"
        takes = known[flag].strip()
        assert (takes == "") == (flag in VLLM_ROUTER_SWITCHES), (flag, takes)
        if flag in VLLM_ROUTER_LISTS:
            assert takes.endswith("...]") or "..." in takes, (flag, takes)
    for flag, choices in VLLM_ROUTER_CHOICES.items():
        offered = re.search(r"\{([a-z_,]+)\}", known[flag])
        assert offered and set(choices) <= set(offered.group(1).split(",")), flag
    # every flag of every rendering variant is in the table, hence in --help
    for options in (K8sOptions(), K8sOptions(api_key_secret="key", namespace="llm")):
        args = rendered_container(options)["args"]
        assert unknown_router_args(args) == []
        assert {f for f, _ in options_of(args)} <= set(known)
    assert unknown_router_args(["--nope", "1"]) and unknown_router_args(["--prefill-policy", "fastest"])
    assert unknown_router_args(["--port"]) and unknown_router_args(["--port", "1", "2"])


def static_args(args: list[str], prefill: list[str], decode: list[str], port: int, metrics_port: int,
                env: dict[str, str]) -> list[str]:
    """The rendered arguments with discovery replaced by static URLs (one per planned pod), the
    pod's addresses by loopback ones, and ``$(VAR)`` expanded from ``env`` (as the kubelet
    would); all else as is."""
    out: list[str] = []
    for flag, values in options_of(args):
        if flag in DISCOVERY:
            continue
        if flag in ("--host", "--prometheus-host"):
            values = ["127.0.0.1"]
        elif flag == "--port":
            values = [str(port)]
        elif flag == "--prometheus-port":
            values = [str(metrics_port)]
        out += [flag, *(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], v) for v in values)]
    for url in prefill:
        out += ["--prefill", url]
    for url in decode:
        out += ["--decode", url]
    return out


class RunningRouter:
    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.port = int(args[args.index("--port") + 1])
        self.metrics_port = int(args[args.index("--prometheus-port") + 1])
        self.log = log
        self.proc = subprocess.Popen([str(BINARY), *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get("/readiness")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"vllm-router did not become ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def get(self, path: str, port: int | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", **(headers or {})})
        return conn.getresponse()

    def raw(self, data: bytes) -> tuple[int, bytes]:
        with raw_exchange(self.port, data) as resp:
            return resp.status, resp.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Pool:
    """The fake pods of one phase (the plan has two of each): what they were sent, together."""

    def __init__(self, role: str) -> None:
        self.servers = [FakeVllm(role, tokens=5).start() for _ in range(2)]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [b for s in self.servers for b in s.bodies]

    def last(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The body and headers of the request that arrived last."""
        server = max((s for s in self.servers if s.order), key=lambda s: s.order[-1])
        return server.bodies[-1], server.headers_seen[-1]

    @property
    def mode(self) -> str:
        return self.servers[0].mode

    @mode.setter
    def mode(self, value: str) -> None:
        for s in self.servers:
            s.mode = value

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@pytest.fixture()
def running(tmp_path: Path) -> Iterator[tuple[Pool, Pool, RunningRouter]]:
    prefill, decode = Pool("prefill"), Pool("decode")
    options = K8sOptions(api_key_secret="vllm-key")
    # the container's environment as the kubelet sets it from the rendered env (the Secret's value)
    env = {e["name"]: "sk-test" for e in rendered_container(options).get("env", [])
           if e["valueFrom"]["secretKeyRef"]["name"] == "vllm-key"}
    args = static_args(rendered_container(options)["args"], [s.url for s in prefill.servers],
                       [s.url for s in decode.servers], closed_port(), closed_port(), env)
    router = RunningRouter(args, tmp_path / "router.log", env)
    yield prefill, decode, router
    router.stop()
    prefill.stop()
    decode.stop()


def test_the_rendered_router_takes_requests_through_prefill_then_decode(
        running: tuple[Pool, Pool, RunningRouter]) -> None:
    prefill, decode, router = running
    resp = router.post("/v1/completions", {"model": "Phi-4-14B", "prompt": "hello", "max_tokens": 64})
    assert resp.status == 200 and json.loads(resp.read())["choices"][0]["text"] == "01234"
    (p, ph), (d, dh) = prefill.last(), decode.last()
    # hop 1: one token, not streamed, NixlConnector's remote-decode request (the built-in's too)
    assert p["max_tokens"] == 1 and p["stream"] is False and p["kv_transfer_params"] == PREFILL_KV_PARAMS
    # hop 2: the client's request with the prefill side's parameters
    assert d["max_tokens"] == 64 and d["kv_transfer_params"] == PREFILL_ANSWER_KV and d["prompt"] == "hello"
    # the servers' API key from the Secret reaches both hops; one request id spans them
    assert ph["authorization"] == dh["authorization"] == "Bearer sk-test"
    assert ph["x-request-id"] == dh["x-request-id"]
    resp = router.post("/v1/chat/completions", {"model": "Phi-4-14B", "stream": True,
                                                "max_completion_tokens": 9,
                                                "messages": [{"role": "user", "content": "hi"}]})
    text = resp.read().decode()
    assert resp.status == 200 and text.count("data: {") == 5 and text.rstrip().endswith("data: [DONE]")
    (p, _), (d, _) = prefill.last(), decode.last()
    assert p["max_completion_tokens"] == 1 and d["max_completion_tokens"] == 9 and d["stream"] is True
    status, data = router.get("/metrics", router.metrics_port)
    assert status == 200 and b'vllm_router_pd_requests_total{route="/v1/completions"} 1' in data
    assert b'vllm_router_pd_requests_total{route="/v1/chat/completions"} 1' in data


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize("request_bytes, status", [
    (HEAD + b"Content-Length: 9\r\n\r\n{not json", 400),
    (HEAD + b"Content-Length: -1\r\n\r\n{}", 400),
    (HEAD + b"Content-Length: 2\r\n\r\n[]", 422),  # JSON, but not a request
    (b"GARBAGE\r\n\r\n", 400),
])
def test_malformed_requests_are_answered(running: tuple[Pool, Pool, RunningRouter],
                                         request_bytes: bytes, status: int) -> None:
    prefill, _, router = running
    assert router.raw(request_bytes)[0] == status
    assert not prefill.bodies


def test_a_body_over_the_rendered_limit_is_refused(running: tuple[Pool, Pool, RunningRouter]) -> None:
    prefill, _, router = running
    args = rendered_container(K8sOptions())["args"]
    limit = int(args[args.index("--max-payload-size") + 1])
    assert limit == 16 * 2**20
    body = json.dumps({"model": "m", "prompt": "x" * limit}).encode()
    request = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    with raw_exchange(router.port, request, timeout=30) as resp:
        assert resp.status == 413
    assert not prefill.bodies


def test_chunked_bodies_and_failing_servers(running: tuple[Pool, Pool, RunningRouter]) -> None:
    prefill, decode, router = running
    body = b'{"model": "m", "prompt": "chunked"}'
    status, data = router.raw(HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                              % (len(body), body))
    assert status == 200 and decode.last()[0]["prompt"] == "chunked"
    prefill.mode = "status:400"  # the client's request was wrong: passed through, not retried
    before = len(prefill.bodies)
    resp = router.post("/v1/completions", {"model": "m", "prompt": "x"})
    assert resp.status == 400 and json.loads(resp.read())["message"] == "fake prefill says 400"
    assert len(prefill.bodies) == before + 1
    prefill.mode = "status:500"
    assert router.post("/v1/completions", {"model": "m", "prompt": "x"}).status == 500
    prefill.mode = "ok"
    decode.mode = "break"  # the decode engine dies mid-answer
    resp = router.post("/v1/completions", {"model": "m", "prompt": "x", "stream": True})
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()  # the stream ends as an error, not as a clean answer
    assert b"[DONE]" not in info.value.partial
    resp = router.post("/v1/completions", {"model": "m", "prompt": "x"})
    assert resp.status == 500  # a buffered answer: an error status
    resp.read()
    decode.mode = "ok"
    assert router.post("/v1/completions", {"model": "m", "prompt": "x"}).status == 200


def test_the_dockerfile_builds_the_pinned_version() -> None:
    text = (Path(__file__).parents[2] / "control" / "data" / "vllm-router.Dockerfile").read_text()
    assert f"ARG VLLM_ROUTER_VERSION={VLLM_ROUTER_VERSION}\n" in text
    assert 'pip install --no-cache-dir "vllm-router==${VLLM_ROUTER_VERSION}"' in text
    assert VLLM_ROUTER_IMAGE.endswith(f":{VLLM_ROUTER_VERSION}")
