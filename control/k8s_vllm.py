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
})
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
