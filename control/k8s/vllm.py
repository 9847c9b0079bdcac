"""What the pinned vLLM release accepts: the flags, environment variables and KV-transfer
settings atoll renders, each with the place in vLLM's own source it was read from.

Read from vLLM 0.33.0 (the newest release on PyPI on 2026-11-25), the source files of its wheel
``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl`` (``vllm/_version.py``: version 0.33.0,
commit ``g4ba787ec9``); paths and line numbers below are inside that wheel. The serving image
is the release's ``vllm/vllm-openai:v0.33.0``. The renderer checks every command it emits
against this table (:func:`unknown_serve_args`), so a flag that the pinned version does not
know is a render error, not a pod in CrashLoopBackOff; ``tests/control/test_k8s_runtime.py``
holds every rendered flag and variable to it.

A user's own ``image`` (another vLLM version) gets the same flags: the table then describes
what atoll renders, not what that image accepts (the README says so).

The prefill/decode router a disaggregated model gets by default is the vLLM project's
``vllm-router`` (PyPI, a Rust core; :data:`VLLM_ROUTER_VERSION`), pinned here beside vLLM: its
flags atoll renders are :data:`VLLM_ROUTER_FLAGS`, read from that release's ``vllm-router
--help``; ``tests/control/test_vllm_router.py`` holds the table to the installed package's
``--help`` and runs the binary with the rendered arguments.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from types import MappingProxyType

VLLM_VERSION = "0.33.0"
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
VLLM_SOURCE = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (PyPI), vllm/_version.py commit g4ba787ec9"

# ``vllm serve`` options atoll renders -> where the pinned version defines them. Engine options
# come from EngineArgs.add_cli_args; --host/--port are fields of the OpenAI frontend's
# FrontendArgs dataclass, turned into flags by get_kwargs (vllm/engine/arg_utils.py).
VLLM_SERVE_FLAGS: Mapping[str, str] = MappingProxyType({
    "--served-model-name": "vllm/engine/arg_utils.py:1031",
    "--tensor-parallel-size": "vllm/engine/arg_utils.py:1209",
    "--pipeline-parallel-size": "vllm/engine/arg_utils.py:1171",
    "--distributed-executor-backend": "vllm/engine/arg_utils.py:1167",
    "--kv-transfer-config": "vllm/engine/arg_utils.py:1881",
    "--host": "vllm/entrypoints/common/cli_args.py:293 (FrontendArgs.host)",
    "--port": "vllm/entrypoints/common/cli_args.py:295 (FrontendArgs.port)",
})
# Values the pinned version accepts for the options whose values are a closed set.
VLLM_FLAG_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    # vllm/config/parallel.py:38 DistributedExecutorBackend
    "--distributed-executor-backend": ("ray", "mp", "uni", "external_launcher"),
})
# Environment variables atoll sets that vLLM reads (vllm/envs.py).
VLLM_ENV: Mapping[str, str] = MappingProxyType({
    "VLLM_PP_LAYER_PARTITION": "vllm/envs.py:893",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "vllm/envs.py:1721",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "vllm/envs.py:1725",
    # the server's API key when --api-key is not given; read from vLLM's repository
    # (vllm/envs.py, consumed by vllm/entrypoints/openai/api_server.py), not from the 0.33.0 wheel
    "VLLM_API_KEY": "vllm/envs.py (VLLM_API_KEY)",
})
VLLM_API_KEY_ENV = "VLLM_API_KEY"
# Variables atoll sets that are not vLLM's own: the Hugging Face hub's token (read by
# huggingface_hub inside vLLM), and the LeaderWorkerSet controller's (set on every LWS pod).
OTHER_ENV: Mapping[str, str] = MappingProxyType({
    "HF_TOKEN": "huggingface_hub (the token vLLM's model download uses)",
    "LWS_GROUP_SIZE": "LeaderWorkerSet: pods per group",
    "LWS_LEADER_ADDRESS": "LeaderWorkerSet: the leader pod's DNS name",
})
# --kv-transfer-config: the connector registered under this name and the roles it takes.
# vllm/distributed/kv_transfer/kv_connector/factory.py:178 registers "NixlConnector" (an alias
# of NixlPullConnector); vllm/config/kv_transfer.py:11-13 defines the roles. 0.33.0 deprecates
# kv_both for NIXL (v1/nixl/connector.py:97: "set kv_role='kv_producer' for prefill instances
# and kv_role='kv_consumer' for decode instances"), and refuses kv_consumer with
# pipeline_parallel_size > 1 (v1/nixl/base_worker.py:886: decode-side PP unsupported).
KV_CONNECTORS: tuple[str, ...] = ("NixlConnector",)
KV_ROLES: tuple[str, ...] = ("kv_producer", "kv_consumer", "kv_both")
KV_CONFIG_KEYS: tuple[str, ...] = ("kv_connector", "kv_role")  # fields of KVTransferConfig
# The NIXL side channel: VLLM_NIXL_SIDE_CHANNEL_PORT's default (vllm/envs.py:233), plus the
# engine's data-parallel index (v1/nixl/base_scheduler.py:77); atoll runs one engine per pod.
NIXL_SIDE_CHANNEL_PORT = 5600
# The serving image's helper that starts or joins the Ray cluster of a multi-node engine
# (examples/online_serving/multi-node-serving.sh in vLLM's repository, copied into the image):
# ``leader --ray_cluster_size=N`` and ``worker --ray_address=HOST``.
MULTI_NODE_SCRIPT = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"
MULTI_NODE_ARGS: tuple[str, ...] = ("--ray_cluster_size", "--ray_address", "--ray_port", "--ray_init_timeout")
# The server's health route (vllm/entrypoints/serve/instrumentator/health.py:22).
HEALTH_PATH = "/health"

# ----- vllm-router ---------------------------------------------------------------------------
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_SOURCE = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl (PyPI), vllm-router --help"
# The image control/data/vllm-router.Dockerfile builds (pip install vllm-router==VERSION); the
# vLLM project publishes the router on PyPI, not as an image, so push this one to a registry
# your cluster pulls from and name it in kubernetes.router_image.
VLLM_ROUTER_IMAGE = f"atoll/vllm-router:{VLLM_ROUTER_VERSION}"
# The routes the router serves (0.1.17): readiness is 200 once a prefill and a decode worker are
# healthy; liveness is the process itself.
VLLM_ROUTER_READINESS = "/readiness"
VLLM_ROUTER_LIVENESS = "/liveness"
VLLM_ROUTER_METRICS_PORT = 29000  # --prometheus-port's default in 0.1.17
# In P/D mode 0.1.17 sends "Authorization: Bearer $OPENAI_API_KEY" on both hops (the client's own
# header is not forwarded, and --api-key does not reach these hops: found by running it, see
# tests/control/test_vllm_router.py), so the servers' key goes into this variable.
VLLM_ROUTER_API_KEY_ENV = "OPENAI_API_KEY"
# ``vllm-router`` options atoll renders -> what 0.1.17's --help says of them.
VLLM_ROUTER_FLAGS: Mapping[str, str] = MappingProxyType({
    "--host": "Host address to bind the router server",
    "--port": "Port number to bind the router server",
    "--vllm-pd-disaggregation": "Enable vLLM PD (Prefill-Decode) disaggregated mode",
    "--kv-connector": "KV connector type for PD disaggregation ('nixl': NIXL's pull-based transfer)",
    "--service-discovery": "Enable Kubernetes service discovery",
    "--service-discovery-namespace": "Kubernetes namespace to watch for pods",
    "--service-discovery-port": "Port to use for discovered worker pods",
    "--prefill-selector": "Label selector for prefill server pods in PD mode (key1=value1 key2=value2)",
    "--decode-selector": "Label selector for decode server pods in PD mode (key1=value1 key2=value2)",
    "--prefill-policy": "Specific policy for prefill nodes in PD mode",
    "--decode-policy": "Specific policy for decode nodes in PD mode",
    "--health-check-interval-secs": "Interval in seconds between runtime health checks",
    "--health-failure-threshold": "Consecutive health check failures before marking a worker unhealthy",
    "--request-timeout-secs": "Request timeout in seconds",
    "--prometheus-host": "Host address to bind the Prometheus metrics server",
    "--prometheus-port": "Port to expose Prometheus metrics",
    "--api-key": "The API key used for authorization with workers",
    "--max-payload-size": "Maximum payload size in bytes (a larger request body is answered 413)",
    # static workers, in place of discovery (the tests run the binary so)
    "--prefill": "Prefill server URL and optional bootstrap port",
    "--decode": "Decode server URL",
})
# Options that take no value.
VLLM_ROUTER_SWITCHES: tuple[str, ...] = ("--vllm-pd-disaggregation", "--service-discovery")
# Options that take several values (argparse nargs='+').
VLLM_ROUTER_LISTS: tuple[str, ...] = ("--prefill-selector", "--decode-selector", "--prefill")
VLLM_ROUTER_POLICIES: tuple[str, ...] = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two",
                                         "consistent_hash", "sticky_least_loaded")
VLLM_ROUTER_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "--prefill-policy": VLLM_ROUTER_POLICIES, "--decode-policy": VLLM_ROUTER_POLICIES,
    "--kv-connector": ("nixl", "mooncake", "moriio"),
})


def kv_transfer_config(role: str) -> str:
    """The ``--kv-transfer-config`` value for a NIXL engine of ``role`` (compact JSON)."""
    if role not in KV_ROLES:
        raise ValueError(f"kv_transfer_config: field 'role' must be one of {', '.join(KV_ROLES)}, "
                         f"got {role!r}")
    return json.dumps({"kv_connector": KV_CONNECTORS[0], "kv_role": role}, separators=(",", ":"))


def unknown_serve_args(command: str) -> list[str]:
    """Problems of a ``vllm serve`` command line against the pinned version: options it does
    not define, values outside an option's choices, a --kv-transfer-config it would refuse.
    Empty when the command is one vLLM 0.33.0 accepts (as far as this table reaches)."""
    args = shlex.split(command)
    if args[:2] != ["vllm", "serve"] or len(args) < 3 or args[2].startswith("-"):
        return [f"not 'vllm serve <model> ...': {command[:80]!r}"]
    out: list[str] = []
    i = 3
    while i < len(args):
        flag = args[i]
        if flag not in VLLM_SERVE_FLAGS:
            out.append(f"{flag}: not an option of vllm {VLLM_VERSION} serve (atoll's table: "
                       f"{', '.join(VLLM_SERVE_FLAGS)})")
            i += 1
            continue
        if i + 1 >= len(args):
            out.append(f"{flag}: has no value")
            break
        value = args[i + 1]
        choices = VLLM_FLAG_CHOICES.get(flag)
        if choices and value not in choices:
            out.append(f"{flag} {value}: vllm {VLLM_VERSION} accepts {', '.join(choices)}")
        if flag == "--kv-transfer-config":
            out.extend(_kv_problems(value))
        i += 2
    return out


def _kv_problems(value: str) -> list[str]:
    try:
        doc = json.loads(value)
    except ValueError:
        return [f"--kv-transfer-config {value!r}: not JSON"]
    if not isinstance(doc, dict):
        return [f"--kv-transfer-config {value!r}: not a JSON object"]
    out = [f"--kv-transfer-config: field {k!r} is not one atoll's table knows" for k in doc
           if k not in KV_CONFIG_KEYS]
    if doc.get("kv_connector") not in KV_CONNECTORS:
        out.append(f"--kv-transfer-config: kv_connector {doc.get('kv_connector')!r} is not one of "
                   f"{', '.join(KV_CONNECTORS)}")
    if doc.get("kv_role") not in KV_ROLES:
        out.append(f"--kv-transfer-config: kv_role {doc.get('kv_role')!r} is not one of "
                   f"{', '.join(KV_ROLES)}")
    return out


def known_env(name: str) -> bool:
    """Whether ``name`` is a variable of the pinned vLLM or one of the others atoll sets."""
    return name in VLLM_ENV or name in OTHER_ENV


def unknown_router_args(args: list[str]) -> list[str]:
    """Problems of a ``vllm-router`` argument list (without the program) against the pinned
    version: options it does not define, values outside an option's choices, a missing value.
    Empty when vllm-router 0.1.17 accepts it (as far as this table reaches)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        if flag not in VLLM_ROUTER_FLAGS:
            out.append(f"{flag}: not an option of vllm-router {VLLM_ROUTER_VERSION} (atoll's table: "
                       f"{', '.join(VLLM_ROUTER_FLAGS)})")
            i += 1
            continue
        if flag in VLLM_ROUTER_SWITCHES:
            i += 1
            continue
        values = []
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        if not values or (len(values) > 1 and flag not in VLLM_ROUTER_LISTS):
            out.append(f"{flag}: takes {'one or more values' if flag in VLLM_ROUTER_LISTS else 'one value'}, "
                       f"got {values}")
        choices = VLLM_ROUTER_CHOICES.get(flag)
        if choices and any(v not in choices for v in values):
            out.append(f"{flag} {' '.join(values)}: vllm-router {VLLM_ROUTER_VERSION} accepts "
                       f"{', '.join(choices)}")
    return out
