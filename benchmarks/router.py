"""The two prefill/decode routers side by side, as one JSON document on stdout (progress on stderr).

vllm-router (the pinned PyPI release, started with the arguments atoll renders for a plan of one
prefill and one decode pod, static ``--prefill`` / ``--decode`` URLs in place of Kubernetes pod
discovery) and the built-in router (``control/k8s/router.py`` run as its pod runs it, with the
rendered environment) each stand in front of the same fake prefill/decode pair on 127.0.0.1. The
pair speaks NixlConnector's two hops (the prefill answer carries ``kv_transfer_params``) and costs
no model time, so what is measured is the router: per (router, clients, plain or streaming),
closed-loop clients on keep-alive connections send completions for ``--seconds`` or
``--requests`` (whichever ends first) after a warm-up; reported are requests/s, latency p50/p99
(request sent to last byte read), errors, the router process's CPU per request (user + system,
all threads, from /proc) and its peak resident memory (VmHWM, reset before each run where the
kernel allows). The fake pair and the clients run in processes of their own (asyncio, raw
HTTP/1.1), the same for both routers. The machine's load average is recorded beside the figures.

    python benchmarks/router.py > benchmarks/results/router.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 16  # events per streamed answer (and characters of a plain one)
PREFILL_KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3]],
              "remote_engine_id": "engine-p", "remote_request_id": "req-p", "remote_host": "10.0.0.7",
              "remote_port": 5600, "tp_size": 1}


# ----- the fake prefill/decode pair (its own process) ---------------------------------------------
async def _serve_fake(role: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    prefill_body = json.dumps({"id": "cmpl-p", "object": "text_completion",
                               "choices": [{"index": 0, "text": "x"}],
                               "kv_transfer_params": PREFILL_KV}).encode()
    plain_body = json.dumps({"id": "cmpl-d", "object": "text_completion",
                             "choices": [{"index": 0, "text": "y" * TOKENS}]}).encode()
    event = f"data: {json.dumps({'choices': [{'index': 0, 'text': 'y'}]})}\n\n".encode()
    events = [event] * TOKENS
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                if line[:15].lower() == "content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""

            def reply(status: str, data: bytes, ctype: str = "application/json") -> None:
                head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n"
                writer.write(head.encode() + data)

            if method == "GET":
                reply("200 OK", b"{}") if path == "/health" else reply("404 Not Found", b"{}")
            elif path not in ("/v1/completions", "/v1/chat/completions"):
                reply("404 Not Found", b'{"detail": "Not Found"}')
            elif role == "prefill":
                reply("200 OK", prefill_body)
            elif b'"stream": true' in body or b'"stream":true' in body:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for e in events:
                    writer.write(b"%x\r\n%s\r\n" % (len(e), e))
                    await writer.drain()
                done = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            else:
                reply("200 OK", plain_body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _fakes() -> None:
    servers = [await asyncio.start_server(lambda r, w, role=role: _serve_fake(role, r, w), "127.0.0.1", 0,
                                          backlog=1024) for role in ("prefill", "decode")]
    print(" ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.Event().wait()


# ----- closed-loop clients (their own process) ----------------------------------------------------
async def _client(port: int, body: bytes, stream: bool, stop_at: float, budget: list[int],
                  out: list[float], errors: list[str]) -> None:
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.monotonic() < stop_at and budget[0] > 0:
        budget[0] -= 1
        t0 = time.perf_counter()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            headers = head.decode("latin-1").lower()
            m = re.search(r"content-length: *(\d+)", headers)
            if m:
                await reader.readexactly(int(m.group(1)))
            elif "transfer-encoding: chunked" in headers:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                raise ValueError("an answer with no length on a keep-alive connection")
            if status != b"200":
                errors.append(status.decode())
            else:
                out.append(time.perf_counter() - t0)
            if "connection: close" in headers:
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            errors.append(type(exc).__name__)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()


async def _load(port: int, clients: int, stream: bool, seconds: float, requests: int) -> dict[str, Any]:
    body = json.dumps({"model": "Phi-4-14B", "prompt": "The capital of France is " * 8,
                       "max_tokens": TOKENS, "stream": stream}).encode()
    out: list[float] = []
    errors: list[str] = []
    t0 = time.monotonic()
    await asyncio.gather(*(_client(port, body, stream, t0 + seconds, [requests // clients], out, errors)
                           for _ in range(clients)))
    wall = time.monotonic() - t0
    return {"ok": len(out), "errors": len(errors), "error_kinds": sorted(set(errors)), "wall_s": wall,
            "latencies": out}


# ----- the routers ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _record() -> Any:
    from atoll.control.plans import PlanRecord
    from atoll.solvers.problem import Allocation
    from atoll.solvers.types import Phase, Service, Stage, Template

    r = "aws:us-east-2"
    p = Template(Service("Phi-4-14B", Phase.PREFILL), r, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 5000.0)
    d = Template(Service("Phi-4-14B", Phase.DECODE), r, (("1xH100", 1),), (Stage(40, ("1xH100",)),), 800.0)
    return PlanRecord.from_allocation(1, 0.0, Allocation.of({p.key: 1, d.key: 1}), None,
                                      {t.key: t for t in (p, d)}, {}, "bench")


def _router_container(router: str) -> dict[str, Any]:
    from atoll.control.k8s.render import COMPONENT_LABEL, K8sOptions, render_manifests

    (dep,) = [d for d in render_manifests(_record(), K8sOptions(router=router))
              if d["kind"] == "Deployment" and d["metadata"]["labels"].get(COMPONENT_LABEL) == "router"]
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return container


def start_router(router: str, prefill: str, decode: str) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    port = free_port()
    c = _router_container(router)
    if router == "vllm-router":
        binary = shutil.which("vllm-router", path=str(Path(sys.executable).parent))
        if binary is None:
            raise SystemExit("vllm-router is not installed: pip install -e '.[dev]'")
        out: list[str] = []
        skip = False
        for a in c["args"]:  # the rendered arguments, discovery replaced by the two static URLs
            if a.startswith("--"):
                skip = a in ("--service-discovery", "--service-discovery-namespace",
                             "--service-discovery-port", "--prefill-selector", "--decode-selector")
                if not skip:
                    out.append(a)
                continue
            if skip:
                continue
            flag = out[-1]
            out.append({"--host": "127.0.0.1", "--prometheus-host": "127.0.0.1", "--port": str(port),
                        "--prometheus-port": str(free_port())}.get(flag, a))
        cmd = [binary, *out, "--prefill", prefill, "--decode", decode, "--log-level", "warning"]
        env = dict(os.environ)
    else:
        # the pod runs the ConfigMap's copy of this file with the rendered environment
        cmd = [sys.executable, str(ROOT / "control" / "k8s" / "router.py")]
        env = {**os.environ, **{e["name"]: e["value"] for e in c["env"]}, "PREFILL_URL": prefill,
               "DECODE_URL": decode, "PORT": str(port)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = "/readiness" if router == "vllm-router" else "/health"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {ready} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, port, cmd
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{router} did not become ready: {' '.join(cmd)}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, all threads


def peak_rss_mb(pid: int) -> float:
    m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else float("nan")


def reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_load(port: int, clients: int, stream: bool, seconds: float, requests: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--role", "load", "--port", str(port), "--clients",
                           str(clients), "--seconds", str(seconds), "--requests", str(requests)]
                          + (["--stream"] if stream else []), capture_output=True, text=True, check=True,
                          timeout=seconds + 120)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=("main", "fakes", "load"), default="main")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--seconds", type=float, default=8.0, help="per run, after the warm-up")
    ap.add_argument("--requests", type=int, default=6000, help="per run, at most")
    ap.add_argument("--warmup", type=int, default=200, help="requests before each run, not counted")
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args()
    if args.role == "fakes":
        asyncio.run(_fakes())
        return
    if args.role == "load":
        result = asyncio.run(_load(args.port, args.clients[0], args.stream, args.seconds, args.requests))
        print(json.dumps(result))
        return
    from atoll.control.k8s.vllm import VLLM_ROUTER_VERSION

    load_before = os.getloadavg()
    fakes = subprocess.Popen([sys.executable, __file__, "--role", "fakes"], stdout=subprocess.PIPE, text=True)
    assert fakes.stdout is not None
    p_port, d_port = fakes.stdout.readline().split()
    prefill, decode = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    runs: list[dict[str, Any]] = []
    commands: dict[str, list[str]] = {}
    try:
        for router in ("vllm-router", "builtin"):
            proc, port, cmd = start_router(router, prefill, decode)
            commands[router] = [Path(cmd[0]).name, *cmd[1:]]
            try:
                for stream in (False, True):
                    for clients in args.clients:
                        mode = "stream" if stream else "plain"
                        print(f"{router} {mode} {clients} clients ...", file=sys.stderr, flush=True)
                        run_load(port, clients, stream, 30.0, args.warmup)
                        resettable = reset_peak(proc.pid)
                        cpu0, load0 = cpu_s(proc.pid), os.getloadavg()[0]
                        r = run_load(port, clients, stream, args.seconds, args.requests)
                        cpu = cpu_s(proc.pid) - cpu0
                        lat = r.pop("latencies")
                        runs.append({
                            "router": router, "mode": mode, "clients": clients, "requests": r["ok"],
                            "errors": r["errors"], "error_kinds": r["error_kinds"],
                            "req_per_s": round(r["ok"] / r["wall_s"], 1),
                            "p50_ms": round(1000 * percentile(lat, 0.5), 2) if lat else None,
                            "p99_ms": round(1000 * percentile(lat, 0.99), 2) if lat else None,
                            "max_ms": round(1000 * max(lat), 2) if lat else None,
                            "router_cpu_ms_per_request": round(1000 * cpu / max(1, r["ok"] + r["errors"]), 3),
                            "router_peak_rss_mb": round(peak_rss_mb(proc.pid), 1),
                            "peak_rss_scope": "this run" if resettable else "since the router started",
                            "wall_s": round(r["wall_s"], 2), "load_1m_before": round(load0, 2),
                            "load_1m_after": round(os.getloadavg()[0], 2)})
                        print(f"  {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=20)
    finally:
        fakes.terminate()
        fakes.wait(timeout=20)

    def find(router: str, mode: str, clients: int) -> dict[str, Any]:
        return next(r for r in runs if (r["router"], r["mode"], r["clients"]) == (router, mode, clients))

    ratios = []
    for mode in ("plain", "stream"):
        for clients in args.clients:
            b, v = find("builtin", mode, clients), find("vllm-router", mode, clients)
            ratios.append({"mode": mode, "clients": clients,
                           "req_per_s_builtin_over_vllm_router": round(b["req_per_s"] / v["req_per_s"], 3),
                           "p99_builtin_over_vllm_router": round(b["p99_ms"] / v["p99_ms"], 3)
                           if b["p99_ms"] and v["p99_ms"] else None,
                           "cpu_per_request_builtin_over_vllm_router":
                               round(b["router_cpu_ms_per_request"] / v["router_cpu_ms_per_request"], 3)
                               if v["router_cpu_ms_per_request"] else None})
    top = max(args.clients)
    target = [r for r in ratios if r["clients"] == top]
    doc = {
        "benchmark": "router",
        "what": "vllm-router and the built-in router in front of one fake prefill/decode pair on 127.0.0.1",
        "vllm_router_version": VLLM_ROUTER_VERSION,
        "commands": commands,
        "settings": {"clients": args.clients, "seconds_per_run": args.seconds,
                     "max_requests_per_run": args.requests, "warmup_requests": args.warmup,
                     "tokens_per_answer": TOKENS,
                     "fake_pair": "asyncio HTTP/1.1, keep-alive, no model time; prefill answers "
                                  "kv_transfer_params"},
        "runs": runs,
        "ratios": ratios,
        f"builtin_p99_within_3x_of_vllm_router_at_{top}_clients": all(
            r["p99_builtin_over_vllm_router"] is not None and r["p99_builtin_over_vllm_router"] <= 3.0
            for r in target),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
