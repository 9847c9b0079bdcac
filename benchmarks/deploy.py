"""Figures of the deployable output, as one JSON document on stdout (progress on stderr).

1. ``readme``: the README's own example, run as a user runs it: ``atoll replay`` (three ServeGen
   workloads as Phi-4-14B, GPT-OSS-20B, Qwen3-32B, 60x, day 11) in the background and two
   ``atoll control --scenario core --sink k8s:DIR --kube-version K --once --json`` ticks (the
   first reads counters, the second plans). Reported from the folder the sink wrote: objects per
   kind, each checked again against Kubernetes K's schemas and the LWS CRD
   (:func:`atoll.control.k8s.validate.api_problems`), the ``vllm serve`` commands and their flags
   against the pinned vLLM's table, the request path of each model's entry Service, the nodes per
   pool.
2. ``extended``: the extended scenario's plan under ``runtime: vllm`` (ample availability, even
   mix), rendered with ``pd: disaggregated``; the same figures.
3. ``scrape``: ``atoll control --sink metrics:PORT`` (a real controller process ticking every 5
   trace-minutes against the same replay) scraped over HTTP as Prometheus or KEDA would, parsed
   with prometheus_client's text parser: the desired replicas per template and the plan sequence,
   and ``/scaledobjects.yaml`` (each checked against KEDA v2.20.2's ScaledObject CRD).

    python benchmarks/deploy.py [--kube-version 1.33] > benchmarks/results/deploy.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' http_ready

import yaml  # noqa: E402
from http_ready import answers_within  # noqa: E402

from atoll.control.k8s.render import ENTRY_LABEL, POOL_NODES_ANNOTATION, K8sOptions, render_manifests  # noqa: E402
from atoll.control.k8s.scale import read_desired  # noqa: E402
from atoll.control.k8s.validate import api_problems, kube_version  # noqa: E402
from atoll.control.k8s.vllm import (  # noqa: E402
    VLLM_ENV,
    VLLM_IMAGE,
    VLLM_ROUTER_VERSION,
    VLLM_SERVE_FLAGS,
    VLLM_VERSION,
    known_env,
    unknown_router_args,
    unknown_serve_args,  # noqa: E402
)
from atoll.control.plans import PlanRecord  # noqa: E402

ATOLL = str(Path(sys.executable).with_name("atoll"))
MODELS = "Phi-4-14B,GPT-OSS-20B,Qwen3-32B"
WORKLOADS = "servegen:m-large,servegen:m-mid,servegen:m-small"


def log(msg: str) -> None:
    print(f"[deploy] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float) -> None:
    if not answers_within(url, timeout_s, poll_s=0.5, request_timeout_s=2):
        raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
    return []


def summarize(docs: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """Objects per kind, API-server checks, the serve commands against the pinned table, the
    request paths, the nodes per pool."""
    kinds = Counter(d["kind"] for d in docs)
    problems = {f"{d['kind']}/{d['metadata']['name']}": api_problems(d, version) for d in docs}
    commands, flags, envs, unknown, roles = 0, Counter(), set(), [], Counter()
    selectors: Counter[str] = Counter()
    for d in docs:
        for spec in pod_specs(d):
            selectors.update(spec.get("nodeSelector", {}).keys())
            for c in spec["containers"]:
                envs.update(e["name"] for e in c.get("env", []) if "atoll.io/template-key" in
                            d["metadata"].get("annotations", {}))
                script = c["command"][-1]
                if "vllm serve" not in script:
                    continue
                args = shlex.split(script[script.index("vllm serve"):])
                commands += 1
                flags.update(a for a in args if a.startswith("--"))
                if "--kv-transfer-config" in args:
                    roles[json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"]] += 1
                unknown += unknown_serve_args(shlex.join(args))
    entries = [d for d in docs
               if d["kind"] == "Service" and d["metadata"]["labels"].get(ENTRY_LABEL) == "true"]
    routers = [c for d in docs if d["kind"] == "Deployment"
               for c in d["spec"]["template"]["spec"]["containers"] if c["command"] == ["vllm-router"]]
    pools: dict[str, int] = {}
    for d in docs:
        pools.update(json.loads(d["metadata"].get("annotations", {}).get(POOL_NODES_ANNOTATION, "{}")))
    return {
        "objects": dict(sorted(kinds.items())), "objects_total": len(docs),
        "kube_version": version, "objects_valid": sum(1 for p in problems.values() if not p),
        "problems": {k: v for k, v in problems.items() if v},
        "vllm": {"version": VLLM_VERSION, "image": VLLM_IMAGE, "serve_commands": commands,
                 "flags": dict(sorted(flags.items())),
                 "flags_in_table": sorted(f for f in flags if f in VLLM_SERVE_FLAGS),
                 "flags_not_in_table": sorted(f for f in flags if f not in VLLM_SERVE_FLAGS),
                 "problems": unknown, "kv_roles": dict(sorted(roles.items())),
                 "pipelined_decode_on_kv_both": sum(1 for d in docs if "atoll.io/vllm-caveat" in
                                                    d["metadata"].get("annotations", {})),
                 "env": sorted(envs),
                 "env_unknown": sorted(e for e in envs if not known_env(e)),
                 "vllm_env": sorted(e for e in envs if e in VLLM_ENV)},
        "entry_services": len(entries),
        "vllm_router": {"version": VLLM_ROUTER_VERSION, "deployments": len(routers),
                        "problems": [p for c in routers for p in unknown_router_args(c["args"])]},
        "request_paths": {e["metadata"]["annotations"]["atoll.io/model-name"]:
                          e["metadata"]["annotations"]["atoll.io/request-path"] for e in entries},
        "node_selector_keys": dict(sorted(selectors.items())),
        "nodes_per_pool": dict(sorted(pools.items())),
        "nodes_total": sum(pools.values()),
    }


def run(cmd: list[str], timeout_s: float = 900.0) -> dict[str, Any]:
    log("$ " + " ".join(cmd))
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{cmd[1]} failed ({done.returncode}): {done.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    doc["_seconds"] = round(time.perf_counter() - t, 2)
    return doc


def readme_example(work: Path, port: int, version: str) -> tuple[dict[str, Any], Any]:
    manifests = work / "manifests"
    ticks = []
    for i in range(2):
        tick = run([ATOLL, "control", "--scrape", f"http://127.0.0.1:{port}", "--scenario", "core",
                    "--policy", "threshold", "--state", str(work / "state"), "--sink", f"k8s:{manifests}",
                    "--kube-version", version, "--interval", "5m", "--time-scale", "60", "--once", "--json"])
        ticks.append({"tick": i + 1, "plan_changed": tick.get("plan_changed"),
                      "sink": (tick.get("sink_result") or {}).get("message"), "seconds": tick["_seconds"]})
        if i == 0:
            time.sleep(6)  # 5 trace-minutes at 60x: the counters move
    docs = [yaml.safe_load(p.read_text()) for p in sorted(manifests.glob("atoll-*.yaml"))]
    return {"ticks": ticks, **summarize(docs, version)}, docs


def extended_plan(version: str) -> dict[str, Any]:
    from atoll.solvers.allocation import solve_allocation
    from atoll.solvers.scenarios import build_problem

    t = time.perf_counter()
    # the published plan is on whole nodes
    problem = build_problem("extended", "ample", "even", runtime="vllm", slices=False)
    result = solve_allocation(problem)
    assert result.allocation is not None, "extended under runtime vllm has no plan"
    library = {k: problem.template(k) for k, _ in result.allocation.counts}
    record = PlanRecord.from_allocation(1, 0.0, result.allocation, None, library, {}, "extended",
                                        owner="extended-000000")
    solve_s = time.perf_counter() - t
    t = time.perf_counter()
    docs = render_manifests(record, K8sOptions(pd="disaggregated", kube_version=version))
    render_s = time.perf_counter() - t
    out = summarize(docs, version)
    out.update({"templates": len(record.plan), "instances": sum(record.plan.values()),
                "solve_s": round(solve_s, 2), "render_s": round(render_s, 3)})
    return out


def scrape_metrics(work: Path, port: int, version: str) -> dict[str, Any]:
    metrics_port = free_port()
    cmd = [ATOLL, "control", "--scrape", f"http://127.0.0.1:{port}", "--scenario", "core", "--policy",
           "threshold", "--state", str(work / "state-metrics"), "--sink", f"metrics:127.0.0.1:{metrics_port}",
           "--interval", "5m", "--time-scale", "60", "--ticks", "4", "--json"]
    log("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{metrics_port}"
    try:
        wait_http(f"{url}/metrics", 120)
        end, text, before = time.monotonic() + 120, "", 0
        while time.monotonic() < end:  # until the controller's first plan is exported
            t = time.perf_counter()
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
                text, ctype, status = r.read().decode(), r.headers["Content-Type"], r.status
            scrape_ms = (time.perf_counter() - t) * 1000
            if read_desired(text).sequence is not None:
                break
            before += 1
            time.sleep(0.5)
        with urllib.request.urlopen(f"{url}/scaledobjects.yaml", timeout=5) as r:
            scaled = list(yaml.safe_load_all(r.read().decode()))
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    # one JSON document per tick, then the summary (JSON lines), or one document with both
    docs = [json.loads(line) for line in out.splitlines() if line.strip()]
    final = docs[-1] if len(docs) == 1 else {
        "summary": docs[-1].get("summary"), "last": next((d for d in reversed(docs) if "tick" in d), None)}
    desired, sequence, labels = read_desired(text)
    nonzero = {k: v for k, v in desired.items() if v}
    queries = {o["spec"]["triggers"][0]["metadata"]["query"] for o in scaled}
    workloads = {lb["workload"] for k, lb in labels.items() if desired[k]}
    return {"status": status, "content_type": ctype, "scrape_ms": round(scrape_ms, 2),
            "scrapes_before_the_first_plan": before,
            "plan_sequence": sequence, "templates_desired": len(nonzero),
            "replicas_desired": sum(nonzero.values()), "label_names": sorted(next(iter(labels.values()), {})),
            "example": next(iter(sorted(labels.items())), (None, None))[1],
            "scaled_objects": len(scaled),
            "scaled_objects_valid_keda_2_20_crd": sum(1 for o in scaled if not api_problems(o, version)),
            "every_scaled_object_reads_a_desired_series": queries == {
                f'max(atoll_desired_replicas{{workload="{w}"}})' for w in workloads},
            "controller_ticks": (final.get("summary") or {}).get("ticks"),
            "controller_last_tick_plan_sequence": (final.get("last") or {}).get("plan_sequence")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kube-version", default="1.33")
    args = ap.parse_args()
    version = kube_version(args.kube_version)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="atoll-deploy-") as tmp:
        work = Path(tmp)
        replay = subprocess.Popen([ATOLL, "replay", "--workload", WORKLOADS, "--models", MODELS,
                                   "--speedup", "60", "--start-day", "11", "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            wait_http(f"http://127.0.0.1:{port}/metrics", 180)
            readme, _ = readme_example(work, port, version)
            scrape = scrape_metrics(work, port, version)
        finally:
            replay.send_signal(signal.SIGTERM)
            replay.wait(timeout=60)
    log("extended plan (runtime vllm, disaggregated)")
    extended = extended_plan(version)
    print(json.dumps({"kube_version": version, "vllm": {"version": VLLM_VERSION, "image": VLLM_IMAGE,
                                                        "table_flags": sorted(VLLM_SERVE_FLAGS),
                                                        "table_env": sorted(VLLM_ENV)},
                      "readme": readme, "extended": extended, "scrape": scrape}, indent=1))


if __name__ == "__main__":
    main()
